"""The core failure modes over the transport operators use (issue 39 §6): each caused through `sparkfleet up` or
`down` on the SSH lab (a real sshd per node, host keys checked strictly), with what it leaves running judged on the
nodes themselves.

THE LAB IS A SIMULATION (sparkfleet/sim, ssh mode; as root a network namespace and a dockerd per node): the faults
change what a node reports or how its engine boots; the runner, the SSH transport, the checks, the gates and the
docker calls are the real code. One lab for the module, healed and dcp2 down after each case. Uses the sim's fixed
ports: run under the lab lock (`flock /tmp/sparkfleet-lab.lock ...`).
"""

from __future__ import annotations

import signal
import time
from datetime import datetime

import pytest

from tests.cli_run import (
    LAB_NODES,
    findings,
    heal_and_down,
    lane_containers,
    lane_states,
    record_of,
    result,
    run,
    step,
    steps,
    up_acting_once,
    why_up_failed,
)
from tests.test_failure_modes_lab import NO_EARLYOOM, refused_at_check

LANE = ["--profile", "dcp2", "--inventory", "sim"]
POLL_S = 0.2
FAST = ["--gates", "models", "--poll", str(POLL_S), "--no-probe", "--no-fabric-probe"]
WORKERS = ("asusi", "bluey", "spark4")


@pytest.fixture(autouse=True)
def clean(ssh_sim, capsys):
    """Each case starts from a healed lab with no dcp2 rank."""
    yield
    heal_and_down(ssh_sim, capsys)


def up(capsys, *extra: str) -> tuple[int, list[dict]]:
    return run(capsys, "up", *LANE, *FAST, *extra)


def served(sim, capsys) -> list[dict]:
    code, events = up(capsys)
    assert code == 0, why_up_failed(sim, events, "dcp2")
    return events


def lane_runs(sim) -> dict[str, list[tuple[str, str]]]:
    """Each node's dcp2 containers as (run id, state)."""
    return {n: [(c["Config"]["Labels"]["sparkfleet.run"], c["State"]["Status"]) for c in cs]
            for n, cs in lane_containers(sim, "dcp2").items()}


def lane_already_up(sim, capsys) -> None:
    """A second `up` of a lane that serves removes every old container first (stop-all), then only its own run."""
    old = result(served(sim, capsys))["run_id"]
    assert lane_runs(sim) == {n: [(old, "running")] for n in LAB_NODES}
    events = served(sim, capsys)
    assert list(steps(events))[0] == "stop"
    assert step(events, "stop")["summary"] == "removed 4 container(s) on spark4, bluey, asusi, reddie"
    assert lane_runs(sim) == {n: [(result(events)["run_id"], "running")] for n in LAB_NODES}


def failed_check(sim, capsys) -> None:
    """asusi runs no earlyoom: `up` stops at its check step naming asusi, and launches nothing."""
    sim.fault("asusi", "earlyoom-off")
    failed = refused_at_check(sim, capsys, "dcp2", "--no-fabric-probe")  # cheap should the check let it by
    assert [(f["node"], f["check"], f["status"], f["message"]) for f in failed] == [
        ("asusi", "earlyoom", "fail", NO_EARLYOOM)]


def _finished(container: dict) -> float:
    """When a container's process ended, from docker's State.FinishedAt (nanoseconds cut to micro)."""
    at = container["State"]["FinishedAt"].rstrip("Z")
    head, _, frac = at.partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()


def dying_rank(sim, capsys) -> None:
    """Rank 2 dies loading its weights on bluey: `up` fails naming the rank, its fatal line and the node at the
    first poll after the death (or the one running across it), and stops every rank. The boot budget is cut to
    30 s, so a fast-fail that broke fails here in seconds, not at dcp2's own budget."""
    sim.fault("bluey", "worker-crash")
    code, events = up(capsys, "--boot-budget", "30")
    assert code == 1, result(events)
    reason = result(events)["reason"]
    assert reason.startswith("wait_ready: rank 2 logged a fatal line: ERROR "), reason
    assert "[multiproc_executor.py:824] WorkerProc hit an exception. ... OSError: " in reason
    assert reason.endswith("(on bluey); every rank of this launch was stopped")
    watch = record_of(events)["data"]["wait_ready"]
    assert (watch["failed_rank"], watch["failed_node"]) == (2, "bluey")
    [rank2] = lane_containers(sim, "dcp2")["bluey"]
    died = _finished(rank2)
    assert len([t for t in watch["poll_started"] if t > died]) <= 1, (died, watch)
    assert watch["detected_at"] - died < 3 * POLL_S + 1, (died, watch)  # a poll, and one round of SSH reads
    assert lane_states(sim) == {n: ["exited"] for n in LAB_NODES}


