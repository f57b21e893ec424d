"""One node that only times out (a blackhole: `sim fault NODE blackhole`, every packet on its management link
dropped) through the real CLI over real SSH: `down` stops the ranks it can reach, then fails naming the node
after one SSH connect timeout, not one per step.

THE LAB IS A SIMULATION (sparkfleet/sim, ssh mode as root: a network namespace and an OpenSSH sshd per
node). Uses the sim's fixed ports and names: run under the lab lock (`flock /tmp/sparkfleet-lab.lock ...`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sparkfleet.sim import netlab
from tests.cli_run import LAB_NODES, findings, lane_states, result, step
from tests.conftest import REPO, sim_lab, ssh_lab_needed

LANE = ["--profile", "dcp2", "--inventory", "sim"]
FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe"]
CONNECT_TIMEOUT_S = 10  # fleet/connect.py transport_for: the SSH connect timeout every command uses


@pytest.fixture(scope="module")
def ssh_sim(tmp_path_factory):
    ssh_lab_needed(root=True)  # the blackhole is a rule in a node's own network namespace
    yield from sim_lab(tmp_path_factory, transport="ssh")


def sf(*argv: str, timeout_s: float) -> tuple[int, list[dict]]:
    """The CLI as a user runs it (its own process, so a hang is cut at `timeout_s`)."""
    p = subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *argv, "--json"], cwd=REPO, text=True,
                       capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=timeout_s)
    return p.returncode, [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]


def drops(node: str) -> list[str]:
    """The node's iptables rules that drop (in its own namespace)."""
    out = subprocess.run([*netlab.exec_argv(node), "iptables", "-w", "-S"], capture_output=True, text=True,
                         check=True).stdout
    return [x for x in out.splitlines() if "DROP" in x and not x.startswith("-P")]


def test_down_with_a_blackholed_node_stops_the_others_and_names_it_after_one_connect_timeout(ssh_sim) -> None:
    code, events = sf("up", *LANE, *FAST, timeout_s=300)
    assert code == 0, result(events)
    ssh_sim.fault("bluey", "blackhole")
    try:
        assert drops("bluey") == ["-A INPUT -i mgmt0 -j DROP", "-A OUTPUT -o mgmt0 -j DROP"]
        # the guard: the lock step waits one connect timeout for bluey, every later step none; the stop step
        # itself is bounded by its own 60 s list and 120 s stop commands (stop.py)
        code, events = sf("down", *LANE, timeout_s=CONNECT_TIMEOUT_S + 60 + 120)
        assert code == 1
        after = lane_states(ssh_sim)
        assert {n: after[n] for n in ("reddie", "asusi", "spark4")} == {"reddie": [], "asusi": [], "spark4": []}
        assert after["bluey"] == ["running"]  # what could not be reached is still there
        stop = step(events, "stop")
        assert stop["summary"] == ("removed 3 container(s) on reddie, asusi, spark4; bluey (reach) did not answer: "
                                   "rank 2 may still be running there; once it answers, run `sparkfleet down "
                                   "--profile dcp2 --limit bluey`")
        (f,) = findings(events, "stop")
        addr = ssh_sim.inventory().nodes["bluey"].ssh
        # a timeout, not a refusal; and the stop step did not wait for it again after the lock step had
        assert f["message"] == (f"bluey: no answer from {addr.user}@{addr.host}:{addr.port} within "
                                f"{CONNECT_TIMEOUT_S}s (node down, link down or firewalled); check the node and "
                                "its network (earlier in this run: not waited for again)")
    finally:
        ssh_sim.heal("bluey", "blackhole")
    assert drops("bluey") == []  # heal takes back exactly its rules
    code, events = sf("down", *LANE, "--limit", "bluey", timeout_s=120)
    assert code == 0, result(events)
    assert step(events, "stop")["summary"] == "removed 1 container(s) on bluey"
    assert lane_states(ssh_sim) == {n: [] for n in LAB_NODES}
