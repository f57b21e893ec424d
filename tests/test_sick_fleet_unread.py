"""A facts part a node could not read, through `check` and `up` on the lab (issue 39 §1; FM-48, FM-44).

`sim fault NODE unreadable-part --what listening|mounts` makes the node's facts helper fail to open
/proc/net/tcp or /etc/mtab (EACCES, as an unreadable file does). `check` says the check that reads the part
could not judge, naming the part's error; `up` stops there (exit 1, nothing started) unless the operator
passes --accept-unknown, and then the run record says which unknowns were accepted.

THE LAB IS A SIMULATION (sparkfleet/sim): the fault wraps the node's python3 (sim/faults.py); the facts
helper, checks, runner and docker calls are the real code. Uses the sim's fixed ports: run under the lab lock.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from tests.cli_run import LAB_NODES, lane_states, record_of, result, run, step
from tests.conftest import REPO
from tests.watchproc import FAST as WATCH_FAST
from tests.watchproc import WatchProc

LANE = ["--profile", "dcp2", "--inventory", "sim"]
FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe"]
TCP = "listening: cannot read /proc/net/tcp: Permission denied"
MOUNTS = "mounts: Permission denied"
# (node, the part made unreadable, the check that reads it, the helper's error line)
CASES = [("reddie", "listening", "conflicts", TCP), ("asusi", "mounts", "storage", MOUNTS)]


@pytest.fixture(autouse=True)
def clean(lane_cleaned):
    """Every test here leaves the lab healed and dcp2 down (tests/conftest.py lane_cleaned)."""


def unknowns(findings: list[dict]) -> list[tuple[str, str, str]]:
    return [(f["node"], f["check"], f["message"]) for f in findings if f["status"] == "unknown" and f.get("unread")]


@pytest.mark.parametrize("node,what,check,error", CASES, ids=[c[1] for c in CASES])
def test_an_unreadable_part_is_unknown_in_check_and_stops_up_before_anything_starts(sim, capsys, node, what,
                                                                                     check, error) -> None:
    sim.fault(node, "unreadable-part", what=what)
    code = main(["check", *LANE, "--json"])
    doc = json.loads(capsys.readouterr().out)
    # not a failure, not ok: exit 3, the verdict UNKNOWN, so `check && up` stops where `up` would refuse
    assert code == 3 and doc["ok"] is False and doc["summary"]["fail"] == 0
    assert unknowns(doc["findings"]) == [(node, check, f"could not judge, because {error}")]
    # never the verdict the empty default gave: "nothing holds :PORT", "model dir ... present" (mount unknown)
    said = [f["message"] for f in doc["findings"] if f["check"] == check and f["node"] == node and f["status"] == "ok"]
    assert not [m for m in said if m.startswith(("nothing holds", "model dir"))], said

    code, events = run(capsys, "up", *LANE, *FAST)
    assert code == 1
    assert step(events, "check")["status"] == "fail"
    assert result(events)["reason"] == ("check: 1 check(s) could not judge a part the node could not read: nothing "
                                        "was started (--accept-unknown goes on without them)")
    shown = [f for e in events if e["event"] == "findings" and e["step"] == "check" for f in e["findings"]]
    assert unknowns(shown) == [(node, check, f"could not judge, because {error}")]
    done = [e["step"] for e in events if e["event"] == "step" and e["status"] != "start"]
    assert done[-1] == "check" and not any(s.startswith("launch") for s in done)
    assert lane_states(sim) == {n: [] for n in LAB_NODES}  # nothing was started


def test_up_goes_on_past_an_unreadable_part_with_accept_unknown_and_records_it(sim, capsys) -> None:
    sim.fault("reddie", "unreadable-part", what="listening")
    code, events = run(capsys, "up", *LANE, *FAST, "--accept-unknown")
    assert code == 0, result(events)
    assert step(events, "check")["summary"].endswith(", 1 unknown(s) accepted (--accept-unknown)")
    rec = record_of(events)
    assert [(f["node"], f["check"], f["unread"], f["message"]) for f in rec["data"]["accepted_unknowns"]] == [
        ("reddie", "conflicts", "listening", f"could not judge, because {TCP}")]
    assert lane_states(sim) == {n: ["running"] for n in LAB_NODES}


def test_watchs_restart_goes_on_past_an_unreadable_part_with_accept_unknown(sim, capsys) -> None:
    """watch --accept-unknown hands the operator's choice to each restart: a rank vanishes while reddie's
    /proc/net/tcp cannot be read; the restart's check accepts that unknown (without the flag it stops there,
    as `up` does), the lane serves again, and the restart's record lists what was accepted."""
    code, events = run(capsys, "up", *LANE, *FAST)
    assert code == 0, result(events)
    sim.fault("reddie", "unreadable-part", what="listening")
    w = WatchProc([*LANE, *WATCH_FAST, "--gates", "models", "--no-fabric-probe", "--max-restarts", "1",
                   "--accept-unknown"], {**os.environ, "PYTHONPATH": str(REPO)})
    try:
        _, back = w.restart_for(lambda: sim.fault("spark4", "rank-vanish"))
        w.end()
    finally:
        w.stop()
    rec = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{back['run_id']}.json").read_text())
    assert rec["outcome"] == "ok" and rec["command"] == "sparkfleet watch dcp2: restart (rank-vanished)", rec["reason"]
    assert [(f["node"], f["check"], f["unread"]) for f in rec["data"]["accepted_unknowns"]] == [
        ("reddie", "conflicts", "listening")]
    assert lane_states(sim) == {n: ["running"] for n in LAB_NODES}
