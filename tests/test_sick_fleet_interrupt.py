"""Nothing left behind: SIGINT (a terminal's Ctrl-C, to the process group) or SIGTERM (`kill`) at several
points of a real `up` process ends with no container of that run running on any node (looked up on the
nodes themselves), no fleet lock left on any node, and exit 130 or 143.

THE LAB IS A SIMULATION (sparkfleet/sim). Uses the sim's fixed ports: run under the lab lock
(`flock /tmp/sparkfleet-lab.lock ...`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from tests.cli_run import LAB_NODES, lane_containers, lane_states
from tests.conftest import REPO
from tests.test_fleet_lock import holder, lock_file

FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe"]


def default_sigint() -> None:
    """In the child: SIGINT as a terminal's shell leaves it (a test run started in the background of a
    non-interactive shell inherits SIGINT ignored, and Python then never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def clean(sim, capsys):
    yield
    sim.heal()
    main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"])
    capsys.readouterr()


@pytest.mark.parametrize("at, sig, code", [
    ("facts", signal.SIGTERM, 143),
    ("launch:workers", signal.SIGINT, 130),  # inside the workers' wave: docker runs in flight
    ("launch:head", signal.SIGTERM, 143),
    ("wait_ready", signal.SIGTERM, 143),
])
def test_an_interrupted_up_leaves_no_container_of_its_run_running_and_no_lock(sim, tmp_path, at: str, sig: int,
                                                                             code: int) -> None:
    sim.fault("reddie", "slow-boot", factor=100)  # wait_ready still waits when the signal comes
    log = tmp_path / "up.log"
    up = subprocess.Popen([sys.executable, "-m", "sparkfleet.cli.main", "up", "--profile", "dcp2",
                           "--inventory", str(sim.inventory_path), *FAST, "--json"],
                          env={**os.environ, "PYTHONPATH": str(REPO), "SPARKFLEET_STATE": str(tmp_path / "a")},
                          cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
                          start_new_session=True, preexec_fn=default_sigint)

    def events() -> list[dict]:
        return [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]

    try:
        deadline = time.monotonic() + 120
        while not any(e["event"] == "step" and e["step"] == at and e["status"] == "start" for e in events()):
            assert up.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.02)
        if sig == signal.SIGINT:
            os.killpg(up.pid, sig)  # as a terminal sends Ctrl-C
        else:
            up.send_signal(sig)  # as `kill` does
        assert up.wait(timeout=120) == code, log.read_text()[-2000:]
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    res = next(e for e in events() if e["event"] == "result")
    assert res["outcome"] == "interrupted"
    assert res["reason"] == ("terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted by the user") + \
        "; every rank of this launch was stopped"
    rec = json.loads((tmp_path / "a" / "runs" / f"{res['run_id']}.json").read_text())
    assert rec["data"]["interrupted_by"] == ("SIGTERM" if sig == signal.SIGTERM else "SIGINT")
    for node in LAB_NODES:  # the lock given back on every node
        assert holder(sim, node) is None
        assert sorted(p.name for p in lock_file(sim, node).parent.iterdir() if "sparkfleet" in p.name) == []
    mine = {n: [c["State"]["Status"] for c in cs if c["Config"]["Labels"]["sparkfleet.run"] == res["run_id"]]
            for n, cs in lane_containers(sim, "dcp2").items()}
    assert all(s == "exited" for ss in mine.values() for s in ss), mine  # what it started is stopped
    if at in ("launch:head", "wait_ready"):  # the workers had started: stopped, kept for their logs
        assert {n: mine[n] for n in ("asusi", "bluey", "spark4")} == dict.fromkeys(("asusi", "bluey", "spark4"),
                                                                                   ["exited"])
    if at == "facts":
        assert mine == {n: [] for n in LAB_NODES}


def nothing_of(sim, run_id: str) -> dict[str, list[str]]:
    """Each node's container states of one run (by its sparkfleet.run label, on the nodes themselves)."""
    return {n: [c["State"]["Status"] for c in cs if c["Config"]["Labels"]["sparkfleet.run"] == run_id]
            for n, cs in lane_containers(sim, "dcp2").items()}


def no_lock_left(sim) -> None:
    for node in LAB_NODES:
        assert holder(sim, node) is None
        assert sorted(p.name for p in lock_file(sim, node).parent.iterdir() if "sparkfleet" in p.name) == []


