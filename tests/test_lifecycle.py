"""`up`, `down`, `status`, `restore` end to end on the simulated lab (real processes, real HTTP).

THE LAB IS A SIMULATION: the sim engine stands in for vLLM (see sparkfleet/simengine); everything else
— the runner, transports, facts helper, checks, docker CLI calls, log following — is the real code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkfleet.cli.main import main
from sparkfleet.runner.record import REDACTED, Record
from sparkfleet.sim import lab
from tests.cli_run import (
    container_log,
    container_write,
    heal_and_down,
    lane_containers,
    node_containers,
    rank_has_lines,
    record_of,
    result,
    run,
    up_acting_once,
)
from tests.conftest import REPO, engram_copies, tensorfold_built

FAST = ["--gates", "models", "--poll", "0.2", "--no-probe"]  # the probe has tests of its own


@pytest.fixture(autouse=True)
def clean(sim, capsys):
    yield
    heal_and_down(sim, capsys)  # tf1017-rail2: its one test downs it






@pytest.mark.nonroot  # also run as an unprivileged user by .ci/run
def test_up_serves_then_status_then_down_leaves_nothing(sim, capsys, monkeypatch) -> None:
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    assert code == 0, result(events)
    steps = [(e["step"], e["status"]) for e in events if e["event"] == "step" and e["status"] != "start"]
    assert [s for s, _ in steps] == ["stop", "drop_caches", "facts", "patches", "engine_build", "check", "probe", "fabric_probe",
                                     "engram", "rail2_up", "launch:workers", "launch:head", "wait_ready", "expect",
                                     "gates", "record"]
    assert dict(steps)["wait_ready"] == "ok" and dict(steps)["gates"] == "ok"
    rec = record_of(events)
    assert rec["outcome"] == "ok"
    # workers were started before the head, each container labelled with profile, rank and run id
    assert [(x["node"], x["rank"]) for x in rec["data"]["launches"]] == [
        ("asusi", 1), ("bluey", 2), ("spark4", 3), ("reddie", 0)]
    assert rec["data"]["log_facts"]["0"]["kv_tokens"] == 1888800
    running = lane_containers(sim, "dcp2")
    for node, rank in (("reddie", 0), ("asusi", 1), ("bluey", 2), ("spark4", 3)):
        (c,) = running[node]
        assert c["State"]["Status"] == "running"
        assert c["Config"]["Labels"] == {"sparkfleet.profile": "dcp2", "sparkfleet.rank": str(rank),
                                         "sparkfleet.run": rec["run_id"]}
    for node in ("reddie", "asusi", "bluey", "spark4"):  # caches dropped on every node before the launch
        assert sim.state_dir(node).joinpath("sysctl.log").read_text().split()[-1] == "vm.drop_caches=3"

    assert main(["status", "--inventory", "sim", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert sorted((c["node"], c["rank"], c["state"]) for c in status["containers"]) == [
        ("asusi", 1, "running"), ("bluey", 2, "running"), ("reddie", 0, "running"), ("spark4", 3, "running")]
    assert status["lanes"]["dcp2"]["health"] == 200 and status["lanes"]["dcp2"]["models"] == ["deepseek-v4.1-flash"]

    # `logs` splits the head's log as the reader does, on `\n` only: tqdm's CUDA-graph bar, redrawn after `\r`,
    # is one line (str.splitlines() made one per redraw), and people see what a terminal shows of it
    assert main(["logs", "--profile", "dcp2", "--inventory", "sim", "--rank", "0", "--tail", "0", "--json"]) == 0
    lines = [json.loads(x)["line"] for x in capsys.readouterr().out.splitlines()]
    (head,) = running["reddie"]
    written = container_log(sim, "reddie", head["Id"]).split("\n")
    assert lines == written[:len(lines)] and len(lines) >= len(written) - 1  # the head may log on meanwhile
    (bar,) = [x for x in lines if "Capturing CUDA graphs (decode, FULL)" in x]
    assert bar.count("\r") >= 2
    assert main(["logs", "--profile", "dcp2", "--inventory", "sim", "--rank", "0", "--tail", "0"]) == 0
    (shown,) = [x for x in capsys.readouterr().out.splitlines() if "Capturing CUDA graphs (decode, FULL)" in x]
    assert re.fullmatch(r"reddie/r0 \| Capturing CUDA graphs \(decode, FULL\): 100%\|█{10}\| (\d+)/\1 \[.*\]\s*",
                        shown), shown
    # --follow reads as `up` reads: each line once, when complete (a bar still moving waits for its `\n`)
    more = iter(["\rCompiling (sim):  50%", "\rCompiling (sim): 100%\nINFO followed\n"])

    def poll(seconds: float) -> None:  # between two polls the head writes the next piece
        piece = next(more, None)
        if piece is None:
            raise KeyboardInterrupt  # the operator's Ctrl-C
        container_write(sim, "reddie", head["Id"], piece)

    monkeypatch.setattr("sparkfleet.cli.observe.time", SimpleNamespace(sleep=poll))
    assert main(["logs", "--profile", "dcp2", "--inventory", "sim", "--rank", "0", "--tail", "1", "--follow",
                 "--json"]) == 0
    followed = [json.loads(x)["line"] for x in capsys.readouterr().out.splitlines()]
    assert len(followed) == 3 and followed[1:] == ["\rCompiling (sim):  50%\rCompiling (sim): 100%", "INFO followed"]

    code, events = run(capsys, "down", "--profile", "dcp2", "--inventory", "sim")
    assert code == 0
    assert lane_containers(sim, "dcp2") == {"reddie": [], "asusi": [], "bluey": [], "spark4": []}
    assert not node_containers(sim, "reddie") and not node_containers(sim, "asusi")


def test_a_second_up_removes_the_old_lane_first(sim, capsys) -> None:
    code, first = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    assert code == 0, result(first)
    code, second = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    assert code == 0, result(second)
    stop = next(e for e in second if e["event"] == "step" and e["step"] == "stop" and e["status"] == "ok")
    assert stop["summary"] == "removed 4 container(s) on spark4, bluey, asusi, reddie"
    run_id = result(second)["run_id"]
    assert {c["Config"]["Labels"]["sparkfleet.run"] for cs in lane_containers(sim, "dcp2").values() for c in cs} == {run_id}


@pytest.mark.parametrize("fault, node, why, line, exception", [
    # vLLM's own first fatal line (its record header kept, with the time) and the exception it ends with
    ("worker-crash", "bluey", "rank 2 logged a fatal line: ", "[multiproc_executor.py:824] WorkerProc hit an "
     "exception.", " ... OSError: "),
    ("engine-fatal", "asusi", "rank 1 logged a fatal line: ", "[core.py:868] EngineCore encountered a fatal error.",
     " ... RuntimeError: CUDA error: an illegal memory access was encountered"),
    ("missing-patch", "spark4", "rank 3 logged a fatal line: ", "[multiproc_executor.py:751] WorkerProc failed to "
     "start.", " ... ImportError: cannot import name 'EngramDiskReader'"),
])
def test_fatal_boot_fast_fails_and_stops_every_rank(sim, capsys, fault: str, node: str, why: str, line: str,
                                                    exception: str) -> None:
    sim.fault(node, fault)
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    assert code == 1
    res = result(events)
    assert res["outcome"] == "failed" and re.match(rf"wait_ready: {re.escape(why)}ERROR \d\d-\d\d \d\d:\d\d:\d\d "
                                                   rf"{re.escape(line)}{re.escape(exception)}", res["reason"]), res
    assert res["reason"].endswith(f"(on {node}); every rank of this launch was stopped")
    states = {n: [c["State"]["Status"] for c in cs] for n, cs in lane_containers(sim, "dcp2").items()}
    assert states == {"reddie": ["exited"], "asusi": ["exited"], "bluey": ["exited"], "spark4": ["exited"]}
    rec = record_of(events)
    rank = int(why.split()[1])
    assert rec["data"]["last_log_lines"][str(rank)], "the failing rank's last log lines are kept"


def test_a_warning_line_is_not_fatal(sim, capsys) -> None:
    sim.fault("asusi", "engine-warning")
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    assert code == 0, result(events)
    rec = record_of(events)
    assert rec["data"]["log_facts"]["1"]["fatal"] is None
    (c,) = lane_containers(sim, "dcp2")["asusi"]
    log = container_log(sim, "asusi", c["Id"])
    assert any("WARNING" in line and "CUDA error" in line for line in log.splitlines())


def test_kv_below_the_expected_range_fails_expect(sim, capsys) -> None:
    sim.fault("reddie", "kv-low")
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    assert code == 1
    assert result(events)["reason"] == "expect: expectations not met; every rank of this launch was stopped"
    fs = next(e for e in events if e["event"] == "findings" and e["step"] == "expect")["findings"]
    kv = next(f for f in fs if f["check"] == "kv-tokens")
    assert kv["status"] == "fail" and kv["expected"] == "1,888,800"
    assert all(c["State"]["Status"] == "exited" for cs in lane_containers(sim, "dcp2").values() for c in cs)


def test_a_boot_past_its_budget_fails(sim, capsys) -> None:
    sim.fault("reddie", "slow-boot", factor=100)  # far past the budget, whatever the machine's load
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST, "--boot-budget", "3")
    assert code == 1
    assert result(events)["reason"].startswith("wait_ready: not healthy after 3 s (the profile's boot budget)")


def test_a_foreign_container_on_the_port_refuses_before_anything_starts(sim, capsys) -> None:
    sim.fault("reddie", "port-taken", port=8410)
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    assert code == 1
    assert result(events)["reason"].startswith("check: ")
    fs = next(e for e in events if e["event"] == "findings" and e["step"] == "check")["findings"]
    conflict = [f for f in fs if f["status"] == "fail"]
    assert len(conflict) == 1 and conflict[0]["node"] == "reddie" and "foreign-lane-8410" in conflict[0]["message"]
    assert lane_containers(sim, "dcp2") == {"reddie": [], "asusi": [], "bluey": [], "spark4": []}
    assert [c["State"]["Status"] for c in node_containers(sim, "reddie")] == ["running"]  # never touched


def test_an_unreachable_node_stops_the_run_before_launch(sim, capsys) -> None:
    sim.fault("bluey", "unreachable")
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    assert code == 1
    assert result(events)["reason"] == ("stop: no container of this lane on reddie, asusi, spark4; bluey (reach) did "
                                        "not answer: rank 2 may still be running there; once it answers, run "
                                        "`sparkfleet down --profile dcp2 --limit bluey`")
    fs = next(e for e in events if e["event"] == "findings")["findings"]
    assert [(f["node"], f["check"], f["status"]) for f in fs] == [("bluey", "reach", "fail")]


def test_one_run_at_a_time(sim, capsys) -> None:
    lock = Path(os.environ["SPARKFLEET_STATE"]) / "locks" / "sim.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    import socket

    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "user": "ops",
                                "command": "sparkfleet up dcp2", "since": "2026-11-29T02:00:00+0000"}))
    try:
        code = main(["up", "--profile", "dcp2", "--inventory", "sim", *FAST])
        err = capsys.readouterr().err
        assert code == 75  # busy: try again later
        assert "another run holds the fleet lock" in err and f"pid {os.getpid()}" in err and "'sparkfleet up dcp2'" in err
    finally:
        lock.unlink()
    lock.write_text(json.dumps({"pid": 2 ** 22 + 7, "host": socket.gethostname(), "command": "x"}))  # a dead run
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", "--dry-run")
    assert code == 0 and not lock.exists()


def test_restore_after_a_node_went_away(sim, capsys) -> None:
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST, "--save-as", "prod")
    assert code == 0
    point = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "restore/prod.json").read_text())
    assert point["name"] == "prod" and point["record"]["profile"] == "dcp2"
    assert point["record"]["served"]["kv_tokens"] == 1888800
    assert [(x["rank"], x["node"]) for x in point["record"]["data"]["launches"]] == [
        (1, "asusi"), (2, "bluey"), (3, "spark4"), (0, "reddie")]
    assert all(x["image_id"] for x in point["record"]["data"]["launches"])

    sim.fault("bluey", "unreachable")  # a worker powered off by accident
    code, events = run(capsys, "restore", "prod", "--inventory", "sim", *FAST)
    assert code == 1
    fs = next(e for e in events if e["event"] == "findings" and e["step"] == "pins")["findings"]
    assert [f["message"] for f in fs if f["node"] == "bluey"] == ["bluey: did not answer, so no pin can be checked"]
    sim.heal("bluey")
    code, events = run(capsys, "restore", "prod", "--inventory", "sim", *FAST)
    assert code == 0, result(events)
    pins = next(e for e in events if e["event"] == "step" and e["step"] == "pins" and e["status"] != "start")
    assert pins["status"] == "ok" and pins["summary"] == "every pin of 'prod' matches the fleet"
    fs = next(e for e in events if e["event"] == "findings" and e["step"] == "expect")["findings"]
    assert next(f for f in fs if f["check"] == "kv-tokens")["message"] == "KV cache 1,888,800 tokens (recorded 1,888,800)"

    assert main(["restore", "--list", "--json"]) == 0
    assert [p["name"] for p in json.loads(capsys.readouterr().out)] == ["prod"]


def test_restore_without_a_point_uses_the_profile(sim, capsys) -> None:
    code, events = run(capsys, "restore", "dcp2", "--inventory", "sim", *FAST)
    assert code == 0, result(events)
    pins = next(e for e in events if e["event"] == "step" and e["step"] == "pins" and e["status"] != "start")
    assert pins["summary"] == "no recorded restore point: restoring from the profile's own pins"


def test_rail2_aliases_are_added_for_the_lane_and_removed_on_down(sim, capsys, tmp_path) -> None:
    playbook = tmp_path / "rail2.yaml"
    playbook.write_text("name: rail2-only\nsteps:\n  - rail2_up\n  - record\n")

    def aliases(node: str) -> list:
        path = sim.state_dir(node) / "net.json"
        return json.loads(path.read_text())["aliases"] if path.exists() else []

    try:
        code, events = run(capsys, "play", str(playbook), "--profile", "tf1017-rail2", "--inventory", "sim")
        assert code == 0, result(events)
        assert aliases("reddie") == [{"cidr": "192.168.193.11/24", "dev": "enP2p1s0f0np0"}]
        assert aliases("asusi") == [{"cidr": "192.168.193.12/24", "dev": "enP2p1s0f0np0"}]
        assert aliases("bluey") == []  # only the two rail-2 nodes
    finally:  # the down under test, run also when an assertion above failed (it leaves no alias behind)
        code, events = run(capsys, "down", "--profile", "tf1017-rail2", "--inventory", "sim")
    assert code == 0 and aliases("reddie") == [] and aliases("asusi") == []


def test_tensorfold_starts_ranks_3_2_1_then_0(sim, capsys) -> None:
    tensorfold_built()
    capsys.readouterr()
    code, events = run(capsys, "up", "--profile", "tf1017", "--inventory", "sim", "--dry-run")
    assert code == 0
    launches = [e["summary"] for e in events if e["event"] == "step" and e["step"].startswith("launch")
                and e["status"] == "ok"]
    assert launches == ["would start rank 3 on spark4, rank 2 on bluey, rank 1 on asusi", "would start rank 0 on reddie"]


def test_runs_are_recorded_and_secrets_redacted(sim, capsys) -> None:
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    run_id = result(events)["run_id"]
    assert main(["runs", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert run_id in [r["run_id"] for r in runs]
    assert main(["runs", "show", run_id]) == 0
    assert f"run {run_id}: up dcp2 on sim: ok" in capsys.readouterr().out
    rec = Record("r", "up", "p", "i", "c", secret_values={"sk-live-123456"})
    rec.data = {"launches": [{"node": "a", "rank": 0, "env": {"HF_TOKEN": "hf_abc", "MODE": "x"},
                              "argv": ["-e", "VLLM_API_KEY=sk-live-123456"]}],
                "last_log_lines": {"0": ["auth with sk-live-123456"]}}
    d = rec.as_dict()["data"]
    assert d == {"launches": [{"node": "a", "rank": 0, "env": {"HF_TOKEN": REDACTED, "MODE": "x"},
                               "argv": ["-e", f"VLLM_API_KEY={REDACTED}"]}],
                 "last_log_lines": {"0": [f"auth with {REDACTED}"]}}


def test_an_api_key_reaches_the_engine_and_never_a_record(sim, capsys, tmp_path, monkeypatch) -> None:
    ops = tmp_path / "ops"
    for d in ("inventories", "profiles", "templates", "playbooks", "patches"):
        shutil.copytree(REPO / d, ops / d)
    (ops / "profiles/dcp2-auth.yaml").write_text("extends: dcp2\napi_key_env: SF_TEST_API_KEY\n")
    key = "sk-sim-" + os.urandom(8).hex()
    monkeypatch.setenv("SF_TEST_API_KEY", key)
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    own = lab.up("lab", ops_root=str(ops))  # its own lab: it knows the extra profile
    try:
        engram_copies(own)
        code, events = run(capsys, "up", "--profile", "dcp2-auth", "--inventory", "sim", "--root", str(ops),
                           "--gates", "models,auth", "--poll", "0.2", "--no-probe")
        assert code == 0, result(events)
        rec_text = (tmp_path / "state/runs" / f"{result(events)['run_id']}.json").read_text()
        assert key not in rec_text and key not in json.dumps(events)
        argv = json.loads(rec_text)["data"]["launches"][-1]["argv"]
        assert "VLLM_API_KEY" in argv  # passed by name; docker takes the value from the launch's environment
        gates = json.loads(rec_text)["data"]["gates"]["results"]
        assert {g["name"]: g["status"] for g in gates}["auth"] == "pass"
        main(["down", "--profile", "dcp2-auth", "--inventory", "sim", "--root", str(ops), "--json"])
    finally:
        own.down()


def test_a_rank_that_vanishes_during_boot_fails_up_within_one_poll(sim, capsys) -> None:
    """Its container is removed behind sparkfleet's back while the lane boots: `up` names that rank (not the
    head that would notice a missing peer later), stops every other rank and keeps the rank's last lines."""
    from sparkfleet.fleet.connect import transport_for

    sim.fault("reddie", "slow-boot", factor=100)  # the head boots long enough that nothing is ready before the vanish
    bluey = sim.inventory().nodes["bluey"]
    transport = transport_for([bluey])

    def remove(_) -> None:
        res = transport.run([bluey], "docker rm -f sf-dcp2-r2")["bluey"]
        assert res.ok, res

    try:
        code, events, removed_at = up_acting_once(["--profile", "dcp2", "--inventory", "sim", *FAST],
                                                  when=rank_has_lines(2), act=remove, timeout_s=60)
    finally:
        transport.close()
    assert code == 1
    assert removed_at is not None
    res = result(events)
    assert res["reason"] == ("wait_ready: rank 2 on bluey vanished (docker no longer knows its container); "
                             "every rank of this launch was stopped")
    states = {n: [c["State"]["Status"] for c in cs] for n, cs in lane_containers(sim, "dcp2").items()}
    assert states == {"reddie": ["exited"], "asusi": ["exited"], "bluey": [], "spark4": ["exited"]}
    rec = record_of(events)
    watch = rec["data"]["wait_ready"]
    assert (watch["failed_rank"], watch["failed_node"]) == (2, "bluey")
    # caught by the first poll that began after the removal (or by the one running across it)
    assert len([t for t in watch["poll_started"] if t > removed_at]) <= 1
    assert rec["data"]["last_log_lines"]["2"], "the vanished rank's last log lines are kept"


