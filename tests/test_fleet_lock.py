"""The fleet lock lives on the nodes: two controllers (two state dirs, one lab) through `up` and `down`.

THE LAB IS A SIMULATION (sparkfleet/sim): its nodes are separate machines to the controller; the lock file
is written on each node's own /run/lock by the real node command. Uses the sim's fixed ports: run under
the lab lock (`flock /tmp/sparkfleet-lab.lock ...`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.runner.lock import STALE_AFTER_S
from tests.cli_run import default_sigint, lane_containers
from tests.conftest import REPO

SPARKS = ("reddie", "asusi", "bluey", "spark4")
FAST = ["--gates", "models", "--poll", "0.2", "--no-probe"]


@pytest.fixture(autouse=True)
def clean(sim, capsys):
    yield
    sim.heal()
    for node in SPARKS:
        lock_file(sim, node).unlink(missing_ok=True)
    main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"])
    capsys.readouterr()


def lock_file(sim, node: str) -> Path:
    """The node's /run/lock/sparkfleet.lock, as this machine sees the node's tree."""
    return sim.root(node) / "run/lock/sparkfleet.lock"


def holder(sim, node: str) -> dict | None:
    try:
        return json.loads(lock_file(sim, node).read_text())
    except (OSError, ValueError):
        return None


def plant(sim, node: str, age_s: float = 0.0, **who) -> str:
    """A lock file left on a node by another controller (as that controller's node command writes it)."""
    text = json.dumps({"user": "ops", "host": "laptop-2", "pid": 4242, "run_id": "20261130-010203-abcd",
                       "command": "sparkfleet up dcp2", "lane": "dcp2", "since": "2026-11-30T01:02:03+0000",
                       **who}, sort_keys=True)
    path = lock_file(sim, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return text


def run(capsys, *argv: str) -> tuple[int, list[dict], str]:
    code = main([*argv, "--json"])
    cap = capsys.readouterr()
    return code, [json.loads(x) for x in cap.out.splitlines() if x.startswith("{")], cap.err


def test_a_second_controller_is_refused_while_the_first_boots_and_a_lane_elsewhere_is_not(sim, capsys,
                                                                                        tmp_path) -> None:
    log = tmp_path / "first.log"  # a file, not a pipe: nobody reads the events while the first runs
    first = subprocess.Popen([sys.executable, "-m", "sparkfleet.cli.main", "up", "--profile", "dcp2",
                              "--inventory", str(sim.inventory_path), *FAST, "--json"],
                             env={**os.environ, "PYTHONPATH": str(REPO), "SPARKFLEET_STATE": str(tmp_path / "a")},
                             cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not all((holder(sim, n) or {}).get("pid") == first.pid for n in SPARKS):
            assert first.poll() is None and time.monotonic() < deadline, "the first up never held every node"
            time.sleep(0.05)
        h = holder(sim, "reddie")
        assert h["host"] == socket.gethostname() and h["command"] == "sparkfleet up dcp2" and h["lane"] == "dcp2"

        # the second controller (this process, its own state dir): refused, naming node and holder
        code, events, err = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
        assert code == 75
        assert (f"another run holds the fleet lock /run/lock/sparkfleet.lock on reddie: 'sparkfleet up dcp2' by "
                f"{h['user']}@{h['host']} pid {first.pid} (run {h['run_id']}) since {h['since']} "
                f"(and on asusi, bluey, spark4)") in err
        assert not [e for e in events if e["event"] == "step"]  # nothing was done
        assert not (Path(os.environ["SPARKFLEET_STATE"]) / "runs").exists() or not any(
            json.loads(p.read_text())["profile"] == "dcp2" and json.loads(p.read_text())["playbook"] == "up"
            for p in (Path(os.environ["SPARKFLEET_STATE"]) / "runs").glob("*.json"))
        # a lane on other nodes (the Station) is not blocked while the first still holds the Sparks
        code, events, err = run(capsys, "down", "--profile", "gb300-configc", "--inventory", "sim")
        assert code == 0, err
        assert all((holder(sim, n) or {}).get("pid") == first.pid for n in SPARKS)
        assert holder(sim, "station") is None  # given back when that down ended

        first.wait(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, log.read_text()[-2000:]
    assert [holder(sim, n) for n in SPARKS] == [None] * 4  # the first gave its lock back on every node


def test_stale_locks_are_taken_over_with_a_warning_a_live_one_refuses(sim, capsys) -> None:
    dead = 2 ** 22 + 7  # above the default pid_max: no process has it
    plant(sim, "reddie", host=socket.gethostname(), pid=dead)
    plant(sim, "asusi", age_s=STALE_AFTER_S + 600)  # another host's, past the bound
    live = plant(sim, "bluey", age_s=60)  # another host's, fresh: cannot be judged gone
    code, events, err = run(capsys, "down", "--profile", "dcp2", "--inventory", "sim")
    assert code == 75
    assert "another run holds the fleet lock /run/lock/sparkfleet.lock on bluey: 'sparkfleet up dcp2' by " \
           "ops@laptop-2 pid 4242 (run 20261130-010203-abcd) since 2026-11-30T01:02:03+0000; wait" in err
    assert lock_file(sim, "bluey").read_text() == live + "\n"  # the live holder's lock is untouched
    for node in ("reddie", "asusi", "spark4"):  # what this run took (stale ones included) was given back
        assert holder(sim, node) is None
    assert not [e for e in events if e["event"] == "step"]

    lock_file(sim, "bluey").unlink()
    plant(sim, "reddie", host=socket.gethostname(), pid=dead)
    plant(sim, "asusi", age_s=STALE_AFTER_S + 600)
    code, events, err = run(capsys, "down", "--profile", "dcp2", "--inventory", "sim")
    assert code == 0, err
    warned = [f for e in events if e["event"] == "findings" and e["step"] == "lock" for f in e["findings"]]
    assert [(f["node"], f["status"], f["message"]) for f in warned] == [
        ("reddie", "warn", f"took over a stale fleet lock (its process {dead} on {socket.gethostname()} is gone): "
         f"reddie: 'sparkfleet up dcp2' by ops@{socket.gethostname()} pid {dead} (run 20261130-010203-abcd) since "
         "2026-11-30T01:02:03+0000"),
        ("asusi", "warn", f"took over a stale fleet lock (it is {(STALE_AFTER_S + 600) / 3600:.1f} h old (older "
         f"than {STALE_AFTER_S / 3600:.1f} h) and its host cannot be asked): asusi: 'sparkfleet up dcp2' by "
         "ops@laptop-2 pid 4242 (run 20261130-010203-abcd) since 2026-11-30T01:02:03+0000")]
    for node in SPARKS:  # the bytes on disk: no lock, no temp file, no take-over guard left on any node
        assert sorted(p.name for p in lock_file(sim, node).parent.iterdir() if "sparkfleet" in p.name) == []



@pytest.mark.nonroot  # also run as an unprivileged user by .ci/run
@pytest.mark.parametrize("presses", ["once", "again and again"])
def test_ctrl_c_while_up_waits_for_readiness_gives_the_lock_back_and_leaves_nothing_running(sim, tmp_path,
                                                                                           presses) -> None:
    """Ctrl-C as a terminal sends it (SIGINT to the command's process group) while `up` holds every node's
    lock and waits for a head that boots slowly: exit 130, no lock file on any node, nothing it started
    still running (no lane container running, every node's processes as they were before the up). An
    operator who keeps pressing it (every 5 ms until `up` is gone: through the cleanup, the record, and the
    interpreter's shutdown) gets the same: exit 130, no traceback, no signal death."""
    sim.fault("reddie", "slow-boot", factor=100)  # the head boots 100 times longer: up still waits when Ctrl-C comes
    before = node_processes(sim)
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
        while not (all((holder(sim, n) or {}).get("pid") == up.pid for n in SPARKS)
                   and any(e["event"] == "step" and e["step"] == "wait_ready" and e["status"] == "start"
                           for e in events())):
            assert up.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        assert {n: [c["State"]["Status"] for c in cs] for n, cs in lane_containers(sim, "dcp2").items()} == {
            n: ["running"] for n in SPARKS}  # what this up started, before the Ctrl-C
        os.killpg(up.pid, signal.SIGINT)
        if presses == "again and again":
            deadline = time.monotonic() + 120
            while up.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(ProcessLookupError):  # gone (a zombie still takes a signal)
                    os.killpg(up.pid, signal.SIGINT)
                time.sleep(0.005)
        code = up.wait(timeout=120)
        assert code == 130, (code, log.read_text()[-2000:])  # the code too: a signal death reads negative
        assert "Traceback" not in log.read_text() and "Exception ignored" not in log.read_text(), log.read_text()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    res = next(e for e in events() if e["event"] == "result")
    assert (res["outcome"], res["reason"]) == ("interrupted",
                                               "interrupted by the user; every rank of this launch was stopped")
    for node in SPARKS:  # the bytes on disk: the lock given back on every node, nothing of it left
        assert sorted(p.name for p in lock_file(sim, node).parent.iterdir() if "sparkfleet" in p.name) == []
    states = {n: [c["State"]["Status"] for c in cs] for n, cs in lane_containers(sim, "dcp2").items()}
    assert states == {n: ["exited"] for n in SPARKS}
    assert node_processes(sim) == before  # no engine, docker call or helper of this up left on any node


def node_processes(sim) -> dict[str, set[str]]:
    """Every process each node runs (pid and command line, in the node's own pid namespace), but the
    command that lists them."""
    from sparkfleet.fleet.connect import transport_for

    nodes = [sim.inventory().nodes[n] for n in SPARKS]
    transport = transport_for(nodes)
    try:
        res = transport.run(nodes, "ps -eo pid=,ppid=,args= | awk -v me=$$ '$1 != me && $2 != me'")
    finally:
        transport.close()
    assert all(r.ok for r in res.values()), res
    return {n: {" ".join(line.split()[:1] + line.split()[2:]) for line in r.stdout.splitlines()}
            for n, r in res.items()}
