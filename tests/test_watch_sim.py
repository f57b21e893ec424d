"""`sparkfleet watch` end to end on the simulated lab: faults on serving lanes, restarts, budget, stand-down.

THE LAB IS A SIMULATION (sparkfleet/sim, sparkfleet/simengine); watch, the runner, the transports, the
facts helper and every docker command are the real code, in a real `sparkfleet watch` process. Intervals
are short; nothing here asserts on timing. Uses the sim's fixed ports: run under the lab lock.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from tests import cli_run
from tests.cli_run import heal_and_down
from tests.conftest import REPO
from tests.watchproc import DETECT_S, FAST, WatchProc

NODES = ("reddie", "asusi", "bluey", "spark4")
RANK_NODE = {0: "reddie", 1: "asusi", 2: "bluey", 3: "spark4"}
UP = ["up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models", "--poll", "0.2", "--no-probe", "--json"]


@pytest.fixture
def lane(sim, capsys):
    """dcp2 serving, started by an operator's `up`; afterwards the lane is taken down and faults healed."""
    assert main(UP) == 0, capsys.readouterr().out[-2000:]
    capsys.readouterr()
    yield sim
    heal_and_down(sim, capsys)


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def state() -> Path:
    return Path(os.environ["SPARKFLEET_STATE"])


def containers(sim) -> dict[str, list[dict]]:
    """Every node's dcp2 containers, straight from the node's docker."""
    return cli_run.lane_containers(sim, "dcp2", NODES)


def record(run_id: str) -> dict:
    return json.loads((state() / "runs" / f"{run_id}.json").read_text())


def watch_records(w: WatchProc) -> list[dict]:
    """The records this watch process wrote (its incidents), oldest first."""
    return [r for r in (json.loads(p.read_text()) for p in sorted((state() / "runs").glob("*.json")))
            if r["playbook"] == "watch" and r["started"] >= w.started]


def status() -> dict:
    return json.loads((state() / "watch" / "dcp2.json").read_text())


def start_watch(*extra: str, **env_extra: str) -> WatchProc:
    return WatchProc(["--profile", "dcp2", "--inventory", "sim", *FAST, *extra], env(**env_extra))


def test_a_worker_vanishing_while_serving_restarts_the_group_workers_before_head(lane) -> None:
    before = {c["Config"]["Labels"]["sparkfleet.run"] for cs in containers(lane).values() for c in cs}
    w = start_watch("--max-restarts", "2")
    try:  # the sim removes the serving rank's container
        failure, served = w.restart_for(lambda: lane.fault("asusi", "rank-vanish"))
        w.end()
    finally:
        w.stop()
    assert failure["reason"] == "rank-vanished" and failure["why"] == "rank 1's container on asusi is gone"
    rec = record(served["run_id"])
    assert rec["playbook"] == "up" and rec["outcome"] == "ok"
    assert rec["command"] == "sparkfleet watch dcp2: restart (rank-vanished)"
    stop = rec["steps"][0]
    assert stop["step"] == "stop" and stop["summary"] == "removed 3 container(s) on spark4, bluey, reddie"
    assert [(x["node"], x["rank"]) for x in rec["data"]["launches"]] == [
        ("asusi", 1), ("bluey", 2), ("spark4", 3), ("reddie", 0)]
    gates = {g["name"]: g["status"] for g in rec["data"]["gates"]["results"]}
    assert gates == {"models": "pass", "count100": "pass"}
    # the restart's clock probe ran the load for --clock-probe-seconds 1 (FAST) on every rank
    assert {n: p["load"]["command"].split()[-3] for n, p in rec["data"]["probe"].items()} == {n: "1" for n in NODES}
    # no old rank left: one running container per node, all of the restart's run
    now = containers(lane)
    assert {n: [(c["State"]["Status"], c["Config"]["Labels"]["sparkfleet.run"]) for c in cs] for n, cs in now.items()} \
        == {n: [("running", served["run_id"])] for n in NODES}
    assert served["run_id"] not in before
    (incident,) = watch_records(w)
    assert incident["data"]["incident"] == {"reason": "rank-vanished", "why": "rank 1's container on asusi is gone",
                                            "node": "asusi"}
    assert incident["outcome"] == "ok" and incident["data"]["restart"]["run_id"] == served["run_id"]
    assert set(incident["data"]["last_log_lines"]) == {"0", "2", "3"}  # rank 1 had no container left
    assert incident["data"]["last_log_lines"]["0"]  # the head's own log lines, as docker logs gave them
    assert set(incident["data"]["facts"]) == set(NODES)
    assert incident["data"]["probes"][-1]["ranks"][1]["state"] == "vanished"
    st = status()
    assert st["state"] == "ended" and st["restarts"] == {"rank-vanished": 1} and st["budget_left"] == 1


