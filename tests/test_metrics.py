"""The exporter's parts without a lab: the collector over hand-built facts and run records, the node-side
journal/manifest command (run for real against a scratch sandbox), the poller with misbehaving transports,
the dashboards' structure and names, the provisioning files (promtool), and the CLI's input errors."""

from __future__ import annotations

import datetime as dt
import json
import math
import socket
import stat
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sparkfleet.cli.main import main
from sparkfleet.engines.llamacpp import METRICS as LLAMA
from sparkfleet.engines.vllm import METRICS as VLLM
from sparkfleet.fleet.local import LocalTransport
from sparkfleet.fleet.nodefacts import Container, Docker, EarlyOom, Gpu, MemInfo, NodeFacts
from sparkfleet.fleet.ops.docker import docker_time
from sparkfleet.fleet.transport import Result, RunEachByRun
from sparkfleet.metrics import dashboards as dash
from sparkfleet.metrics import extras
from sparkfleet.metrics import names as n
from sparkfleet.metrics.collector import FleetCollector, FleetView, NodeState, snapshot
from sparkfleet.metrics.poller import Poller, load_lane
from sparkfleet.metrics.provisioning import EngineTarget, scrape_config, write_all
from sparkfleet.opsdir import Spec
from sparkfleet.runner.record import Record
from sparkfleet.runner.summaries import RunIndex
from sparkfleet.simengine.metrics import COUNTERS, GAUGES, SPEC_COUNTERS, Metrics
from tests.conftest import REPO
from tests.noderoot import write_wrapper
from tests.prom import promtool

GIB = 2**30
T0 = 1_796_000_000.0
REV = "df42c109f1defefcbfcedbe7d905718a12266e40"


@pytest.fixture(scope="module")
def spec() -> Spec:
    return Spec(REPO)


@pytest.fixture(scope="module")
def inv(spec: Spec):
    return spec.inventory("lab")


def facts(node: str, *, sm: int | None = 208, top: int | None = 3003, reasons: int | None = 0x1,
          avail_gib: float = 117.0, containers: list[Container] | None = None, at: float = T0) -> NodeFacts:
    return NodeFacts(node=node, hostname=node, collected_at=at, uptime_s=3600.0, helper_version="1",
                     meminfo=MemInfo(mem_total_bytes=121 * GIB, mem_available_bytes=int(avail_gib * GIB)),
                     gpus=[Gpu(index=0, name="NVIDIA GB10", sm_clock_mhz=sm, max_sm_clock_mhz=top,
                               clock_event_reasons=reasons, power_draw_w=12.5)],
                     earlyoom=EarlyOom(running=True, mem_term_percent=2.0, sigterm_threshold_bytes=int(2.42 * GIB)),
                     docker=Docker(available=True, containers=containers or []))