@pytest.mark.nonroot  # also run as an unprivileged user by .ci/run
def test_docker_down_on_a_node_is_not_reported_as_unreachable(sim, capsys) -> None:
    sim.fault("spark4", "docker-down")
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    assert code == 1
    assert result(events)["reason"] == ("stop: no container of this lane on reddie, asusi, bluey; spark4 (docker-down) "
                                        "did not answer: rank 3 may still be running there; once it answers, run "
                                        "`sparkfleet down --profile dcp2 --limit spark4`")
    fs = next(e for e in events if e["event"] == "findings")["findings"]
    assert [(f["node"], f["check"], f["status"], f["remedy"]) for f in fs] == [
        ("spark4", "docker-down", "fail", "start docker on the node (sudo systemctl start docker), then run again; "
         "rank 3 of dcp2 may still run there (holding its GPU memory and port): once spark4 answers, run "
         "`sparkfleet down --profile dcp2 --limit spark4`")]
    assert fs[0]["message"] == ("the docker daemon is not running: Cannot connect to the Docker daemon at "
                                "unix:///var/run/docker.sock. Is the docker daemon running?")
    sim.heal("spark4")  # its docker answers again (on a real daemon, nothing can list spark4's containers before)
    assert lane_containers(sim, "dcp2") == {"reddie": [], "asusi": [], "bluey": [], "spark4": []}  # nothing was started


