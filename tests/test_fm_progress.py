"""FM-42: a silent boot is judged by progress (its processes' CPU use), not by log silence alone.

The lab tests run `sparkfleet up` on the simulated lab (THE LAB IS A SIMULATION: sparkfleet/sim). The sim
engine's `silent-tune` fault makes the head log nothing for a while after its weights, with one CPU kept busy
(a Station autotune); `boot-stall` makes it log nothing and use no CPU (a hung boot). The CPU time `up` reads
is the kernel's, from the node's /proc, of the engine's real process; the runner is the real code.
"""

from __future__ import annotations

import pytest

from sparkfleet.fleet.transport import Result
from sparkfleet.runner import progress
from sparkfleet.runner.progress import Silence
from tests.cli_run import lane_states, record_of, result, run, steps

LANE = ("--profile", "dcp2", "--inventory", "sim")
FAST = ("--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe")


def answer(stdout: str, ok: bool = True) -> Result:
    return Result("reddie", ok, stdout, "", exit_code=0 if ok else 1, error=None if ok else "exit")


# -- reading a container's CPU time from the node's /proc ------------------------------------------------------

def test_a_containers_cpu_time_is_its_main_process_and_every_descendant() -> None:
    out = "\n".join([
        "pid aaa 100", "pid bbb 0", "clk 100",
        "1 0 5000",  # the node's init: not the container's
        "100 1 150",  # aaa's main process
        "101 100 250",  # its child
        "102 101 100",  # a grandchild
        "200 1 999",  # another process of the node
    ])
    assert progress.parse_cpu(answer(out), ["aaa", "bbb", "ccc"]) == {"aaa": 5.0, "bbb": None, "ccc": None}


def test_no_cpu_time_is_read_from_a_node_that_did_not_answer_or_a_pid_that_is_gone() -> None:
    assert progress.parse_cpu(answer("", ok=False), ["aaa"]) == {"aaa": None}
    assert progress.parse_cpu(answer("pid aaa 100\nclk 100\n1 0 5\n"), ["aaa"]) == {"aaa": None}


def test_the_command_reads_this_machines_proc_as_the_parser_expects() -> None:
    """Run on this machine (no docker container: the pid lines say 0); /proc's lines parse, and a process whose
    command holds ') ' keeps its fields."""
    import subprocess

    cmd = progress.cpu_command(["no-such-container"])
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
    lines = done.stdout.splitlines()
    assert lines[0] == "pid no-such-container 0" and lines[1].startswith("clk ")
    rows = [x.split() for x in lines[2:]]
    assert rows and all(len(r) == 3 and all(f.isdigit() for f in r) for r in rows)


# -- judging the silence ---------------------------------------------------------------------------------------

def test_a_window_of_silence_with_a_busy_rank_is_working_and_an_idle_one_is_stalled() -> None:
    s = Silence(stall_s=10, quiet_since=0)
    s.lines(40, 0)
    assert not s.due(4.9) and s.due(5.0)
    assert s.sample(5.0, {0: 100.0, 1: 3.0}) is None  # the reference sample, half a window in
    assert not s.due(9.9) and s.due(10.0)
    v = s.sample(10.0, {0: 104.0, 1: 3.0})
    assert (v.kind, v.silent_s, v.window_s, v.cpu_s) == ("working", 10.0, 5.0, {0: 4.0, 1: 0.0})
    v = s.sample(15.0, {0: 104.1, 1: 3.0})  # 0.1 s of CPU in 5 s: under BUSY_SHARE of a core
    assert (v.kind, v.cpu_s) == ("stalled", {0: pytest.approx(0.1), 1: 0.0})
    assert "the boot is stalled (docs/failure-modes.md FM-42)" in v.text()


def test_a_new_line_on_any_rank_ends_the_silence_and_a_rank_not_read_gives_no_verdict() -> None:
    s = Silence(stall_s=10, quiet_since=0)
    s.lines(40, 0)
    s.sample(5.0, {0: 1.0, 1: None})
    s.lines(41, 6.0)
    assert s.ref is None and not s.due(10.0) and s.due(11.0)
    s.sample(11.0, {0: 1.0, 1: None})
    assert s.sample(16.0, {0: 1.0, 1: None}).kind == "unknown"


# -- through `up` on the lab -----------------------------------------------------------------------------------

def messages(events: list[dict]) -> list[str]:
    return [e["text"] for e in events if e["event"] == "message"]


def test_a_silent_boot_that_keeps_a_cpu_busy_is_not_stopped(sim, capsys, lane_cleaned) -> None:
    """The head is silent for 6 s after its weights with a CPU busy: with a 2 s stall window `up` samples its
    CPU, says it is still working and waits; the lane comes up (in about 8 s: a 40 s boot budget, not dcp2's
    900 s, bounds the wait should it not)."""
    sim.fault("reddie", "silent-tune", seconds=6)
    code, events = run(capsys, "up", *LANE, *FAST, "--stall-after", "2", "--boot-budget", "40")
    assert code == 0, result(events)
    assert steps(events)["wait_ready"] == "ok"
    working = [m for m in messages(events) if "still working, not judged hung (docs/failure-modes.md FM-42)" in m]
    assert working, messages(events)
    judged = record_of(events)["data"]["wait_ready"]["silent"]
    assert {v["kind"] for v in judged} == {"working"}
    assert all(v["cpu_s"]["0"] >= progress.BUSY_SHARE * v["window_s"] for v in judged)  # the head did the work
    assert record_of(events)["data"]["wait_ready"]["stall_s"] == 2


def test_a_silent_idle_boot_is_stopped_as_stalled_before_its_budget(sim, capsys, lane_cleaned) -> None:
    """The head stops logging and stops using CPU after its weights: `up` judges the lane stalled after the
    2 s window (about 5 s into the wait), not at the boot budget, stops every rank and names FM-42. The budget
    is 20 s, a few times that: a stall guard that broke fails this test at 20 s, on the budget's reason."""
    sim.fault("reddie", "boot-stall")
    code, events = run(capsys, "up", *LANE, *FAST, "--stall-after", "2", "--boot-budget", "20")
    assert code == 1, result(events)
    assert steps(events)["wait_ready"] == "fail"
    reason = result(events)["reason"]
    assert "no rank logged a line for " in reason
    assert "the boot is stalled (docs/failure-modes.md FM-42); every rank of this launch was stopped" in reason
    assert "boot budget" not in reason
    judged = record_of(events)["data"]["wait_ready"]["silent"]
    assert judged[-1]["kind"] == "stalled" and set(judged[-1]["cpu_s"]) == {"0", "1", "2", "3"}
    assert lane_states(sim) == {n: ["exited"] for n in ("reddie", "asusi", "bluey", "spark4")}
