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
                 "--probe-seconds", "1", "--json"])
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


def test_a_loopback_bound_head_is_reached_through_an_ssh_tunnel(tmp_path, monkeypatch, capsys) -> None:
    """A lane with `host: 127.0.0.1` (as tf1017 binds its API): readiness, gates and status go through a
    local port forward over the head's SSH connection, which closes with the command."""
    if SSHD is None:
        pytest.skip("sshd is not installed")
    from tests.conftest import REPO

    ops = tmp_path / "ops"
    for d in ("inventories", "profiles", "templates", "playbooks", "patches"):
        shutil.copytree(REPO / d, ops / d)
    (ops / "profiles/dcp2-lo.yaml").write_text("extends: dcp2\nhost: 127.0.0.1\n")
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    lab.up("lab", transport="ssh", ops_root=str(ops))
    try:
        code = main(["up", "--profile", "dcp2-lo", "--inventory", "sim", "--root", str(ops), "--gates", "models",
                     "--poll", "0.2", "--no-probe", "--json"])
        events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
        result = next(e for e in events if e["event"] == "result")
        assert code == 0, result
        said = [e["text"] for e in events if e["event"] == "message" and "SSH tunnel" in e.get("text", "")]
        assert len(said) == 1 and said[0].startswith("reddie serves on 127.0.0.1:8410 only: reaching it through an "
                                                     "SSH tunnel at http://127.0.0.1:")
        tunnel = said[0].rsplit(" ", 1)[1]
        assert not tunnel.endswith(":8410")
        ready = next(e for e in events if e["event"] == "step" and e["step"] == "wait_ready" and e["status"] == "ok")
        assert ready["summary"].startswith(f"serving at {tunnel} ")
        record = json.loads((tmp_path / "state/runs" / f"{result['run_id']}.json").read_text())
        assert record["data"]["gates"]["endpoint"] == tunnel
        assert main(["status", "--inventory", "sim", "--root", str(ops), "--json"]) == 0
        lane = json.loads(capsys.readouterr().out)["lanes"]["dcp2-lo"]
        assert lane["health"] == 200 and lane["endpoint"] == "reddie:127.0.0.1:8410 (SSH tunnel)"
        assert main(["down", "--profile", "dcp2-lo", "--inventory", "sim", "--root", str(ops), "--json"]) == 0
    finally:
        lab.down()