@pytest.mark.parametrize("at", ["launch:workers", "wait_ready"])
def test_ctrl_c_during_restore_leaves_no_container_of_its_run_running_and_no_lock(sim, capsys, tmp_path,
                                                                                   at: str) -> None:
    assert main(["up", "--profile", "dcp2", "--inventory", "sim", *FAST, "--save-as", "ctrl-c-point",
                 "--json"]) == 0
    capsys.readouterr()
    sim.fault("reddie", "slow-boot", factor=100)  # wait_ready still waits when Ctrl-C comes
    log = tmp_path / "restore.log"
    restore = subprocess.Popen([sys.executable, "-m", "sparkfleet.cli.main", "restore", "ctrl-c-point",
                                "--inventory", str(sim.inventory_path), "--no-probe", "--poll", "0.2", "--json"],
                               env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, stdout=log.open("w"),
                               stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               preexec_fn=default_sigint)

    def events() -> list[dict]:
        return [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]

    try:
        deadline = time.monotonic() + 120
        while not any(e["event"] == "step" and e["step"] == at and e["status"] == "start" for e in events()):
            assert restore.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.02)
        os.killpg(restore.pid, signal.SIGINT)  # a terminal's Ctrl-C
        assert restore.wait(timeout=120) == 130, log.read_text()[-2000:]
    finally:
        if restore.poll() is None:
            os.killpg(restore.pid, signal.SIGKILL)
            restore.wait()
    res = next(e for e in events() if e["event"] == "result")
    assert (res["outcome"], res["reason"]) == ("interrupted", "interrupted by the user; every rank of this launch "
                                               "was stopped")
    rec = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{res['run_id']}.json").read_text())
    assert (rec["playbook"], rec["data"]["interrupted_by"]) == ("restore", "SIGINT")
    no_lock_left(sim)
    mine = nothing_of(sim, res["run_id"])
    assert all(s == "exited" for ss in mine.values() for s in ss), mine
    if at == "wait_ready":  # the workers had started: stopped, kept for their logs
        assert {n: mine[n] for n in ("asusi", "bluey", "spark4")} == dict.fromkeys(("asusi", "bluey", "spark4"),
                                                                                   ["exited"])
    # the up's lane was stopped by restore's stop step before the interrupt: nothing of any run still runs
    assert not any(s == "running" for ss in lane_states(sim).values() for s in ss)


def test_ctrl_c_during_watchs_group_restart_finishes_it_and_twice_stops_every_rank_it_started(sim, capsys) -> None:
    from tests.watchproc import FAST as WATCH_FAST
    from tests.watchproc import WatchProc

    assert main(["up", "--profile", "dcp2", "--inventory", "sim", *FAST, "--json"]) == 0
    capsys.readouterr()
    w = WatchProc(["--profile", "dcp2", "--inventory", "sim", *WATCH_FAST], {**os.environ, "PYTHONPATH": str(REPO)})
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        sim.fault("reddie", "slow-boot", factor=100)  # the restart's head is still booting when Ctrl-C comes
        sim.fault("bluey", "rank-vanish")
        w.wait_for(lambda e: e["event"] == "step" and e["step"] == "wait_ready" and e["status"] == "start",
                   "the restart waiting for its lane")
        run_id = next(e for e in reversed(w.events) if e["event"] == "run")["run_id"]
        w.signal(signal.SIGINT)  # the first Ctrl-C: watch would finish the restart ...
        sent = time.time()
        # a progress line the main thread printed after the signal: its handler has run (two signals sent at
        # once can be delivered as one)
        w.wait_for(lambda e: e["event"] == "ranks" and e["_seen"] > sent + 0.5, "a progress line after Ctrl-C")
        w.signal(signal.SIGINT)  # ... the second interrupts it as Ctrl-C interrupts `up`
        code = w.wait()
    finally:
        w.stop()
    assert code == 130, w.stderr[-2000:]
    rec = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{run_id}.json").read_text())
    assert (rec["playbook"], rec["outcome"], rec["data"]["interrupted_by"]) == ("up", "interrupted", "SIGINT")
    assert rec["command"] == "sparkfleet watch dcp2: restart (rank-vanished)"
    no_lock_left(sim)
    from sparkfleet.runner.lock import FleetLock

    assert FleetLock(Path(os.environ["SPARKFLEET_STATE"]) / "locks" / "sim.lock", "").live_holder() is None
    mine = nothing_of(sim, run_id)
    assert {n: mine[n] for n in ("asusi", "bluey", "spark4")} == dict.fromkeys(("asusi", "bluey", "spark4"),
                                                                               ["exited"])
    assert mine["reddie"] in ([], ["exited"])
    assert not any(s == "running" for ss in lane_states(sim).values() for s in ss)
    st = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "watch" / "dcp2.json").read_text())
    assert st["state"] == "ended"
