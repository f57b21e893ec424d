"""watch's pure core (probe judging, rank states, failure decision, memory guard, budget, unit) and its
bad-input refusals through the command a user runs (no lab: nothing may start)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkfleet.checks.seeds import EARLYOOM_MARGIN_BYTES, GB
from sparkfleet.cli.main import main
from sparkfleet.fleet.nodefacts import Container, Docker, EarlyOom, MemInfo, NodeFacts
from sparkfleet.fleet.transport import Result
from sparkfleet.gates.client import Reply
from sparkfleet.placement import place
from sparkfleet.runner.events import Events
from sparkfleet.runner.summaries import RunSummary
from sparkfleet.watch import liveness as pr
from sparkfleet.watch import unit
from sparkfleet.watch.policy import Budget, Settings, Tracker, foreign_ranks, memory_unread, operator_run
from tests.conftest import REPO

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

GiB = 2**30


def facts(node: str, containers: list[Container], avail: int = 120 * GiB, sigterm: int | None = 2 * GiB,
          docker_ok: bool = True) -> NodeFacts:
    return NodeFacts(node=node, hostname=node, collected_at=0.0, helper_version="t",
                     meminfo=MemInfo(mem_total_bytes=128 * GiB, mem_available_bytes=avail),
                     earlyoom=EarlyOom(running=sigterm is not None, sigterm_threshold_bytes=sigterm),
                     docker=Docker(available=docker_ok, error=None if docker_ok else "Cannot connect to the daemon",
                                   containers=containers))


def ctr(lane: str, rank: int, state: str = "running", run: str = "r1", name: str | None = None) -> Container:
    return Container(id=f"id{rank}{state}", name=name or f"sf-{lane}-r{rank}", image="img", state=state,
                     labels={"sparkfleet.profile": lane, "sparkfleet.rank": str(rank), "sparkfleet.run": run})


@pytest.fixture
def lane(repo_spec):
    loaded = repo_spec.profile("spark-vllm")  # expect.mem_available_floor_gb {head: 5}
    ranks = place(loaded, repo_spec.inventory("lab"))
    return loaded.profile, ranks


def test_probe_body_is_deterministic_bounded_and_thinking_off() -> None:
    body = pr.request_body("m")
    assert body == {"model": "m", "messages": [{"role": "user", "content": pr.PROMPT}], "max_tokens": pr.MAX_TOKENS,
                    "temperature": 0, "chat_template_kwargs": {"thinking": False}}


@pytest.mark.parametrize("text, finish, ok, why", [
    ("1, 2, 3, 4, 5", "stop", True, "answered 1..5"),
    ("Sure: 1, 2, 3, 4, 5", "stop", True, "answered 1..5"),
    ("1, 2, 4, 5", "stop", False, "missing 3"),
    ("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", "length", False, "one repeated token"),
])
def test_probe_judges_the_answer(text: str, finish: str, ok: bool, why: str) -> None:
    got_ok, got_why = pr.judge(Reply(content=text, finish_reason=finish))
    assert got_ok is ok and why in got_why


def test_rank_states_by_label_only(lane) -> None:
    profile, ranks = lane
    head, w1 = ranks[0].node.name, ranks[1].node.name
    f = {head: facts(head, [ctr(profile.name, 0), ctr("other", 0, name=f"sf-{profile.name}-r0-lookalike")]),
         w1: facts(w1, [ctr(profile.name, 1, "exited"), Container(id="x", name=f"sf-{profile.name}-r1", image="i",
                                                                  state="running", labels={})])}
    f[ranks[2].node.name] = Result(ranks[2].node.name, False, error="unreachable", message="no route")
    f[ranks[3].node.name] = facts(ranks[3].node.name, [], docker_ok=False)
    states = pr.rank_states(f, ranks, profile)
    assert [(s.rank, s.state) for s in states] == [(0, "running"), (1, "exited"), (2, "unknown"), (3, "unknown")]
    assert states[0].run_id == "r1" and states[2].error == "no route"
    assert states[3].error == "Cannot connect to the daemon"
    # an unlabelled container with the lane's name is not the lane's; with no labelled one the rank vanished
    f[w1] = facts(w1, [Container(id="x", name=f"sf-{profile.name}-r1", image="i", state="running", labels={})])
    assert pr.rank_states(f, ranks, profile)[1].state == "vanished"


def test_memory_guard_is_the_floor_or_earlyoom_line_whichever_is_higher(lane) -> None:
    profile, ranks = lane
    head = ranks[0].node.name
    guard, why = pr.mem_guard(profile, ranks[0], facts(head, [], sigterm=1 * GB))
    assert guard == 5 * GB and why == "expect.mem_available_floor_gb.head 5 GB"  # 1 GB + margin < 5 GB
    guard, why = pr.mem_guard(profile, ranks[0], facts(head, [], sigterm=6 * GB))
    assert guard == 6 * GB + EARLYOOM_MARGIN_BYTES and why.startswith("earlyoom SIGTERM line 6.0 GB")
    assert pr.mem_guard(profile, ranks[1], facts(ranks[1].node.name, [], sigterm=None)) == (
        None, "no floor and no earlyoom line")


def _probe(at: float, ok: bool = True, states: tuple[str, ...] = ("running",) * 4,
           mem: int | None = None, guard: int | None = None, runs: tuple[str, ...] = ("r1",) * 4) -> pr.Probe:
    ranks = tuple(pr.RankState(i, f"n{i}", s, run_id=runs[i], mem_available=mem if i == 0 else None,
                               mem_guard=guard if i == 0 else None, guard_why="floor")
                  for i, s in enumerate(states))
    return pr.Probe(at, ok, "answered 1..5" if ok else "no answer within 2 s", 0.1 if ok else None, 200, "", ranks)


def test_k_consecutive_failed_probes_make_a_failure_an_ok_probe_resets() -> None:
    t = Tracker(Settings(failures=3))
    assert [t.observe(_probe(i, ok)).action for i, ok in enumerate([False, False, True, False, False])] == [
        "suspect", "suspect", "ok", "suspect", "suspect"]
    v = t.observe(_probe(9, False))
    assert (v.action, v.reason) == ("restart", "probe-failed")
    assert v.why == "3 failed probe(s) in a row (--failures 3): no answer within 2 s"


@pytest.mark.parametrize("state, reason", [("exited", "rank-exited"), ("dead", "rank-exited"),
                                           ("vanished", "rank-vanished")])
def test_an_exited_or_vanished_rank_fails_at_once_even_while_answering(state: str, reason: str) -> None:
    v = Tracker(Settings(failures=5)).observe(_probe(0, True, ("running", "running", state, "running")))
    assert (v.action, v.reason, v.node) == ("restart", reason, "n2")


def test_an_unreachable_node_alone_is_not_a_failure() -> None:
    assert Tracker(Settings()).observe(_probe(0, True, ("running", "unknown", "running", "running"))).action == "ok"


def test_memory_guard_waits_out_the_grace_period_and_forgets_a_recovery() -> None:
    t = Tracker(Settings(memory_grace_s=10))
    low, line = 3 * GB, 5 * GB
    assert t.observe(_probe(100, mem=low, guard=line)).action == "ok"
    assert t.observe(_probe(105, mem=low, guard=line)).action == "ok"
    assert t.observe(_probe(108, mem=6 * GB, guard=line)).action == "ok"  # recovered: the clock restarts
    assert t.observe(_probe(112, mem=low, guard=line)).action == "ok"
    v = t.observe(_probe(122, mem=low, guard=line))
    assert (v.action, v.reason, v.node) == ("memory-stop", "memory", "n0")
    assert v.why == "MemAvailable on n0 (rank 0) 3.0 GB has been below 5.0 GB (floor) for 10 s (--memory-grace 10)"


def test_memory_guard_says_which_node_it_cannot_judge(lane) -> None:
    """Issue 39: a node whose MemAvailable is missing was passed over as if it had memory to spare. Each such
    node is named with why: the facts' own error, or the node's when it did not answer."""
    profile, ranks = lane
    names = [r.node.name for r in ranks]
    f: dict = {n: facts(n, [ctr(profile.name, i)]) for i, n in enumerate(names)}
    f[names[1]] = f[names[1]].model_copy(update={"meminfo": None, "errors": ["meminfo: no MemAvailable line"]})
    f[names[2]] = Result(names[2], False, error="unreachable", message="no route")
    states = pr.rank_states(f, ranks, profile)
    assert [s.mem_error for s in states] == [None, "meminfo: no MemAvailable line", None, None]
    got = memory_unread(pr.Probe(0, True, "answered 1..5", 0.1, 200, "", tuple(states)))
    assert got == {names[1]: f"memory guard: no MemAvailable reading from {names[1]} (rank 1): meminfo: no "
                             "MemAvailable line; its memory is not judged",
                   names[2]: f"memory guard: no MemAvailable reading from {names[2]} (rank 2): no route; its memory "
                             "is not judged"}


class _Heard(Events):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def emit(self, event: str, **data) -> None:
        self.seen.append((event, data.get("text", "")))


def test_watch_says_an_unread_memory_once_and_keeps_it_in_its_status_and_records(repo_spec, tmp_path) -> None:
    from sparkfleet.runner.record import Record, read_record
    from sparkfleet.watch import status as st
    from sparkfleet.watch.supervisor import Watcher

    events = _Heard()
    w = Watcher(repo_spec, repo_spec.profile("dcp2"), repo_spec.inventory("lab"), Settings(), events,
                tmp_path / "state")
    line = "memory guard: no MemAvailable reading from n1 (rank 1): meminfo: no MemAvailable line; its memory is not judged"
    unread = pr.Probe(0, True, "answered 1..5", 0.1, 200, "", (
        pr.RankState(0, "n0", "running", mem_available=120 * GiB, mem_guard=5 * GB),
        pr.RankState(1, "n1", "running", mem_error="meminfo: no MemAvailable line")))
    w.note_memory_unread(unread)
    w.note_memory_unread(unread)  # the next probe the same: said once
    assert [e for e in events.seen if e[0] != "watch.probe"] == [("watch.not-judged", line)]
    w.set_state("watching")
    assert st.read_all(tmp_path / "state", "lab")[0].not_judged == [line]
    rec = Record("20261205-001500-dddddd", "watch", "dcp2", "lab", "sparkfleet watch --profile dcp2")
    w.write(rec, "ok")
    doc = json.loads((tmp_path / "state" / "runs" / f"{rec.run_id}.json").read_text())
    assert read_record(doc).data.not_judged == [line]
    read = pr.Probe(1, True, "answered 1..5", 0.1, 200, "", tuple(
        pr.RankState(i, f"n{i}", "running", mem_available=120 * GiB, mem_guard=5 * GB) for i in (0, 1)))
    w.note_memory_unread(read)
    assert events.seen[-1] == ("watch.judged-again", "memory guard: MemAvailable is read again from n1")
    assert w.not_judged() == []


def test_budget_n_per_window_with_growing_backoff() -> None:
    b = Budget(max_restarts=3, window_s=100, backoff_s=5)
    assert (b.left(0), b.delay(0)) == (3, 0.0)
    b.spend(0, "rank-exited")
    assert (b.left(1), b.delay(1)) == (2, 5.0)
    b.spend(10, "probe-failed")
    assert (b.left(11), b.delay(11)) == (1, 10.0)
    b.spend(30, "rank-exited")
    assert b.left(31) == 0
    assert b.why_spent(31) == "restart budget spent: 3 restart(s) in the last 100 s (--max-restarts 3 per --window 100)"
    assert b.left(101) == 1 and b.delay(101) == 10.0  # the first restart left the window
    assert dict(b.by_reason) == {"rank-exited": 2, "probe-failed": 1}


@pytest.mark.parametrize("settings, words", [
    (Settings(interval_s=5, probe_timeout_s=10), "--interval 5 is below the probe's timeout (10 s)"),
    (Settings(max_restarts=0), "--max-restarts 0: a budget of 0 restarts"),
    (Settings(failures=0), "--failures 0"),
    (Settings(window_s=0), "--window 0"),
])
def test_settings_refused(settings: Settings, words: str) -> None:
    assert any(words in p for p in settings.problems())


def test_settings_defaults_are_usable() -> None:
    assert Settings().problems() == []


def _run(run_id: str, playbook: str, started: float, profile: str = "dcp2") -> RunSummary:
    return RunSummary(run_id, playbook, profile, "sim", "ok", started, started + 1, 1.0)


def test_operator_runs_and_foreign_containers() -> None:
    runs = [_run("old", "up", 5), _run("w1", "up", 20), _run("x", "down", 30, "dcp1"), _run("op", "down", 40)]
    assert operator_run(runs, {"w1"}, 10, "dcp2").run_id == "op"
    assert operator_run(runs[:3], {"w1"}, 10, "dcp2") is None  # before watch started, watch's own, other lane
    assert foreign_ranks(_probe(0, runs=("r1", "r1", "r2", "r1")), {"r1"}) == ["rank 2 on n2 runs r2"]


def test_unit_quotes_for_systemd_and_verifies(tmp_path: Path) -> None:
    assert unit.word("/opt/my dir/sparkfleet") == '"/opt/my dir/sparkfleet"'
    assert unit.word("50%") == '"50%%"' and unit.word("$HOME") == '"$$HOME"'
    text = unit.render(REPO / "templates", "dcp2", ["/bin/true", "watch", "--profile", "dcp2", "--root", "/a b"],
                       {"SPARKFLEET_STATE": "/var/lib/sparkfleet"}, 960, REPO / "docs" / "watch.md", "LANE_KEY")
    lines = text.splitlines()
    assert 'ExecStart=/bin/true watch --profile dcp2 --root "/a b"' in lines
    assert "Restart=on-failure" in lines and "RestartPreventExitStatus=1 2 75 130 143" in lines
    assert "TimeoutStopSec=960" in lines and "KillMode=mixed" in lines
    assert 'Environment="SPARKFLEET_STATE=/var/lib/sparkfleet"' in lines
    assert any("$LANE_KEY" in x and x.startswith("#") for x in lines)
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    path = tmp_path / unit.unit_name("dcp2")
    path.write_text(text)
    res = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "sparkfleet-watch-dcp2" not in res.stderr  # no complaint about this unit


def test_watch_unit_command_prints_a_unit_that_runs_this_watch(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    monkeypatch.setattr("sys.argv", ["sparkfleet", "watch", "--profile", "dcp2", "--interval", "20", "--unit"])
    assert main(["watch", "--profile", "dcp2", "--interval", "20", "--unit"]) == 0
    text = capsys.readouterr().out
    exec_line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    assert exec_line.endswith(f"watch --profile dcp2 --interval 20 --inventory {REPO}/inventories/lab.yaml --root {REPO}")
    assert "--unit" not in exec_line
    assert f'Environment="SPARKFLEET_STATE={tmp_path / "state"}"' in text
    assert not (tmp_path / "state").exists()  # printing a unit starts nothing


@pytest.mark.parametrize("argv, words", [
    (["--profile", "nvfp4"], "lane 'nvfp4' is refused by its rules; nothing was started"),
    (["--restore", "nope"], "no restore point named 'nope'"),
    (["--profile", "dcp2", "--interval", "5", "--probe-timeout", "10"], "--interval 5 is below the probe's timeout"),
    (["--profile", "dcp2", "--max-restarts", "0"], "--max-restarts 0"),
    (["--profile", "no-such-lane"], "no-such-lane"),
    (["--profile", "dcp2", "--gates", "count100,bogus"], "unknown gate(s) bogus"),
    (["--profile", "dcp2", "--clock-probe-seconds", "0"], "--clock-probe-seconds 0: expected seconds above 0"),
])
def test_bad_input_exits_2_and_starts_nothing(tmp_path, monkeypatch, capsys, argv: list[str], words: str) -> None:
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    assert main(["watch", *argv]) == 2
    captured = capsys.readouterr()
    assert words in " ".join(captured.err.split()) and "Traceback" not in captured.err
    assert not (tmp_path / "state" / "watch").exists() and not (tmp_path / "state" / "runs").exists()


def test_the_exporter_turns_a_watch_status_file_into_series(tmp_path, repo_spec) -> None:
    from sparkfleet.metrics.collector import FleetView, snapshot
    from sparkfleet.watch import status as st

    inv = repo_spec.inventory("lab")
    s = st.Status("dcp2", "lab", state="backoff", updated=123.0, budget_left=1, restarts={"rank-exited": 2},
                  probe_ok=False, probe_latency_s=None, interval_s=30, max_restarts=3, window_s=1800)
    st.write(tmp_path, s)
    st.write(tmp_path, st.Status("other-inventory-lane", "elsewhere"))
    (tmp_path / "watch" / "broken.json").write_text("{not json")
    watches = st.read_all(tmp_path, "lab")
    assert watches == [s]
    text = snapshot(FleetView(inv, {}, polls=1, watches=watches)).text.decode()
    lines = set(text.splitlines())
    for state in st.STATES:
        assert f'sparkfleet_watch_state{{profile="dcp2",state="{state}"}} {1.0 if state == "backoff" else 0.0}' in lines
    assert 'sparkfleet_watch_restarts_total{profile="dcp2",reason="rank-exited"} 2.0' in lines
    assert 'sparkfleet_watch_restarts_total{profile="dcp2",reason="memory"} 0.0' in lines
    assert 'sparkfleet_watch_probe_ok{profile="dcp2"} 0.0' in lines
    assert 'sparkfleet_watch_restart_budget_left{profile="dcp2"} 1.0' in lines
    assert 'sparkfleet_watch_last_update_timestamp_seconds{profile="dcp2"} 123.0' in lines
    assert not any(x.startswith("sparkfleet_watch_probe_latency_seconds{") for x in lines)  # no answer: no latency
    assert "other-inventory-lane" not in text


def test_human_lines_fit_80_columns_in_a_log(capsys) -> None:
    from sparkfleet.cli.watch import WatchHumanEvents

    ev = WatchHumanEvents()
    ev.emit("watch.failure", text="memory: MemAvailable on reddie (rank 0) 3.2 GB has been below 5.2 GB (earlyoom "
            "SIGTERM line 2.6 GB + 2.6 GB margin) for 2 s (--memory-grace 1)")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 1 and all(len(x) <= 80 for x in lines)
    assert lines[1].startswith(" " * 9) and " ".join(x.strip() for x in lines).endswith("(--memory-grace 1)")


def test_look_reads_the_node_lock_and_the_lanes_containers_in_one_command(tmp_path: Path) -> None:
    from sparkfleet.fleet.ops import Look, Seen

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/argv"\necho c1\necho c2\n')
    (bin_dir / "docker").chmod(0o755)
    lock = tmp_path / "sparkfleet.lock"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}

    op = Look("dcp2", str(lock))
    assert not op.changes

    def look() -> Seen:
        p = subprocess.run(["sh", "-c", op.command()], capture_output=True, text=True, env=env)
        return op.parse(Result("n1", p.returncode == 0, p.stdout, p.stderr, p.returncode))

    assert look() == Seen("", ["c1", "c2"])  # no lock: free
    assert (bin_dir / "argv").read_text().split() == ["ps", "-a", "-q", "--no-trunc", "--filter",
                                                      "label=sparkfleet.profile=dcp2"]
    lock.write_text('{"lane": "dcp2", "pid": 7, "run_id": "r9"}\n')
    assert look() == Seen('{"lane": "dcp2", "pid": 7, "run_id": "r9"}', ["c1", "c2"])
    assert op.parse(Result("n1", False, "", "", None, "reach", "n1 is unreachable")) == \
        Seen(error="n1 is unreachable")