def test_a_latched_clock_under_load_stops_up_before_launch_and_the_exporter_says_not_passed(sim, capsys) -> None:
    sim.fault("asusi", "clock-latch")  # only under load: the idle snapshot looks like every other idle GB10
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models", "--poll", "0.2",
                       "--probe-seconds", "1")
    assert code == 1
    assert result(events)["reason"] == "probe: 1 rank(s) failed the clock probe: nothing was started"
    fs = next(e for e in events if e["event"] == "findings" and e["step"] == "probe")["findings"]
    assert sorted((f["node"], f["check"], f["status"]) for f in fs if f["check"] == "clock") == [
        ("asusi", "clock", "fail"), ("bluey", "clock", "ok"), ("reddie", "clock", "ok"), ("spark4", "clock", "ok")]
    latched = next(f for f in fs if f["node"] == "asusi" and f["check"] == "clock")
    assert latched["message"].startswith("GPU clock latched: 780 MHz under load with no throttle reason")
    assert lane_containers(sim, "dcp2") == {"reddie": [], "asusi": [], "bluey": [], "spark4": []}  # nothing was started
    rec = record_of(events)
    assert [s["step"] for s in rec["steps"]][-1] == "probe"
    assert rec["data"]["probe"]["asusi"]["clock"]["state"] == "latched"
    assert main(["exporter", "--inventory", "sim", "--profile", "dcp2", "--once"]) == 0
    text = capsys.readouterr().out
    assert 'sparkfleet_check_passed{check="clock",node="asusi",profile="dcp2"} 0.0' in text
    assert 'sparkfleet_check_passed{check="clock",node="bluey",profile="dcp2"} 1.0' in text