def test_a_crash_on_every_launch_means_exactly_n_restarts_then_the_lane_stopped_exit_1(lane) -> None:
    w = start_watch("--max-restarts", "2", "--gates", "models")
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        lane.fault("asusi", "serve-crash", sticky=True)  # rank 1 exits after serving a while, on every launch
        give_up = w.event("watch.give-up")
        code = w.wait()
    finally:
        w.stop()
    assert code == 1
    assert w.result()["outcome"] == "stopped"
    runs = [e["text"].split(" (")[0] for e in w.events if e["event"] == "run"]
    assert runs == ["up dcp2", "up dcp2", "down dcp2"]  # exactly N=2 restarts, then the lane stopped
    assert give_up["text"].startswith("restart budget spent: 2 restart(s) in the last 1800 s")
    assert give_up["text"].endswith("the lane is left stopped")
    # nothing left running; the ranks are kept, stopped, for their logs
    left = containers(lane)
    assert left and all(c["State"]["Status"] == "exited" for cs in left.values() for c in cs)
    incidents = watch_records(w)
    assert [(i["data"]["incident"]["reason"], i["data"]["incident"]["node"]) for i in incidents] == [
        ("rank-exited", "asusi")] * 3  # each time rank 1 on asusi, each a new launch of it
    assert [i["data"]["incident"]["why"] for i in incidents] == ["rank 1 on asusi exited"] * 3
    assert incidents[-1]["outcome"] == "failed"
    assert "restart budget spent" in incidents[-1]["reason"] and incidents[-1]["reason"] == give_up["text"]
    restarted = [i["data"]["restart"]["run_id"] for i in incidents[:2]]
    assert len(set(restarted)) == 2  # two launches, each its own run
    st = status()
    assert st["state"] == "stopped" and st["budget_left"] == 0
    assert st["restarts"] == {"rank-exited": 2}


def test_memory_under_the_floor_stops_the_lane_head_first(lane) -> None:
    w = start_watch("--memory-grace", "1", "--max-restarts", "1")
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        lane.fault("reddie", "low-memory", gib=3)  # under the head's 5 GB floor (HLT-23), above earlyoom's line
        failure = w.event("watch.failure", within=DETECT_S)  # the guard acts at the probe past the 1 s grace
        w.event("watch.stopped")
        give_up = w.event("watch.give-up")
        code = w.wait()
    finally:
        w.stop()
    assert failure["reason"] == "memory" and failure["node"] == "reddie"
    # the head's line: its 5 GB floor (HLT-23) or earlyoom's SIGTERM line plus margin, whichever is higher
    assert re.search(r"\) 3\.2 GB has been below 5\.\d GB \((expect\.mem_available_floor_gb\.head 5 GB|earlyoom SIGTERM "
                     r"line 2\.6 GB \+ 2\.6 GB margin)\)", failure["why"]), failure["why"]
    (incident,) = watch_records(w)
    stopped = incident["data"]["stopped"]  # every rank's state and FinishedAt, read right after the stop
    assert sorted(int(c["rank"]) for cs in stopped.values() for c in cs) == [0, 1, 2, 3]
    assert all(c["state"] == "exited" and c["finished_s"] for cs in stopped.values() for c in cs)
    # the head first: the stop run's own record (its stop step asks reddie alone first, then each worker:
    # tests/test_stop_order.py). Not dockerd's FinishedAt: a worker whose head is gone may exit on its own
    # before the head has finished exiting (the real daemon showed it)
    rec = record(next(s["run_id"] for s in incident["steps"] if s["step"] == "stop"))
    assert list(next(s for s in rec["steps"] if s["step"] == "stop")["data"]["stopped"]) == [
        "reddie", "asusi", "bluey", "spark4"]
    # the restart's preflight refused the node's memory: the lane is left stopped
    assert code == 1 and "the restart's preflight failed (check:" in give_up["text"]
    assert not any(c["State"]["Status"] == "running" for cs in containers(lane).values() for c in cs)
    assert status()["restarts"] == {"memory": 1}


