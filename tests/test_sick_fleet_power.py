"""A node that loses power mid-lane and comes back (FM-25 in its serving form), through the real CLI on the lab:
`status` names the rank the lane lost, `up` and `restore` during the outage are refused naming the node,
and `watch` waits for the node (spending no restart), then restarts the whole group and the lane answers.

THE LAB IS A SIMULATION (sparkfleet/sim): `sim fault NODE power-cycle` ends every process of the node at
once (its engines, sshd, earlyoom), empties its /run, keeps its disks and boots it again on heal (or after
--off seconds). The runner, watch, transports, facts helper and docker calls are the real code.
Uses the sim's fixed ports: run under the lab lock (`flock /tmp/sparkfleet-lab.lock ...`).
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from sparkfleet.cli.main import main
from tests.cli_run import LAB_NODES, findings, lane_containers, lane_states, result, run, step
from tests.conftest import REPO
from tests.watchproc import DETECT_S, WatchProc
from tests.watchproc import FAST as WATCH_FAST

LANE = ["--profile", "dcp2", "--inventory", "sim"]
FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe"]
OFF = "600"  # stays off until the test heals it (boots it): nothing here waits on the clock


@pytest.fixture(autouse=True)
def clean(lane_cleaned):
    """Every test leaves the lab healed (the node booted) and dcp2 down (tests/conftest.py lane_cleaned)."""


def up_ok(capsys, *extra: str) -> str:
    code, events = run(capsys, "up", *LANE, *FAST, *extra)
    assert code == 0, result(events)
    return result(events)["run_id"]


def test_power_cycle_loses_what_lived_in_ram_and_keeps_the_disks(sim, capsys) -> None:
    run_id = up_ok(capsys)
    root = sim.root("bluey")
    (root / "run" / "lock" / "left-by-a-test").parent.mkdir(parents=True, exist_ok=True)
    (root / "run" / "lock" / "left-by-a-test").write_text("x\n")
    engram = root / "nvme" / "engram-local"
    on_disk = sorted(p.relative_to(engram).as_posix() for p in engram.rglob("*"))
    assert on_disk  # the node-local Engram copy the lane reads

    assert main(["sim", "fault", "bluey", "power-cycle", "--off", OFF, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"]["off"] == float(OFF)
    assert not sim.reachable("bluey")
    assert sorted(p.name for p in (root / "run").iterdir()) == ["sshd"]  # tmpfs: gone
    assert sorted(p.relative_to(engram).as_posix() for p in engram.rglob("*")) == on_disk  # /nvme: kept

    sim.heal("bluey", "power-cycle")  # the power is back
    assert sim.reachable("bluey")
    bluey = lane_containers(sim, "dcp2")["bluey"]
    assert [(c["State"]["Status"], c["State"]["ExitCode"], c["Config"]["Labels"]["sparkfleet.run"])
            for c in bluey] == [("exited", 255, run_id)]  # as dockerd shows it after an unclean restart
    assert main(["facts", "--inventory", "sim", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    uptimes = {n: f["uptime_s"] for n, f in facts.items()}
    assert uptimes["bluey"] < 600  # it booted again, during this test (its uptime counts from then); the others
    assert all(u > 90000 for n, u in uptimes.items() if n != "bluey")  # kept running


def test_status_up_and_restore_during_the_outage_name_the_node_and_a_later_down_cleans_it(sim, capsys) -> None:
    up_ok(capsys, "--save-as", "power-point")
    sim.fault("bluey", "power-cycle", off=float(OFF))

    assert main(["status", *LANE, "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)["containers"]
    assert [(r["node"], r.get("rank"), r["state"]) for r in rows if r["node"] == "bluey"] == [
        ("bluey", 2, "unreachable, may be running")]

    code, events = run(capsys, "up", *LANE, *FAST)
    assert code == 1
    stop = step(events, "stop")
    assert stop["status"] == "fail"
    assert stop["summary"].endswith("bluey (reach) did not answer: rank 2 may still be running there; once it "
                                    "answers, run `sparkfleet down --profile dcp2 --limit bluey`")
    assert not any(e["step"].startswith("launch") for e in events if e["event"] == "step")
    others = ("reddie", "asusi", "spark4")  # bluey is off: nothing can list its containers
    assert lane_states(sim, nodes=others) == {"reddie": [], "asusi": [], "spark4": []}

    code, events = run(capsys, "restore", "power-point", "--inventory", "sim", "--no-probe")
    assert code == 1
    failed = [e for e in events if e["event"] == "step" and e["status"] == "fail"]
    assert [(e["step"], e["summary"]) for e in failed] == [
        ("pins", "bluey did not answer, so no pin of 'power-point' can be checked there: nothing was stopped")]
    assert not any(e["step"].startswith("launch") for e in events if e["event"] == "step")
    assert [(f["node"], f["message"]) for f in findings(events, "pins")] == [
        ("bluey", "bluey: did not answer, so no pin can be checked")]
    others = ("reddie", "asusi", "spark4")  # bluey is off: nothing can list its containers
    assert lane_states(sim, nodes=others) == {"reddie": [], "asusi": [], "spark4": []}

    sim.heal("bluey", "power-cycle")
    assert main(["status", *LANE, "--json"]) == 1  # the lane lost a rank
    [row] = json.loads(capsys.readouterr().out)["containers"]
    assert (row["node"], row["rank"], row["state"], row["exit_code"]) == ("bluey", 2, "exited", 255)
    assert row["note"] == (f"bluey rebooted at {row['rebooted_at']} (from its uptime), after rank 2 started at "
                           f"{row['started_at']}: the lane lost this rank")
    assert row["remedy"] == ("start the whole lane again: `sparkfleet up --profile dcp2` (a tensor-parallel lane "
                             "cannot take one rank back; `sparkfleet watch --profile dcp2` restarts it by itself)")
    assert row["started_at"] < row["rebooted_at"]  # both RFC 3339 UTC: they sort as times
    assert main(["status", *LANE, "--wide"]) == 1  # the table says it too
    table = capsys.readouterr().out
    assert "exited (255)" in table and "bluey rebooted at" in table and "sparkfleet up --profile dcp2" in table
    code, events = run(capsys, "down", *LANE, "--limit", "bluey")
    assert code == 0, result(events)
    assert lane_states(sim) == {n: [] for n in LAB_NODES}


def test_watch_waits_for_a_power_cycled_node_then_restarts_the_group_and_the_lane_answers(sim, capsys) -> None:
    first = up_ok(capsys)
    w = WatchProc([*LANE, *WATCH_FAST, "--max-restarts", "2"], {**os.environ, "PYTHONPATH": str(REPO)})
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        sim.fault("bluey", "power-cycle", off=float(OFF))
        waiting = w.event("watch.waiting", within=DETECT_S)
        # still waiting a probe later: the node is off, no restart is spent on it
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["_seen"] > waiting["_seen"], "a probe while off")
        st = json.loads((state() / "watch" / "dcp2.json").read_text())
        assert (st["state"], st["budget_left"], st["restarts"]) == ("waiting", 2, {})
        sim.heal("bluey", "power-cycle")  # the node boots: its rank's container is Exited (255)
        failure = w.event("watch.failure")
        served = w.event("watch.serving")
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"] and e["_seen"] > served["_seen"],
                   "an ok probe after the restart")
        w.signal(signal.SIGTERM)
        assert w.wait() == 0
    finally:
        w.stop()
    assert waiting["node"] == "bluey" and waiting["text"].startswith(
        "waiting for bluey (rank 2) to answer before restarting the group: ")
    assert failure["reason"] == "rank-exited" and failure["node"] in LAB_NODES
    assert not any(e["event"] in ("watch.give-up", "watch.restart-failed") for e in w.events)
    rec = json.loads((state() / "runs" / f"{served['run_id']}.json").read_text())
    assert rec["playbook"] == "up" and rec["outcome"] == "ok"
    assert {g["name"]: g["status"] for g in rec["data"]["gates"]["results"]} == {"models": "pass", "count100": "pass"}
    now = lane_containers(sim, "dcp2")
    assert {n: [(c["State"]["Status"], c["Config"]["Labels"]["sparkfleet.run"]) for c in cs] for n, cs in now.items()} \
        == {n: [("running", served["run_id"])] for n in LAB_NODES}
    assert served["run_id"] != first
    st = json.loads((state() / "watch" / "dcp2.json").read_text())
    assert st["restarts"] == {"rank-exited": 1}


def state():
    from pathlib import Path

    return Path(os.environ["SPARKFLEET_STATE"])


def test_a_power_cycled_node_boots_by_itself_after_off_seconds(sim, capsys) -> None:
    import time

    assert main(["sim", "fault", "spark4", "power-cycle", "--off", "0.5", "--json"]) == 0
    supply = json.loads(capsys.readouterr().out)
    assert supply["params"]["off"] == 0.5
    deadline = time.monotonic() + 60  # a bound, not a timing assertion
    while not sim.faults("spark4")["power-cycle"].get("back"):
        assert time.monotonic() < deadline, sim.faults("spark4")
        time.sleep(0.1)
    assert sim.reachable("spark4")
    pid = sim.faults("spark4")["power-cycle"]["supply"]
    assert pid is None  # the power supply process has done its part and ended
    assert main(["facts", "--inventory", "sim", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["spark4"]["uptime_s"] < 60  # booted when the power went (0.5 s off)
    assert sim.heal("spark4", "power-cycle") == [("spark4", "power-cycle")]
    assert sim.reachable("spark4")