def failed_gate(sim, capsys) -> None:
    """The head never answers a needle question: `up`'s gates step fails and every rank it started is stopped."""
    sim.fault("reddie", "needle-blind")
    code, events = run(capsys, "up", *LANE, *FAST, "--gates", "models,needle")
    assert code == 1, result(events)
    assert steps(events)["gates"] == "fail"
    gates = record_of(events)["data"]["gates"]
    assert {g["name"]: g["status"] for g in gates["results"]} == {"models": "pass", "needle": "fail"}
    [needle] = [g for g in gates["results"] if g["name"] == "needle"]
    assert needle["summary"].startswith("1 of 1 check(s) failed: 32,768 tokens (32,768 tokens: the answer lacks "
                                        "the needle ")  # its nonce is drawn per run
    assert [(f["node"], f["check"], f["message"]) for f in findings(events, "gates")] == [
        ("reddie", "gate needle", needle["summary"])]
    assert "left_running" not in gates
    res = result(events)
    assert (res["outcome"], res["reason"]) == (
        "failed", "gates: 1 passed, 1 failed, 0 skipped (needle); every rank of this launch was stopped")
    assert lane_states(sim) == {n: ["exited"] for n in LAB_NODES}


SLOW_S = 2  # spark4's docker answers this late: its `docker run` is still in flight when Ctrl-C comes
# `docker stop`'s default grace: a rank stopped in its first moment has no SIGTERM handler yet (pid 1 ignores
# the signal then), so spark4's, started by the command in flight, is killed at the end of it
DOCKER_STOP_GRACE_S = 10


def ctrl_c_during_launch(sim, capsys) -> None:
    """Ctrl-C while the workers' wave is starting, spark4's `docker run` in flight: `up` exits 130 once that
    command has returned and leaves no rank running: the wave's ranks are stopped, the head never started."""
    def press(proc) -> None:
        # spark4's docker slowed after the facts step (which has many docker commands), before the launch
        sim.fault("spark4", "daemon-slow", seconds=SLOW_S)
        deadline = time.monotonic() + 30  # check to launch: the engram step's reads, no docker on spark4
        while not lane_containers(sim, "dcp2", ("asusi",))["asusi"]:  # the wave is sent
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        # the command in flight keeps its wait; the cleanup's own docker commands answer at once
        sim.heal("spark4", "daemon-slow")

    code, events, pressed = up_acting_once([*LANE, *FAST], act=press, timeout_s=30,
                                           when=lambda e: e["event"] == "step" and e["step"] == "check"
                                           and e["status"] != "start")
    assert pressed is not None and code == 130, events[-3:]
    took = time.time() - pressed
    rec = record_of(events)
    assert (rec["outcome"], rec["data"]["interrupted_by"]) == ("interrupted", "SIGINT")
    assert rec["reason"] == "interrupted by the user; every rank of this launch was stopped"
    assert "launch:workers" not in [s["step"] for s in rec["steps"]]  # it landed in the wave
    assert lane_runs(sim) == {"reddie": [], **{n: [(rec["run_id"], "exited")] for n in WORKERS}}
    assert took < SLOW_S + DOCKER_STOP_GRACE_S + 10, took  # not the cleanup's long bounds (330 s, 120 s)


def dead_node_during_down(sim, capsys) -> None:
    """bluey's sshd is gone while dcp2 serves (its connections refused, at once; a node that only times out is
    tests/test_sick_fleet_blackhole.py's, at one connect timeout): `down` stops the three ranks it reaches and fails
    naming bluey and the rank that may still run there; once bluey answers, `down --limit bluey` removes it."""
    served(sim, capsys)
    sim.fault("bluey", "unreachable")
    code, events = run(capsys, "down", *LANE)
    assert code == 1, result(events)
    assert lane_states(sim) == {"reddie": [], "asusi": [], "bluey": ["running"], "spark4": []}
    stop = step(events, "stop")
    assert (stop["status"], stop["summary"]) == (
        "fail", "removed 3 container(s) on reddie, asusi, spark4; bluey (reach) did not answer: rank 2 may still "
        "be running there; once it answers, run `sparkfleet down --profile dcp2 --limit bluey`")
    addr = sim.inventory().nodes["bluey"].ssh
    assert [(f["node"], f["check"], f["message"]) for f in findings(events, "stop")] == [
        ("bluey", "reach", f"bluey: connection refused by {addr.user}@{addr.host}:{addr.port}; is sshd running on "
         "the node?")]
    sim.heal("bluey")
    code, events = run(capsys, "down", *LANE, "--limit", "bluey")
    assert code == 0, result(events)
    assert step(events, "stop")["summary"] == "removed 1 container(s) on bluey"
    assert lane_states(sim) == {n: [] for n in LAB_NODES}


CASES = {"lane-already-up": lane_already_up, "failed-check": failed_check, "dying-rank": dying_rank,
         "failed-gate": failed_gate, "ctrl-c-during-launch": ctrl_c_during_launch,
         "dead-node-during-down": dead_node_during_down}


@pytest.mark.parametrize("case", CASES)
def test_a_core_failure_mode_over_ssh(ssh_sim, capsys, case: str) -> None:
    """Each case causes its failure through the CLI, then judges what is left (its docstring says what)."""
    CASES[case](ssh_sim, capsys)
