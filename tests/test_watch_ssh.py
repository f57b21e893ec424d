"""`sparkfleet watch` over real SSH: the simulated lab's nodes behind OpenSSH sshd, host keys checked strictly.

A hung head (it stops answering: requests and /health hang) is detected after K failed probes and the
lane serves again. Until the sim has its own rank-hang fault, the hang is made by stopping the head's
engine process group (SIGSTOP) through the head node itself. THE LAB IS A SIMULATION.
"""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from sparkfleet.cli.main import main
from sparkfleet.fleet.connect import transport_for
from sparkfleet.sim import faults as sim_faults
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


def hang_head(sim) -> None:
    """The sim's rank-hang fault when it exists; else SIGSTOP of the head's engine, run on the head node."""
    if "rank-hang" in sim_faults.KINDS:
        sim.fault("reddie", "rank-hang")
        return
    docker = json.loads((sim.state_dir("reddie") / "docker.json").read_text())
    (c,) = [c for c in docker["containers"] if c["Config"]["Labels"].get("sparkfleet.rank") == "0"
            and c["State"]["Running"]]
    node = sim.inventory().nodes["reddie"]
    for _ in range(3):  # a loaded machine can miss one SSH handshake; the kill itself must succeed
        t = transport_for([node])
        try:
            r = t.run([node], f"kill -STOP -- -{int(c['SimProcess']['pid'])}")["reddie"]
        finally:
            t.close()
        if r.ok or r.error != "unreachable":
            break
    assert r.ok, r.message or r.stderr


def test_a_hung_head_is_detected_after_k_probes_and_the_lane_serves_again_over_ssh(ssh_sim, capsys) -> None:
    inv = ssh_sim.inventory()
    assert {n.transport for n in inv.nodes.values()} == {"ssh"}
    assert main(["up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models", "--poll", "0.2", "--json"]) == 0
    capsys.readouterr()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    w = WatchProc(["--profile", "dcp2", "--inventory", "sim", *FAST, "--failures", "2"], env)
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        hang_head(ssh_sim)
        failure = w.event("watch.failure")
        served = w.event("watch.serving")
        w.signal(signal.SIGTERM)
        assert w.wait() == 0
    finally:
        w.stop()
    assert failure["reason"] == "probe-failed"
    assert failure["why"].startswith("2 failed probe(s) in a row (--failures 2): ")
    probes = [e for e in w.events if e["event"] == "watch.probe"]
    last_ok = max(i for i, p in enumerate(probes) if p["ok"] and p["t"] < failure["t"])
    assert [p["ok"] for p in probes[last_ok + 1:last_ok + 3]] == [False, False]  # exactly K failed, then acted
    assert all(r["state"] == "running" for p in probes[last_ok + 1:last_ok + 3] for r in p["ranks"])
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
