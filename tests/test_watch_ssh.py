"""`sparkfleet watch` over real SSH: the simulated lab's nodes behind OpenSSH sshd, host keys checked strictly.

1. A worker hangs while the lane serves (the sim's rank-hang fault: /health keeps answering 200, no token
is ever produced): watch sees K failed probes with every container running, restarts the whole group
over SSH, and the lane serves again with one run on every node.
2. tf1017 binds its API to the head's loopback (`host: 127.0.0.1`): watch probes it through the SSH local
forward (fleet/ssh.py), and after a worker vanishes the restarted lane answers through it again.
THE LAB IS A SIMULATION.
"""

from __future__ import annotations

import json
import os

from sparkfleet.cli.main import main
from tests import cli_run
from tests.conftest import REPO, tensorfold_built
from tests.watchproc import FAST, WatchProc


def test_a_hung_worker_is_detected_after_k_probes_and_the_lane_serves_again_over_ssh(ssh_sim, capsys) -> None:
    inv = ssh_sim.inventory()
    assert {n.transport for n in inv.nodes.values()} == {"ssh"}
    # the hung worker and the restart, not the links (test_fabric_sim's): a 2-core machine under load blurs the
    # probe's 48 KB round trips enough to fail a healthy veth now and then
    assert main(["up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models", "--poll", "0.2", "--no-probe",
                 "--no-fabric-probe", "--json"]) == 0
    capsys.readouterr()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    w = WatchProc(["--profile", "dcp2", "--inventory", "sim", *FAST, "--failures", "2", "--no-fabric-probe"], env)
    try:
        failure, served = w.restart_for(lambda: ssh_sim.fault("bluey", "rank-hang"))
        w.end()
    finally:
        w.stop()
    assert failure["reason"] == "probe-failed"
    assert failure["why"].startswith("2 failed probe(s) in a row (--failures 2): ")
    probes = [e for e in w.events if e["event"] == "watch.probe"]
    last_ok = max(i for i, p in enumerate(probes) if p["ok"] and p["t"] < failure["t"])
    hung = probes[last_ok + 1:last_ok + 3]
    assert [p["ok"] for p in hung] == [False, False]  # exactly K failed, then it acted
    assert [p["health"] for p in hung] == [200, 200]  # /health said all was well: the answer decided
    assert all(r["state"] == "running" for p in hung for r in p["ranks"])
    assert main(["status", "--inventory", "sim", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert sorted((c["node"], c["rank"], c["state"]) for c in status["containers"]) == [
        ("asusi", 1, "running"), ("bluey", 2, "running"), ("reddie", 0, "running"), ("spark4", 3, "running")]
    assert status["lanes"]["dcp2"]["health"] == 200
    assert [c["Config"]["Labels"]["sparkfleet.run"]
            for c in cli_run.lane_containers(ssh_sim, "dcp2", ("reddie",))["reddie"]] == [served["run_id"]]
    assert main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"]) == 0
    capsys.readouterr()


def test_a_loopback_bound_head_is_probed_through_the_ssh_tunnel_and_restarted(ssh_sim, capsys) -> None:
    tensorfold_built()
    capsys.readouterr()
    # the tunnel and the restart, not the links (test_fabric_sim's): see the first test
    up = ["up", "--profile", "tf1017", "--inventory", "sim", "--gates", "models", "--poll", "0.2", "--no-probe",
          "--no-fabric-probe", "--json"]
    assert main(up) == 0, capsys.readouterr().out[-2000:]
    capsys.readouterr()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    w = WatchProc(["--profile", "tf1017", "--inventory", "sim", *FAST, "--no-fabric-probe"], env)  # the tunnel, not the links
    try:
        tunnel = w.event("watch.tunnel")
        start = w.event("watch.start")
        failure, served = w.restart_for(lambda: ssh_sim.fault("asusi", "rank-vanish"))  # probed through the tunnel
        after = w.wait_for(lambda e: e["event"] == "watch.probe", "a probe after the restart")
        w.end()
    finally:
        w.stop()
        ssh_sim.heal()
    assert tunnel["text"].startswith("reddie serves on 127.0.0.1:8001 only: probing it through an SSH tunnel")
    assert tunnel["endpoint"].startswith("http://127.0.0.1:") and start["endpoint"] == tunnel["endpoint"]
    assert ssh_sim.inventory().nodes["reddie"].ssh.host != "127.0.0.1"  # the head is not this machine
    assert failure["reason"] == "rank-vanished" and failure["why"] == "rank 1's container on asusi is gone"
    assert after["ok"] and after["health"] == 200  # the new head answers through the same tunnel
    assert [c["Config"]["Labels"]["sparkfleet.run"]
            for c in cli_run.lane_containers(ssh_sim, "tf1017", ("reddie",))["reddie"]] == [served["run_id"]]
    assert main(["down", "--profile", "tf1017", "--inventory", "sim", "--json"]) == 0
    capsys.readouterr()