def test_no_probe_is_recorded_and_the_clock_is_unknown_not_ok(sim, capsys) -> None:
    code, events = run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST)
    assert code == 0, result(events)
    probe = next(e for e in events if e["event"] == "step" and e["step"] == "probe" and e["status"] != "start")
    assert (probe["status"], probe["summary"]) == (
        "skip", "clock probe skipped (--no-probe): clock latch and slow state not judged")
    rec = record_of(events)
    assert rec["data"]["probe"] == {"skipped": "--no-probe"}
    clocks = {f["node"]: f["status"] for f in rec["data"]["findings"] if f["check"] == "clock"}
    assert clocks == {"reddie": "unknown", "asusi": "unknown", "bluey": "unknown", "spark4": "unknown"}
    assert main(["exporter", "--inventory", "sim", "--profile", "dcp2", "--once"]) == 0
    text = capsys.readouterr().out
    assert 'sparkfleet_check_passed{check="clock",node="asusi",profile="dcp2"} 0.0' in text


def test_no_probe_is_refused_when_the_profile_requires_the_probe(sim, capsys, tmp_path) -> None:
    ops = tmp_path / "ops"
    for d in ("inventories", "profiles", "templates", "playbooks", "patches"):
        shutil.copytree(REPO / d, ops / d)
    (ops / "profiles/dcp2-probed.yaml").write_text("extends: dcp2\nprobe: required\n")
    code = main(["up", "--profile", "dcp2-probed", "--inventory", "sim", "--root", str(ops), *FAST])
    err = capsys.readouterr().err
    assert code == 2
    assert "profiles/dcp2-probed.yaml:2: probe: required (profile dcp2-probed): --no-probe is refused" in err
    assert lane_containers(sim, "dcp2-probed") == {"reddie": [], "asusi": [], "bluey": [], "spark4": []}