def test_down_by_a_second_controller_makes_watch_stand_down(lane, tmp_path) -> None:
    w = start_watch()
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        # another controller: its own state dir (records, locks), the same lab (the sim's inventory file)
        other = subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", "down", "--profile", "dcp2",
                                "--inventory", str(lane.inventory_path), "--json"],
                               env=env(SPARKFLEET_STATE=str(tmp_path / "other")),
                               cwd=REPO, capture_output=True, text=True)
        assert other.returncode == 0, other.stdout[-2000:] + other.stderr
        stood = w.event("watch.stand-down", within=DETECT_S)
        assert w.wait() == 0
    finally:
        w.stop()
    # named when the other controller's `down` still held the nodes' fleet lock as watch looked; else
    # the lane found removed whole (a `down` that had finished)
    assert "holds the fleet lock of the lane's nodes" in stood["text"] and "down" in stood["text"] \
        or "every rank's container was removed" in stood["text"], stood["text"]
    assert w.result()["outcome"] == "stood-down"
    assert containers(lane) == {n: [] for n in NODES}  # watch did not bring it back
    assert not any(e["event"] == "run" for e in w.events)  # and started nothing
    assert status()["state"] == "stood-down"
    (rec,) = watch_records(w)  # the stand-down is its own outcome in watch's records, saying why
    assert rec["outcome"] == "stood-down" and rec["reason"] == stood["text"].removeprefix("stood down: ")


