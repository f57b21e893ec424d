"""`up` and `down` once over real SSH: the simulated lab's nodes behind OpenSSH sshd on loopback, with
host keys checked strictly (SIMULATION: the sim engine stands in for vLLM)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from sparkfleet.cli.main import main
from sparkfleet.sim import lab

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


@pytest.fixture
def ssh_sim(tmp_path, monkeypatch):
    if SSHD is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs openssh-server (sshd) for the real-SSH lifecycle test; .ci/run installs it")
        pytest.skip("sshd is not installed")
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    s = lab.up("lab", transport="ssh")
    try:
        yield s
    finally:
        lab.down()


def test_up_and_down_over_ssh(ssh_sim, capsys) -> None:
    inv = ssh_sim.inventory()
    assert {n.transport for n in inv.nodes.values()} == {"ssh"}
    code = main(["up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models,count100", "--poll", "0.2",
                 "--json"])
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    result = next(e for e in events if e["event"] == "result")
    assert code == 0, result
    assert main(["status", "--inventory", "sim", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert sorted((c["node"], c["rank"], c["state"]) for c in status["containers"]) == [
        ("asusi", 1, "running"), ("bluey", 2, "running"), ("reddie", 0, "running"), ("spark4", 3, "running")]
    assert status["lanes"]["dcp2"]["health"] == 200
    assert main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"]) == 0
    capsys.readouterr()
    assert main(["status", "--inventory", "sim", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["containers"] == []