STARTED = dt.datetime.fromtimestamp(T0 - 3600.5, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # an hour before T0


def container(profile: str, rank: int, *, state: str = "running", started: str = STARTED,
              image: str = "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2") -> Container:
    return Container(id=f"id{rank}", name=f"sf-{profile}-r{rank}", image=image, state=state, started_at=started,
                     labels={"sparkfleet.profile": profile, "sparkfleet.rank": str(rank), "sparkfleet.run": "r1"})


def scrape(view: FleetView, now: float = T0) -> dict[tuple[str, frozenset], float]:
    """The exposition of `view`, parsed back: (sample name, labels) -> value."""
    snap = snapshot(view)
    reg = CollectorRegistry()
    reg.register(FleetCollector(lambda: snap, lambda: now))
    text = generate_latest(reg).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(got: dict, name: str, **labels: str) -> float | None:
    return got.get((name, frozenset(labels.items())))


def names_with(got: dict, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (nm, labels) in got if nm == name]


def up_view(inv, per_node: dict[str, NodeFacts], **kw) -> FleetView:
    states = {}
    for name in inv.nodes:
        st = NodeState(name)
        if name in per_node:
            st.up, st.facts, st.facts_at = True, per_node[name], T0
        states[name] = st
    return FleetView(inv, states, **{"polls": 1, **kw})


# -- GPU clock: the latch flag is judged under load only, with the clock check's rule ----------------------

@pytest.mark.parametrize("sm, reasons, under_load, latched", [
    (208, 0x1, 0.0, 0.0),      # idle (GpuIdle): a low clock is normal, never a latch
    (780, 0x1, 0.0, 0.0),      # in the band but idle: still not judged
    (780, 0x0, 1.0, 1.0),      # under load inside 630-950 MHz with no reason: latched (FM-09)
    (500, 0x0, 1.0, 1.0),      # under load below half of the 3003 MHz max: latched
    (2800, 0x0, 1.0, 0.0),     # under load, fast
    (780, 0x4, 1.0, 0.0),      # low but explained by SwPowerCap: throttled, not latched
])
def test_latch_flag_is_the_clock_checks_verdict_on_the_sample(inv, sm, reasons, under_load, latched) -> None:
    got = scrape(up_view(inv, {"asusi": facts("asusi", sm=sm, reasons=reasons)}))
    assert value(got, n.GPU_UNDER_LOAD.name, node="asusi", gpu="0") == under_load
    assert value(got, n.GPU_LATCHED.name, node="asusi", gpu="0") == latched
    assert value(got, n.GPU_SM_CLOCK.name, node="asusi", gpu="0") == sm
    assert value(got, n.GPU_REASONS.name, node="asusi", gpu="0") == reasons
    assert value(got, n.GPU_REASON.name, node="asusi", gpu="0", reason="GpuIdle") == float(reasons & 1)
    assert value(got, n.GPU_LATCH_LOW.name, node="asusi") == 630
    assert value(got, n.GPU_LATCH_HIGH.name, node="asusi") == 950


def test_no_latch_verdict_without_thresholds_or_readings(inv) -> None:
    # GB300 has no latch thresholds; a GB10 whose reasons could not be read cannot be judged
    got = scrape(up_view(inv, {"station": facts("station", sm=345, top=2032, reasons=0),
                               "bluey": facts("bluey", reasons=None)}))
    assert value(got, n.GPU_SM_CLOCK.name, node="station", gpu="0") == 345
    for name in (n.GPU_LATCHED.name, n.GPU_UNDER_LOAD.name):
        assert {d["node"] for d in names_with(got, name)} == set(), name
    assert value(got, n.GPU_LATCH_LOW.name, node="station") is None


def test_inventory_override_moves_the_latch_band(spec, tmp_path) -> None:
    data = yaml.safe_load((REPO / "inventories" / "lab.yaml").read_text())
    data["hardware_classes"] = {"gb10": {"clock_latch_mhz": [600, 1000]}}
    (tmp_path / "lab2.yaml").write_text(yaml.safe_dump(data))
    inv2 = spec.inventory(str(tmp_path / "lab2.yaml"))
    got = scrape(up_view(inv2, {"asusi": facts("asusi", sm=990, reasons=0)}))
    assert value(got, n.GPU_LATCHED.name, node="asusi", gpu="0") == 1.0
    assert value(got, n.GPU_LATCH_HIGH.name, node="asusi") == 1000


# -- nodes: up, age, memory, earlyoom, journal ---------------------------------------------------------

def test_node_series_and_an_unreachable_node(inv) -> None:
    view = up_view(inv, {"reddie": facts("reddie", avail_gib=60.0)})
    st = view.nodes["asusi"]  # answered once at T0, then stopped answering
    st.facts, st.facts_at, st.up, st.failures = facts("asusi"), T0, False, Counter(unreachable=3)
    st.journal_readable = False  # e.g. the sim: no journalctl
    early = scrape(view, now=T0 + 5)
    later = scrape(view, now=T0 + 65)
    assert value(early, n.NODE_UP.name, node="reddie", group="sparks,mixed", hardware="gb10") == 1.0
    assert value(early, n.NODE_UP.name, node="asusi", group="sparks,mixed", hardware="gb10") == 0.0
    assert value(early, n.NODE_UP.name, node="station", group="station,mixed", hardware="gb300") == 0.0
    assert value(early, n.NODE_FACTS_AGE.name, node="asusi") == pytest.approx(5.0)
    assert value(later, n.NODE_FACTS_AGE.name, node="asusi") == pytest.approx(65.0)  # grows while down
    assert value(early, n.NODE_FACTS_AGE.name, node="station") is None  # never answered: no age to give
    assert value(early, n.MEM_AVAILABLE.name, node="asusi") is None  # no stale readings while down
    assert value(early, n.MEM_AVAILABLE.name, node="reddie") == 60.0 * GIB
    assert value(early, n.MEM_TOTAL.name, node="reddie") == 121.0 * GIB
    assert value(early, n.EARLYOOM_RUNNING.name, node="reddie") == 1.0
    assert value(early, n.EARLYOOM_SIGTERM.name, node="reddie") == int(2.42 * GIB)
    assert value(early, n.NODE_POLL_FAILURES.name, node="asusi", error="unreachable") == 3.0
    assert value(early, n.EARLYOOM_JOURNAL.name, node="asusi") == 0.0
    assert value(early, n.EARLYOOM_KILLS.name, node="asusi", signal="SIGTERM") == 0.0
    assert value(early, n.EARLYOOM_JOURNAL.name, node="reddie") is None  # journal not asked: nothing claimed
    assert value(early, n.NODE_INFO.name, node="reddie", group="sparks,mixed", hardware="gb10", simulated="false") == 1.0


# -- lanes: containers, info, Engram copies ---------------------------------------------------------------

def test_lane_containers_info_and_engram_copies(spec, inv) -> None:
    lane = load_lane(spec, inv, "dcp2")
    assert lane.ranks == {0: "reddie", 1: "asusi", 2: "bluey", 3: "spark4"}
    path = lane.manifests[1]
    assert path == f"/nvme/engram-local/{REV}/engram-manifest.json"
    foreign = Container(id="x", name="other", image="nginx", state="running", labels={})
    per_node = {"reddie": facts("reddie", containers=[container("dcp2", 0, image="my/vllm:patched"), foreign],
                                at=T0 + 100),
                "asusi": facts("asusi", containers=[container("dcp2", 1, state="exited"), container("boot10", 1)]),
                "bluey": facts("bluey"), "spark4": facts("spark4")}
    view = up_view(inv, per_node, lanes={"dcp2": lane})
    good = {"schema": "sparkfleet.engram-manifest/1", "complete": True, "format": "fp8", "mode": "whole-shards",
            "verified": True, "source": {"revision": REV}, "layers": {}}
    view.nodes["asusi"].manifests = {path: {"manifest": good}}
    view.nodes["bluey"].manifests = {lane.manifests[2]: {"manifest": {**good, "source": {"revision": "0" * 40}}}}
    view.nodes["spark4"].manifests = {lane.manifests[3]: {"missing": True}}
    got = scrape(view)
    assert value(got, n.ENGRAM_COPY_VALID.name, profile="dcp2", rank="1", node="asusi") == 1.0
    assert value(got, n.ENGRAM_COPY_VALID.name, profile="dcp2", rank="2", node="bluey") == 0.0  # other checkpoint
    assert value(got, n.ENGRAM_COPY_VALID.name, profile="dcp2", rank="3", node="spark4") == 0.0  # no copy
    assert value(got, n.ENGRAM_COPY_VALID.name, profile="dcp2", rank="0", node="reddie") is None  # not read
    assert value(got, n.LANE_INFO.name, profile="dcp2", engine="vllm", image="my/vllm:patched",
                 model="deepseek-ai/DeepSeek-V4.1-Flash", checkpoint=REV, group="sparks") == 1.0
    states = sorted((d["node"], d["profile"], d["rank"], d["state"]) for d in names_with(got, n.LANE_CONTAINER_STATE.name))
    assert states == [("asusi", "boot10", "1", "running"), ("asusi", "dcp2", "1", "exited"),
                      ("reddie", "dcp2", "0", "running")]  # by label: the foreign container is not a lane's
    # uptime on the node's clock: its facts' collected_at (T0 + 100) - StartedAt (T0 - 3600.5)
    assert value(got, n.LANE_CONTAINER_UPTIME.name, node="reddie", profile="dcp2", rank="0",
                 container="sf-dcp2-r0") == pytest.approx(3700.5)
    assert value(got, n.LANE_CONTAINER_UPTIME.name, node="asusi", profile="dcp2", rank="1",
                 container="sf-dcp2-r1") is None  # exited: no uptime
    only = scrape(up_view(inv, per_node, lanes={"dcp2": lane}, profile="dcp2"))
    assert {d["profile"] for d in names_with(only, n.LANE_CONTAINER_STATE.name)} == {"dcp2"}


def test_checkpoint_is_named_unknown_when_the_profile_has_no_revision(spec, inv) -> None:
    lane = load_lane(spec, inv, "exl3tp4b")
    got = scrape(up_view(inv, {}, lanes={"exl3tp4b": lane}))
    (info,) = names_with(got, n.LANE_INFO.name)
    assert info["checkpoint"] == "unknown" and info["engine"] == "vllm" and info["profile"] == "exl3tp4b"


def test_docker_time_parses_nanoseconds_and_offsets() -> None:
    assert docker_time("2026-11-30T20:13:20.123456789Z") == pytest.approx(docker_time("2026-11-30T20:13:20Z") + 0.123456789)
    assert docker_time("2026-11-30T21:13:20+01:00") == docker_time("2026-11-30T20:13:20Z")
    assert docker_time("0001-01-01T00:00:00Z") is not None and docker_time("garbage") is None and docker_time(None) is None


# -- run records ------------------------------------------------------------------------------------------

def write_record(runs: Path, run_id: str, *, profile: str = "dcp2", playbook: str = "up", outcome: str = "ok",
                 started: float, duration: float, inventory: str = "lab", data: dict | None = None,
                 steps: list[dict] | None = None) -> None:
    rec = Record(run_id, playbook, profile, inventory, f"sparkfleet {playbook} --profile {profile}", started=started)
    rec.outcome, rec.finished = outcome, started + duration
    rec.steps = steps or []
    rec.data = data or {}
    rec.write(runs)


def test_run_records_give_outcomes_durations_checks_gates_engram_and_patches(inv, tmp_path) -> None:
    runs = tmp_path / "runs"
    findings = [{"check": "memory", "status": "ok", "node": "reddie", "message": "m"},
                {"check": "clock", "status": "warn", "node": "asusi", "message": "m"},
                {"check": "clock", "status": "fail", "node": "asusi", "message": "m"},
                {"check": "earlyoom", "status": "warn", "node": "bluey", "message": "m"}]
    steps = [{"step": "stop", "status": "ok", "elapsed_s": 2.0}, {"step": "check", "status": "fail", "elapsed_s": 1.0}]
    write_record(runs, "a-old", started=T0, duration=30.0, outcome="failed", steps=steps,
                 data={"findings": findings})
    write_record(runs, "b-new", started=T0 + 1000, duration=640.5, data={
        "findings": [{"check": "memory", "status": "ok", "node": "reddie", "message": "m"}],
        "gates": {"results": [{"name": "models", "status": "pass"}, {"name": "needle", "status": "fail"},
                              {"name": "image", "status": "skip"}]},
        "engram": {"0": "nfs", "1": "node-local"},
        "launches": [{"node": "reddie", "rank": 0}, {"node": "asusi", "rank": 1}],
        "patches": {"set": "dcp2-roce", "manifest_sha256": "x", "nodes": {
            "reddie": {"ok": True, "missing": [], "wrong": []}, "asusi": {"ok": False, "missing": ["a.py"], "wrong": []}}},
    }, steps=[{"step": "check", "elapsed_s": 5.0}, {"step": "gates", "elapsed_s": 10.0}])
    write_record(runs, "c-down", playbook="down", started=T0 + 2000, duration=6.0)
    write_record(runs, "d-elsewhere", started=T0 + 3000, duration=1.0, inventory="sim")  # another inventory
    (runs / "junk.json").write_text("{not json")
    index = RunIndex(runs, "lab")
    got = scrape(up_view(inv, {}, runs=index.refresh()))
    assert index.unreadable == ["junk.json"]
    assert value(got, n.RUNS.name, profile="dcp2", playbook="up", outcome="ok") == 1.0
    assert value(got, n.RUNS.name, profile="dcp2", playbook="up", outcome="failed") == 1.0
    assert value(got, n.RUNS.name, profile="dcp2", playbook="down", outcome="ok") == 1.0
    assert sum(v for (nm, _), v in got.items() if nm == n.RUNS.name) == 3.0  # the sim inventory's run is not ours
    assert value(got, n.LAST_RUN_DURATION.name, profile="dcp2", playbook="up") == 640.5
    assert value(got, n.LAST_RUN_TIME.name, profile="dcp2", playbook="up") == T0 + 1000 + 640.5
    assert value(got, n.LAST_RUN_OK.name, profile="dcp2", playbook="up") == 1.0
    # checks come from the newest run that ran them; a warn passes, a fail does not
    assert names_with(got, n.CHECK_PASSED.name) == [{"profile": "dcp2", "node": "reddie", "check": "memory"}]
    assert value(got, n.CHECK_TIME.name, profile="dcp2") == T0 + 1000 + 5.0
    assert value(got, n.GATE_PASSED.name, profile="dcp2", gate="models") == 1.0
    assert value(got, n.GATE_PASSED.name, profile="dcp2", gate="needle") == 0.0
    assert value(got, n.GATE_PASSED.name, profile="dcp2", gate="image") is None  # skipped: not judged
    assert value(got, n.GATE_TIME.name, profile="dcp2") == T0 + 1000 + 15.0
    assert value(got, n.ENGRAM_SOURCE.name, profile="dcp2", rank="1", node="asusi", source="node-local") == 1.0
    assert value(got, n.ENGRAM_SOURCE.name, profile="dcp2", rank="1", node="asusi", source="nfs") == 0.0
    assert value(got, n.ENGRAM_SOURCE.name, profile="dcp2", rank="0", node="reddie", source="nfs") == 1.0
    assert value(got, n.PATCHES_VERIFIED.name, profile="dcp2", node="reddie", patch_set="dcp2-roce") == 1.0
    assert value(got, n.PATCHES_VERIFIED.name, profile="dcp2", node="asusi", patch_set="dcp2-roce") == 0.0
    # the older run's check results, when it is the newest with checks
    (runs / "b-new.json").unlink()
    old = scrape(up_view(inv, {}, runs=index.refresh()))
    assert value(old, n.CHECK_PASSED.name, profile="dcp2", node="asusi", check="clock") == 0.0
    assert value(old, n.CHECK_PASSED.name, profile="dcp2", node="bluey", check="earlyoom") == 1.0
    assert value(old, n.CHECK_TIME.name, profile="dcp2") == T0 + 3.0


def test_the_startup_receipt_of_the_newest_run_that_started_a_head(inv, tmp_path) -> None:
    runs = tmp_path / "runs"
    write_record(runs, "a-old", started=T0, duration=300.0, data={"startup": {
        "head_started": T0 + 10, "port_open_s": 150.0, "health_s": 150.0, "ready_s": 151.0, "first_token_s": 190.5}})
    write_record(runs, "b-fail", started=T0 + 1000, duration=60.0, outcome="failed", data={"startup": {
        "head_started": T0 + 1010, "port_open_s": 40.0}})  # never healthy: only the point it reached
    write_record(runs, "c-down", playbook="down", started=T0 + 2000, duration=6.0)  # started no head
    got = scrape(up_view(inv, {}, runs=RunIndex(runs, "lab").refresh()))
    assert {p["point"]: value(got, n.STARTUP.name, **p) for p in names_with(got, n.STARTUP.name)} == {
        "port_open": 40.0}
    (runs / "b-fail.json").unlink()
    got = scrape(up_view(inv, {}, runs=RunIndex(runs, "lab").refresh()))
    assert {p["point"]: value(got, n.STARTUP.name, **p) for p in names_with(got, n.STARTUP.name)} == {
        "port_open": 150.0, "health": 150.0, "ready": 151.0, "first_token": 190.5}


def test_run_index_parses_a_record_once(tmp_path, monkeypatch) -> None:
    runs = tmp_path / "runs"
    write_record(runs, "a", started=T0, duration=1.0)
    index = RunIndex(runs, "lab")
    assert [r.run_id for r in index.refresh()] == ["a"]
    from sparkfleet.runner import summaries

    calls = []
    real = summaries.summarise
    monkeypatch.setattr(summaries, "summarise", lambda rec: calls.append(rec["run_id"]) or real(rec))
    write_record(runs, "b", started=T0 + 1, duration=1.0)
    assert [r.run_id for r in index.refresh()] == ["a", "b"]
    assert calls == ["b"]


# -- the node-side journal / manifest command, run for real against a scratch sandbox ------------------------

KILL_LINES = ('sending SIGTERM to process 7378 uid 1000 "tail": badness 156, VmRSS 4962 MiB\n'
              'low memory! at or below SIGTERM limits: mem  1.95%, swap  0.00%\n'
              'escalating to SIGKILL after 0.5 seconds\n'
              'sending SIGKILL to process 7378 uid 1000 "tail": badness 156, VmRSS 4962 MiB\n'
              'sending SIGTERM to process 7400 uid 0 "python3": oom_score 160, oom_score_adj 0, VmRSS 9000 MiB, '
              'cmdline "python3 x.py"\n')


def sandbox(tmp_path: Path, journalctl: str | None, *, journal_dir: bool = True) -> tuple[LocalTransport, object]:
    from sparkfleet.schema.inventory import Node

    root = tmp_path / "node"
    for d in ("bin", "home", "nvme"):  # the node's top-level dirs (the wrapper binds what exists now)
        (root / d).mkdir(parents=True)
    if journal_dir:  # journald's persistent store, empty: a node that keeps a journal
        (root / "var/log/journal").mkdir(parents=True)
    if journalctl is not None:
        j = root / "bin" / "journalctl"
        j.write_text(journalctl)
        j.chmod(j.stat().st_mode | stat.S_IEXEC)
    node = Node(name="n1", ssh={"host": "127.0.0.1"}, hardware="gb10", storage={"model_root": "/m", "cache_dir": "/c"},
                transport="local", wrapper=[str(write_wrapper(root, tmp_path / "enter"))])
    return LocalTransport(), node


def run_extras(transport, node, **req) -> extras.Extras:
    r = transport.run([node], extras.COMMAND, stdin=extras.request(**req), timeout_s=30)[node.name]
    got = extras.parse(r)
    assert isinstance(got, extras.Extras), got
    return got


def test_journal_kills_are_counted_in_the_window_since_the_last_poll(tmp_path) -> None:
    script = "#!/usr/bin/sh\necho \"$@\" >> /home/args\ncat <<'EOF'\n" + KILL_LINES + "EOF\n"
    transport, node = sandbox(tmp_path, script)
    got = run_extras(transport, node, journal=True, since=1796000000.7, manifests=[])
    assert got.journal == {"readable": True, "since": 1796000000, "until": int(got.now),
                           "kills": {"SIGTERM": 2, "SIGKILL": 1}}
    args = (tmp_path / "node" / "home" / "args").read_text().split()
    assert args == ["-u", "earlyoom", "--since", "@1796000000", "--until", f"@{int(got.now)}", "--no-pager", "-o", "cat"]


def test_journal_empty_or_not_permitted(tmp_path) -> None:
    transport, node = sandbox(tmp_path / "a", None)  # this machine's journalctl on a node with an empty journal
    got = run_extras(transport, node, journal=True, since=None, manifests=[])
    assert got.journal == {"readable": True, "since": int(got.now), "until": int(got.now),
                           "kills": {"SIGTERM": 0, "SIGKILL": 0}}
    hint = ("#!/usr/bin/sh\necho 'Hint: You are currently not seeing messages from other users and the system.' >&2\n"
            "echo '-- No entries --'\n")
    transport, node = sandbox(tmp_path / "b", hint)
    got = run_extras(transport, node, journal=True, since=None, manifests=[])
    assert got.journal["readable"] is False and "not seeing messages" in got.journal["why"]


def test_a_node_without_a_journal_is_unreadable_not_zero_kills(tmp_path) -> None:
    # this machine's journalctl prints nothing and exits 0 there: that must not read as "no kills"
    transport, node = sandbox(tmp_path, None, journal_dir=False)
    got = run_extras(transport, node, journal=True, since=None, manifests=[])
    assert got.journal == {"readable": False,
                           "why": "no journal on this node (no /var/log/journal or /run/log/journal)"}


def test_manifests_are_read_on_the_node(tmp_path) -> None:
    transport, node = sandbox(tmp_path, None)
    d = tmp_path / "node" / "nvme" / "engram-local" / REV
    d.mkdir(parents=True)
    manifest = {"schema": "sparkfleet.engram-manifest/1", "complete": True, "format": "fp8", "mode": "rows",
                "verified": True, "source": {"revision": REV, "dir": "/x", "shards": ["big"] * 100},
                "layers": {"1": {"start": 0, "end": 10}}, "files": ["big"] * 1000}
    (d / "engram-manifest.json").write_text(json.dumps(manifest))
    (d / "bad.json").write_text("[1, 2")
    p = f"/nvme/engram-local/{REV}"
    got = run_extras(transport, node, journal=False, since=None,
                     manifests=[f"{p}/engram-manifest.json", f"{p}/none.json", f"{p}/bad.json"])
    assert got.journal is None
    m = got.manifests[f"{p}/engram-manifest.json"]["manifest"]
    assert m == {"schema": "sparkfleet.engram-manifest/1", "complete": True, "format": "fp8", "mode": "rows",
                 "verified": True, "completed_at": None, "layers": {"1": {"start": 0, "end": 10}},
                 "source": {"revision": REV}}  # only what the validity rule reads
    assert got.manifests[f"{p}/none.json"] == {"missing": True}
    assert "error" in got.manifests[f"{p}/bad.json"]


def test_extras_parse_failures_are_one_line() -> None:
    assert extras.parse(Result("n", False, error="timeout", message="n: timed out after 20 s")) == "n: timed out after 20 s"
    assert extras.parse(Result("n", True, stdout="", stderr="python3: not found\n")).endswith("(python3: not found)")


# -- the poller: never crashes, never blocks a scrape ------------------------------------------------------

class BlockingTransport(RunEachByRun):
    """Every command waits for `release`, then fails as an unreachable node would."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def run(self, nodes, command, *, stdin=None, timeout_s=60.0, env=None):
        self.calls += 1
        self.release.wait(30)
        return {x.name: Result(x.name, False, error="unreachable", message=f"{x.name}: no route") for x in nodes}

    def put(self, nodes, data, remote_path, *, mode=0o644):
        return {x.name: Result(x.name, False, error="unreachable") for x in nodes}

    def close(self) -> None:
        pass


class RaisingTransport(BlockingTransport):
    def run(self, nodes, command, *, stdin=None, timeout_s=60.0, env=None):
        raise RuntimeError("transport bug")


def test_a_hung_poll_never_blocks_a_scrape_and_failures_mark_nodes_down(spec, inv) -> None:
    transport = BlockingTransport()
    poller = Poller(spec, inv, transport, interval_s=0.05, timeout_s=1.0)
    reg = CollectorRegistry()
    reg.register(FleetCollector(lambda: poller.snapshot, time.time))
    poller.start()
    try:
        deadline = time.monotonic() + 5
        while transport.calls == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert transport.calls > 0  # a poll is in progress and stuck in the transport
        t0 = time.perf_counter()
        text = generate_latest(reg).decode()
        assert time.perf_counter() - t0 < 0.5
        assert 'sparkfleet_exporter_polls_total 0.0' in text
        assert "sparkfleet_node_up{" not in text  # not asked yet is not down
        transport.release.set()
        while poller.polls == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        text = generate_latest(reg).decode()
        assert 'sparkfleet_node_up{group="sparks,mixed",hardware="gb10",node="reddie"} 0.0' in text
        assert 'sparkfleet_node_poll_failures_total{error="unreachable",node="reddie"}' in text
    finally:
        transport.release.set()
        poller.stop(5)
    assert not poller.running


def test_a_transport_that_raises_fails_the_poll_not_the_exporter(spec, inv) -> None:
    poller = Poller(spec, inv, RaisingTransport(), interval_s=1.0, timeout_s=1.0)
    snap = poller.poll_once()
    got = {(s.name, frozenset(s.labels.items())): s.value for f in snap.families for s in f.samples}
    assert value(got, n.NODE_UP.name, node="reddie", group="sparks,mixed", hardware="gb10") == 0.0
    assert poller.states["reddie"].error.startswith("facts gathering failed: RuntimeError: transport bug")
    assert poller.states["reddie"].journal_readable is None  # a node that did not answer says nothing of its journal
    assert poller.polls == 1


def test_journal_windows_and_kill_counts_survive_a_restart(spec, inv, tmp_path) -> None:
    path = tmp_path / "journal-lab.json"
    poller = Poller(spec, inv, RaisingTransport(), journal_state=path)
    poller.states["asusi"].journal_since = 1796000000.0
    poller.states["asusi"].kills["SIGTERM"] = 4
    poller._save_journal_state()
    again = Poller(spec, inv, RaisingTransport(), journal_state=path)
    assert again.states["asusi"].journal_since == 1796000000.0
    assert again.states["asusi"].kills == {"SIGTERM": 4, "SIGKILL": 0}
    assert again.states["reddie"].journal_since is None


# -- dashboards ----------------------------------------------------------------------------------------------

def test_dashboards_are_well_formed_and_every_panel_is_described() -> None:
    boards = dash.all_dashboards()
    assert set(boards) == {"sparkfleet-fleet.json", "sparkfleet-lane.json"}  # no Bench: no bench metrics yet
    for d in boards.values():
        assert json.loads(json.dumps(d)) == d
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["profile"]["allValue"] == ".*"
        assert variables["node"]["definition"] == "label_values(sparkfleet_node_up, node)"
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids))
        for p in dash.panels(d):
            assert p["description"].strip(), p["title"]
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
            assert [t["refId"] for t in p["targets"]] == [chr(65 + i) for i in range(len(p["targets"]))]
            assert all(t["expr"].strip() for t in p["targets"])
    text = json.dumps(boards["sparkfleet-lane.json"])
    assert '"{{profile}} p99"' in text  # Grafana legend syntax kept literal (no template engine)


def test_dashboard_queries_name_only_series_that_exist() -> None:
    exported = set(n.BY_NAME)
    m = Metrics("x", 1024, 5)  # the sim engine writes vLLM's names (REFERENCE.md §1)
    m.draft(2)
    sim_text = m.render(0, 0, 0.0)
    vllm = {s.name for f in text_string_to_metric_families(sim_text) for s in f.samples}
    for file, d in dash.all_dashboards().items():
        for title, expr in dash.queries(d):
            for name in dash.series_names(expr):
                if name.startswith("sparkfleet_"):
                    assert name in exported, (file, title, name)
                elif name.startswith("llamacpp:"):  # checked against llama.cpp's real server (test_llamacpp_lab)
                    assert name in {*LLAMA.counters.values(), *LLAMA.gauges.values()}, (file, title, name)
                elif name != VLLM.fallbacks["kv_usage"]:  # the deprecated name, absent from vLLM >= 0.10
                    assert name in vllm, (file, title, name)
    assert {*GAUGES, *(c + "_total" for c in (*COUNTERS, *SPEC_COUNTERS))} <= vllm


def test_fleet_clock_panel_shades_the_inventorys_latch_band() -> None:
    d = dash.fleet((600, 1000))
    (p,) = [p for p in dash.panels(d) if p["title"].startswith("GPU SM clock")]
    steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 600, 1001]
    assert p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "area"


def test_names_follow_prometheus_conventions() -> None:
    units = ("_bytes", "_seconds", "_mhz", "_watts", "_total", "_info", "_bytes_per_second")
    flags = {n.NODE_UP, n.EARLYOOM_RUNNING, n.EARLYOOM_JOURNAL, n.GPU_LATCHED, n.GPU_UNDER_LOAD, n.GPU_REASON,
             n.GPU_REASONS, n.LANE_CONTAINER_STATE, n.ENGRAM_SOURCE, n.ENGRAM_COPY_VALID, n.PATCHES_VERIFIED,
             n.CHECK_PASSED, n.GATE_PASSED, n.LAST_RUN_OK, n.FABRIC_LINK_UP, n.RDMA_PORT_ACTIVE, n.PROBE_LINK_OK,
             n.WATCH_STATE, n.WATCH_PROBE_OK, n.WATCH_BUDGET_LEFT}  # 0/1 flags, and one plain count
    for m in n.ALL:
        assert m.name.startswith("sparkfleet_")
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert m in flags or m.name.endswith(units), m.name
        assert m.help.strip()


def test_docs_list_every_metric() -> None:
    doc = (REPO / "docs" / "metrics.md").read_text()
    missing = [m.name for m in n.ALL if f"`{m.name}`" not in doc]
    assert not missing


# -- provisioning and the dashboards command ------------------------------------------------------------------

def test_generated_scrape_config_is_valid_for_promtool(tmp_path) -> None:
    files = write_all(tmp_path, exporter="127.0.0.1:9810", engines=[EngineTarget("dcp2", "reddie", "10.10.0.11:8410")],
                      prometheus_url="http://127.0.0.1:9090", scrape_interval="15s", latch_band=(630, 950))
    prom_yml = tmp_path / "prometheus" / "prometheus.yml"
    assert prom_yml in files
    r = promtool("check", "config", str(prom_yml))
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = yaml.safe_load(prom_yml.read_text())["scrape_configs"]
    assert jobs[1]["static_configs"] == [{"targets": ["10.10.0.11:8410"], "labels": {"profile": "dcp2", "node": "reddie"}}]
    ds = yaml.safe_load((tmp_path / "grafana/provisioning/datasources/sparkfleet.yaml").read_text())
    assert ds["datasources"][0]["jsonData"]["timeInterval"] == "15s"
    provider = yaml.safe_load((tmp_path / "grafana/provisioning/dashboards/sparkfleet.yaml").read_text())
    path = Path(provider["providers"][0]["options"]["path"])
    assert path.is_absolute() and sorted(p.name for p in path.glob("*.json")) == ["sparkfleet-fleet.json",
                                                                                   "sparkfleet-lane.json"]
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(scrape_config("127.0.0.1:9810", [], scrape_interval="fast")))
    assert promtool("check", "config", str(bad)).returncode != 0  # promtool does reject a broken file


def test_dashboards_command(tmp_path, capsys) -> None:
    assert main(["dashboards", "--out", str(tmp_path), "--profile", "dcp2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["engines"] == [{"profile": "dcp2", "node": "reddie", "address": "10.10.0.11:8410"}]
    assert any("no Bench dashboard" in x for x in got["notes"])
    assert main(["dashboards", "--out", str(tmp_path), "--profile", "tf1017", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["engines"] == [] and any("tensorfold" in x for x in got["notes"])


@pytest.mark.parametrize("argv, message", [
    (["exporter", "--listen", "9810"], "--listen '9810': expected HOST:PORT"),
    (["exporter", "--listen", "127.0.0.1:70000"], "port must be 1-65535"),
    (["exporter", "--interval", "soon"], "--interval 'soon': expected a duration"),
    (["exporter", "--profile", "spark-vllm", "--once"], "is a base for other lanes"),
    (["dashboards", "--out", "/tmp/x", "--scrape-interval", "1.5s"], "Prometheus needs an integer and a unit"),
    (["dashboards", "--out", "/tmp/x", "--profile", "nope"], "nope"),
])
def test_cli_input_errors_are_one_line_exit_2(argv, message, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_exporter_refuses_a_port_in_use(capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        # inventory lab: the server fails to bind before any poll starts, so no node is contacted
        assert main(["exporter", "--listen", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err


def test_collect_is_cheap_on_a_big_fleet(spec, tmp_path) -> None:
    """20 nodes of facts: a scrape is formatting only (the benchmark measures it under a running poller)."""
    data = yaml.safe_load((REPO / "inventories" / "lab.yaml").read_text())
    base = data["nodes"]["asusi"]
    data["nodes"] = {f"n{i:02d}": base for i in range(20)}
    data["groups"] = {"sparks": list(data["nodes"])}
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(data))
    inv20 = spec.inventory(str(tmp_path / "big.yaml"))
    view = up_view(inv20, {name: facts(name) for name in inv20.nodes})
    got = scrape(view)
    assert len(names_with(got, n.NODE_UP.name)) == 20
    assert not any(math.isnan(v) for v in got.values())


def test_http_endpoint_serves_the_collectors_exposition(inv) -> None:
    """The server's pre-rendered text is what the Collector yields (facts age as of the scrape included)."""
    import httpx

    from sparkfleet.metrics.collector import MetricsServer, exposition

    snap = snapshot(up_view(inv, {"reddie": facts("reddie"), "asusi": facts("asusi", sm=780, reasons=0)}))
    reg = CollectorRegistry()
    reg.register(FleetCollector(lambda: snap, lambda: T0 + 7))
    assert exposition(snap, T0 + 7) == generate_latest(reg)
    server = MetricsServer("127.0.0.1", 0, lambda: exposition(snap, T0 + 7))
    server.start()
    try:
        port = server.server_address[1]
        r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE_LATEST
        assert r.content == generate_latest(reg)
        assert 'sparkfleet_node_facts_age_seconds{node="reddie"} 7.0' in r.text
        assert 'sparkfleet_gpu_clock_latched{gpu="0",node="asusi"} 1.0' in r.text
        assert httpx.get(f"http://127.0.0.1:{port}/other", timeout=5).status_code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_new_run_records_are_published_between_fleet_polls(spec, inv, tmp_path) -> None:
    runs = tmp_path / "runs"
    poller = Poller(spec, inv, RaisingTransport(), interval_s=60.0, runs_dir=runs)
    write_record(runs, "a", started=T0, duration=5.0)
    poller.refresh_records()
    assert b"sparkfleet_runs_total{" not in poller.snapshot.text  # nothing is exported before the first poll
    poller.poll_once()
    assert b'sparkfleet_runs_total{outcome="ok",playbook="up",profile="dcp2"} 1.0' in poller.snapshot.text
    write_record(runs, "b", started=T0 + 10, duration=5.0, outcome="failed")
    before = poller.snapshot
    poller.refresh_records()  # what the records thread does every couple of seconds, without a fleet poll
    assert poller.polls == 1 and poller.snapshot is not before
    assert b'sparkfleet_runs_total{outcome="failed",playbook="up",profile="dcp2"} 1.0' in poller.snapshot.text
    unchanged = poller.snapshot
    poller.refresh_records()
    assert poller.snapshot is unchanged  # nothing new: nothing rebuilt
