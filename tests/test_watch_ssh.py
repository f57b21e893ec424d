"""`sparkfleet watch` over real SSH: the simulated lab's nodes behind OpenSSH sshd, host keys checked strictly.

A worker's container removed on its node while the lane serves: watch restarts the whole group over
SSH and the lane serves again with one run on every node. THE LAB IS A SIMULATION.
"""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from sparkfleet.cli.main import main
from sparkfleet.fleet.connect import transport_for
from sparkfleet.sim import lab
from tests.conftest import REPO
from tests.watchproc import FAST, WatchProc

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


@pytest.fixture
def ssh_sim(tmp_path, monkeypatch):
    if SSHD is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs openssh-server (sshd) for the real-SSH watch test; .ci/run installs it")
        pytest.skip("sshd is not installed")
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    s = lab.up("lab", transport="ssh")
    try:
        yield s
    finally:
        lab.down()


def on_node(sim, node: str, command: str) -> None:
    n = sim.inventory().nodes[node]
    t = transport_for([n])
    try:
        r = t.run([n], command)[node]
    finally:
        t.close()
    assert r.ok, r.message or r.stderr


def test_a_worker_removed_is_restarted_with_the_group_over_ssh(ssh_sim, capsys) -> None:
    inv = ssh_sim.inventory()
    assert {n.transport for n in inv.nodes.values()} == {"ssh"}
    assert main(["up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models", "--poll", "0.2", "--json"]) == 0
    capsys.readouterr()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    w = WatchProc(["--profile", "dcp2", "--inventory", "sim", *FAST, "--failures", "2"], env)
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        on_node(ssh_sim, "bluey", "docker rm -f sf-dcp2-r2")  # through the node's own docker, over SSH
        failure = w.event("watch.failure")
        served = w.event("watch.serving")
        w.signal(signal.SIGTERM)
        assert w.wait() == 0
    finally:
        w.stop()
    assert failure["reason"] == "rank-vanished" and failure["why"] == "rank 2's container on bluey is gone"
    assert main(["status", "--inventory", "sim", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert sorted((c["node"], c["rank"], c["state"]) for c in status["containers"]) == [
        ("asusi", 1, "running"), ("bluey", 2, "running"), ("reddie", 0, "running"), ("spark4", 3, "running")]
    assert status["lanes"]["dcp2"]["health"] == 200
    docker = json.loads((ssh_sim.state_dir("reddie") / "docker.json").read_text())
    assert [c["Config"]["Labels"]["sparkfleet.run"] for c in docker["containers"]
            if c["Config"]["Labels"].get("sparkfleet.profile") == "dcp2"] == [served["run_id"]]
    assert main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"]) == 0
    capsys.readouterr()
