"""Progress that shows in a log: off a terminal, `up` prints a timestamped line per step start and end and a
line per rank when its boot phase changes; -q prints only findings and the result.

The lab tests run on the simulated lab (THE LAB IS A SIMULATION: sparkfleet/sim); run them under
flock /tmp/sparkfleet-lab.lock.
"""

from __future__ import annotations

import io
import re

from rich.console import Console

from sparkfleet.cli.main import main
from sparkfleet.cli.progress import PHASE_EVERY_S, Progress

FAST = ["--gates", "models", "--poll", "0.2", "--no-probe"]
STEP = re.compile(r"^(\d\d:\d\d:\d\d) (start|ok|warn|FAIL|skip) +(\S+)(.*)$")
RANK = re.compile(r"^\d\d:\d\d:\d\d +rank (\d) on (\w+): (.+) \((\w+), (\d+) log lines\)$")
UP_STEPS = ["stop", "drop_caches", "facts", "patches", "engine_build", "check", "probe", "fabric_probe", "engram",
            "rail2_up",
            "launch:workers", "launch:head", "wait_ready", "expect", "gates", "record"]


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _progress(verbosity: int = 0) -> tuple[Progress, io.StringIO, Clock]:
    buf, clock = io.StringIO(), Clock()
    console = Console(file=buf, force_terminal=False, width=200, highlight=False)
    return Progress(console, verbosity, clock=clock), buf, clock


def _row(rank: int, phase: str, lines: int = 5) -> dict:
    return {"node": f"n{rank}", "rank": rank, "state": "running", "phase": phase, "lines": lines}


def test_a_phase_line_per_change_at_most_every_window_the_last_one_not_lost() -> None:
    ev, buf, clock = _progress()
    ev.ranks([_row(0, "starting"), _row(1, "starting")])
    clock.t += 1
    ev.ranks([_row(0, "loading weights"), _row(1, "starting")])  # too soon after the last: held back
    clock.t += 1
    ev.ranks([_row(0, "capturing graphs"), _row(1, "starting")])  # replaces the held-back change
    assert [m.group(1, 3) for m in map(RANK.match, buf.getvalue().splitlines())] == [("0", "starting"),
                                                                                     ("1", "starting")]
    clock.t += PHASE_EVERY_S
    ev.ranks([_row(0, "capturing graphs"), _row(1, "starting")])  # its time is up: out
    clock.t += 1
    ev.ranks([_row(0, "serving"), _row(1, "loading weights")])  # rank 1 has not printed for the window: at once
    ev.step("wait_ready", "ok", "serving", elapsed_s=14.0)  # the step's end flushes rank 0's held change
    lines = buf.getvalue().splitlines()
    assert [(m.group(1), m.group(3)) for m in map(RANK.match, lines) if m] == [
        ("0", "starting"), ("1", "starting"), ("0", "capturing graphs"), ("1", "loading weights"), ("0", "serving")]
    assert STEP.match(lines[-1]).group(2, 3, 4) == ("ok", "wait_ready", " serving (14.0 s)")


def test_quiet_keeps_findings_only_and_verbose_shows_commands() -> None:
    from sparkfleet.findings import Finding

    ev, buf, _ = _progress(-1)
    ev.step("facts", "start")
    ev.step("facts", "ok", "4 node(s) answered", elapsed_s=1.0)
    ev.emit("message", text="record: /x")
    ev.emit("command", node="n1", command="docker ps")
    ev.findings("check", [Finding("earlyoom", "fail", "earlyoom is not running", "start it", node="n1")])
    assert buf.getvalue().splitlines() == ["       fail earlyoom (n1): earlyoom is not running",
                                           "            -> start it"]
    ev, buf, _ = _progress(1)
    ev.emit("command", node="n1", command="docker ps -a")
    assert re.fullmatch(r"\d\d:\d\d:\d\d n1\$ docker ps -a\n", buf.getvalue())
    ev, buf, _ = _progress(0)
    ev.emit("command", node="n1", command="docker ps -a")
    assert buf.getvalue() == ""


def _up(capsys, *extra: str) -> tuple[int, list[str]]:
    code = main(["up", "--profile", "dcp2", "--inventory", "sim", *FAST, *extra])
    return code, capsys.readouterr().out.splitlines()


def test_up_off_a_terminal_says_every_step_and_each_ranks_phase(sim, capsys) -> None:
    try:
        code, lines = _up(capsys)
        assert code == 0, "\n".join(lines)
        steps = [m.group(2, 3) for m in map(STEP.match, lines) if m]
        assert [s for _, s in steps] == [s for s in UP_STEPS for _ in ("start", "end")]
        assert [kind == "start" for kind, _ in steps] == [True, False] * len(UP_STEPS)  # a start, then its end
        start = next(i for i, x in enumerate(lines) if STEP.match(x) and STEP.match(x).group(2, 3) == ("start",
                                                                                                        "wait_ready"))
        end = next(i for i, x in enumerate(lines) if i > start and STEP.match(x))
        ranks = [RANK.match(x) for x in lines[start + 1:end] if RANK.match(x)]
        assert {(m.group(1), m.group(2)) for m in ranks} == {("0", "reddie"), ("1", "asusi"), ("2", "bluey"),
                                                             ("3", "spark4")}
        last = {m.group(1): m.group(3) for m in ranks}
        assert last["0"] == "serving"  # the head's phase when the lane served is the last one said
    finally:
        main(["down", "--profile", "dcp2", "--inventory", "sim", "-q"])
        capsys.readouterr()


def test_up_quiet_prints_the_findings_and_the_result(sim, capsys) -> None:
    try:
        code, lines = _up(capsys, "-q")
        assert code == 0, "\n".join(lines)
        assert not any(STEP.match(x) or RANK.match(x) for x in lines)
        assert re.fullmatch(r"up dcp2: ok \(run \d{8}-\d{6}-[0-9a-f]{6}\)", lines[-1])
        assert all(x.startswith(("       warn ", "       unknown ", "            -> ", "              ")) or x == lines[-1]
                   for x in lines), lines
    finally:
        assert main(["down", "--profile", "dcp2", "--inventory", "sim", "-q"]) == 0
        assert re.fullmatch(r"down dcp2: ok \(run \S+\)\n", capsys.readouterr().out)
