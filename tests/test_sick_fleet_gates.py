"""A failed gate stops the lane: `up` with the lane's full gate set against each answer fault the sim engine has.

THE LAB IS A SIMULATION (sparkfleet/sim): the head's sim engine answers wrong the way the fault says; the
gates, the runner and the docker calls are the real code. Which gates each fault fails is decided from what
the fault does to answers (tests/test_gates_sim.py EXPECTED_FAILS), cut to dcp2's gate set. Uses the sim's
fixed ports: run under the lab lock (`flock /tmp/sparkfleet-lab.lock ...`).
"""

from __future__ import annotations

import pytest

from tests.cli_run import lane_states, record_of, result, run, step
from tests.test_gates_sim import EVIDENCE, EXPECTED_FAILS

LANE = ["--profile", "dcp2", "--inventory", "sim"]
# the full gate set (no --gates); a short soak and no clock probe keep each up to seconds
FAST = ["--poll", "0.2", "--no-probe", "--no-fabric-probe", "--soak-minutes", "0.05"]
DCP2_GATES = ["models", "count100", "needle", "image", "tools", "reasoning", "streaming", "determinism", "soak"]
ANSWER_FAULTS = ("garbage-tokens", "count-off-by-one", "needle-blind", "no-tool-calls", "nondeterministic",
                 "stream-usage-missing")


@pytest.fixture(autouse=True)
def clean(lane_cleaned):
    """Every test here leaves the lab healed and dcp2 down (tests/cli_run.py lane_cleaned)."""


states = lane_states


@pytest.mark.parametrize("fault", ANSWER_FAULTS)
def test_a_failed_gate_stops_every_rank_up_started(sim, capsys, fault: str) -> None:
    sim.fault("reddie", fault)  # the head answers: its next launch has the fault
    code, events = run(capsys, "up", *LANE, *FAST)
    assert code == 1
    want = sorted(EXPECTED_FAILS[fault] & set(DCP2_GATES))
    rec = record_of(events)
    got = {r["name"]: r["status"] for r in rec["data"]["gates"]["results"]}
    assert sorted(n for n, s in got.items() if s != "skip") == sorted(DCP2_GATES)  # the lane's whole set ran
    assert sorted(n for n, s in got.items() if s == "fail") == want
    res = result(events)
    assert res["outcome"] == "failed" and res["reason"].startswith("gates: ")
    assert res["reason"].endswith("; every rank of this launch was stopped")
    for gate, text in EVIDENCE[fault].items():  # the failing answers are in the record
        if gate in want:
            r = next(r for r in rec["data"]["gates"]["results"] if r["name"] == gate)
            assert text in repr(r), (gate, r)
    assert "left_running" not in rec["data"]["gates"]
    assert states(sim) == {n: ["exited"] for n in ("reddie", "asusi", "bluey", "spark4")}  # nothing serves


def test_keep_on_gate_failure_leaves_the_lane_up_and_says_so(sim, capsys) -> None:
    sim.fault("reddie", "needle-blind")
    code, events = run(capsys, "up", *LANE, *FAST, "--gates", "models,needle", "--keep-on-gate-failure")
    assert code == 1
    rec = record_of(events)
    base = rec["data"]["gates"]["endpoint"]
    warning = (f"WARNING: gate(s) needle failed and the lane is LEFT RUNNING at {base} (rank 1 on asusi, rank 2 on "
               "bluey, rank 3 on spark4, rank 0 on reddie), answering as it failed, because of "
               "--keep-on-gate-failure; stop it with `sparkfleet down --profile dcp2`")
    assert warning in [e.get("text") for e in events if e["event"] == "message"]
    left = rec["data"]["gates"]["left_running"]
    assert left["warning"] == warning and left["endpoint"] == base
    assert [(x["node"], x["rank"]) for x in left["ranks"]] == [("asusi", 1), ("bluey", 2), ("spark4", 3),
                                                               ("reddie", 0)]
    assert step(events, "gates")["summary"].endswith(
        f"; the lane is LEFT RUNNING at {base} (--keep-on-gate-failure): sparkfleet down --profile dcp2")
    assert states(sim) == {n: ["running"] for n in ("reddie", "asusi", "bluey", "spark4")}
    # --stop-on-gate-failure stays accepted (it is the default)
    sim.heal()
    sim.fault("reddie", "needle-blind")
    code, events = run(capsys, "up", *LANE, *FAST, "--gates", "models,needle", "--stop-on-gate-failure")
    assert code == 1 and result(events)["reason"].endswith("; every rank of this launch was stopped")
    assert states(sim) == {n: ["exited"] for n in ("reddie", "asusi", "bluey", "spark4")}