def test_up_by_a_second_controller_makes_watch_stand_down_naming_who(lane, tmp_path) -> None:
    w = start_watch()
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        # another controller (its own state dir: none of its records or locks are here) runs `up` of the
        # lane: it holds the fleet lock on the lane's nodes while it stops, probes and relaunches
        other = subprocess.Popen([sys.executable, "-m", "sparkfleet.cli.main", "up", "--profile", "dcp2",
                                  "--inventory", str(lane.inventory_path), "--gates", "models", "--poll", "0.2",
                                  "--probe-seconds", "1", "--json"], env=env(SPARKFLEET_STATE=str(tmp_path / "other")),
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            stood = w.event("watch.stand-down")
            assert w.wait() == 0
        finally:
            out, errs = other.communicate(timeout=300)
    finally:
        w.stop()
    assert other.returncode == 0, out[-2000:] + errs
    theirs = next(json.loads(x) for x in out.splitlines() if x.startswith('{"event": "result"'))["run_id"]
    assert f"pid {other.pid} (run {theirs}) since" in stood["text"], stood["text"]
    assert stood["text"].endswith("holds the fleet lock of the lane's nodes: the operator has the lane")
    assert w.result()["outcome"] == "stood-down"
    assert not any(e["event"] == "run" for e in w.events)  # watch started nothing
    # the other controller's lane serves, untouched by watch
    assert {n: [(c["State"]["Status"], c["Config"]["Labels"]["sparkfleet.run"]) for c in cs]
            for n, cs in containers(lane).items()} == {n: [("running", theirs)] for n in NODES}
    recs = watch_records(w)
    assert [r["outcome"] for r in recs][-1] == "stood-down"
    assert recs[-1]["data"]["stand_down"]["holder"]["run_id"] == theirs  # the record names who, too
    assert recs[-1]["reason"] == stood["text"].removeprefix("stood down: ")


def test_sigterm_mid_restart_finishes_the_group_then_exits(lane) -> None:
    w = start_watch()
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        lane.fault("bluey", "rank-vanish")
        w.wait_for(lambda e: e["event"] == "step" and e["step"] == "launch:workers" and e["status"] == "start",
                   "the restart launching workers")
        w.signal(signal.SIGTERM)
        code = w.wait()
    finally:
        w.stop()
    assert code == 0
    names = [e["event"] for e in w.events]
    assert names.index("watch.serving") < names.index("watch.end")  # it finished the restart, then ended
    served = next(e for e in w.events if e["event"] == "watch.serving")
    assert w.result()["outcome"] == "ended"
    now = containers(lane)
    assert {n: [(c["State"]["Status"], c["Config"]["Labels"]["sparkfleet.run"]) for c in cs] for n, cs in now.items()} \
        == {n: [("running", served["run_id"])] for n in NODES}
    assert status()["state"] == "ended"


def test_dry_run_says_what_it_would_do_and_changes_nothing(lane) -> None:
    lane.fault("asusi", "rank-vanish")
    before = containers(lane)
    runs_before = sorted((state() / "runs").glob("*.json"))
    path = state() / "watch" / "dcp2.json"
    status_before = path.read_text() if path.exists() else None
    w = start_watch("--dry-run", "--max-restarts", "1")
    try:
        w.event("watch.probe")  # its first probe (the rank was gone before it started)
        failure = w.event("watch.failure", within=DETECT_S)
        would = w.event("watch.dry-run")
        give_up = w.event("watch.give-up")
        code = w.wait()
    finally:
        w.stop()
    assert failure["reason"] == "rank-vanished" and code == 1
    assert would["text"] == "would restart dcp2 through the up playbook (restart 1 of 1)"
    steps = [e["summary"] for e in w.events if e["event"] == "step" and e["status"] == "ok"]
    assert any(x.startswith("would stop") for x in steps)  # the up playbook's own dry run, in the stream
    assert give_up["text"].endswith("the lane is left stopped (dry run: nothing was changed)")
    ids = {n: sorted(c["Id"] for c in cs) for n, cs in before.items()}
    assert {n: sorted(c["Id"] for c in cs) for n, cs in containers(lane).items()} == ids  # none removed or added
    assert sorted((state() / "runs").glob("*.json")) == runs_before  # no record
    assert (path.read_text() if path.exists() else None) == status_before  # no status file written


def test_watching_a_restore_point_restarts_through_the_restore_playbook(sim, capsys) -> None:
    assert main([*UP, "--save-as", "watch-point"]) == 0
    capsys.readouterr()
    w = WatchProc(["--restore", "watch-point", "--inventory", "sim", *FAST], env())
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        sim.fault("spark4", "rank-vanish")
        served = w.event("watch.serving")
        w.signal(signal.SIGTERM)
        assert w.wait() == 0
    finally:
        w.stop()
        sim.heal()
        main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"])
        capsys.readouterr()
    rec = record(served["run_id"])
    assert rec["playbook"] == "restore" and rec["outcome"] == "ok"
    assert [s["step"] for s in rec["steps"]][:2] == ["pins", "stop"]


def test_a_worker_node_lost_while_serving_keeps_health_200_and_the_generating_probe_catches_it(lane) -> None:
    """asusi loses power while the lane serves: its rank stops dead, nothing closes, the node cannot be reached.
    vLLM's head notices nothing of it (the sim engine follows vLLM's source: /health asks only whether the
    engine core errored), so /health keeps answering 200 while every request waits for asusi's part of the
    step. Only watch's generating probe fails; while asusi cannot be reached watch waits for it (a restart
    would fail at its stop step and leave the lane stopped, issue 26); once it is back, without its rank,
    watch restarts the group and the lane answers again."""
    w = start_watch("--max-restarts", "1")
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        lane.fault("asusi", "node-lost")
        waiting = w.event("watch.waiting", within=DETECT_S)
        lane.heal("asusi", "node-lost")  # the node is back; its rank was killed with the power
        failure = w.event("watch.failure", within=DETECT_S)
        served = w.event("watch.serving")
        w.signal(signal.SIGTERM)
        code = w.wait()
    finally:
        w.stop()
    timeout = "no answer within 1.5 s: POST /v1/chat/completions: ReadTimeout: timed out"
    assert waiting["node"] == "asusi" and waiting["text"].startswith(
        "waiting for asusi (rank 1) to answer before restarting the group: ")
    probes = [e for e in w.events if e["event"] == "watch.probe"]
    lost = [e for e in probes if not e["ok"] and e["ranks"][1]["state"] == "unknown"]
    assert lost
    for e in lost:  # the head said it was healthy through it all; generation said otherwise
        assert (e["ok"], e["health"], e["why"]) == (False, 200, timeout)
        assert [(r["rank"], r["state"]) for r in e["ranks"]] == [(0, "running"), (1, "unknown"), (2, "running"),
                                                                (3, "running")]
        assert "No route to host" in e["ranks"][1]["error"]
    assert (failure["reason"], failure["node"]) == ("rank-exited", "asusi")
    (incident,) = watch_records(w)
    assert (200, ) in {(p["health"],) for p in incident["data"]["probes"] if not p["ok"]}
    head = "\n".join(incident["data"]["last_log_lines"]["0"])
    assert '"POST /v1/chat/completions HTTP/1.1" 200 OK' in head  # the probes it answered before the loss
    assert "Traceback" not in head and "EngineCore encountered" not in head  # the engine had noticed nothing
    rec = record(served["run_id"])
    assert rec["playbook"] == "up" and rec["outcome"] == "ok"
    assert rec["command"] == "sparkfleet watch dcp2: restart (rank-exited)"
    assert code == 0 and status()["restarts"] == {"rank-exited": 1}
