"""The exporter's prometheus-client Collector over the poller's cached state, and its HTTP endpoint.

`build` is pure: a FleetView (node states, lanes, run summaries) in, metric families out. The poller
calls it once after each poll and keeps the families in an immutable Snapshot, rendered once to the
text exposition there too. `FleetCollector.collect` yields the families plus the one series that
depends on the scrape time (facts age); `MetricsServer` serves the pre-rendered text plus that series,
so a scrape is an attribute read and a socket write: it never waits on a node, a lock or a file, and
does not re-format hundreds of samples while the poller competes for the CPU.
"""

from __future__ import annotations

import posixpath
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sparkfleet.checks import clock, probe
from sparkfleet.engines.registry import engine_for
from sparkfleet.engram.manifest import judge_rank
from sparkfleet.engram.ranges import Harvest
from sparkfleet.fleet.nodefacts import Container, NodeFacts
from sparkfleet.fleet.ops.docker import docker_time
from sparkfleet.metrics import names as n
from sparkfleet.naming import PROFILE_LABEL, RANK_LABEL
from sparkfleet.runner.summaries import RunSummary
from sparkfleet.schema.inventory import HardwareClass, Inventory, Node
from sparkfleet.schema.profile import Profile
from sparkfleet.watch.status import REASONS as WATCH_REASONS
from sparkfleet.watch.status import STATES as WATCH_STATES
from sparkfleet.watch.status import Status as WatchStatus

ENGRAM_SOURCES = ("node-local", "nfs")


@dataclass
class NodeState:
    """What the exporter knows about one node; only the poller thread changes it."""

    name: str
    up: bool = False
    facts: NodeFacts | None = None  # from the newest poll the node answered
    facts_at: float | None = None  # exporter clock when those facts arrived
    error: str | None = None  # why the last poll got no facts (one line)
    failures: Counter[str] = field(default_factory=Counter)  # error kind -> polls without facts
    journal_readable: bool | None = None  # None: journal not asked (yet)
    journal_why: str = ""
    journal_since: float | None = None  # node clock: where the next journal window starts
    kills: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("SIGTERM", "SIGKILL"), 0))
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> answer, newest poll


@dataclass(frozen=True)
class Lane:
    """A lane (profile) as the exporter watches it: its ranks' nodes and node-local Engram manifests."""

    profile: Profile
    ranks: dict[int, str]  # rank -> node
    manifests: dict[int, str]  # rank -> manifest path on its node (ranks with a node-local copy only)
    harvest: Harvest | None = None  # the lane's harvested Engram ranges, when there are any


@dataclass
class FleetView:
    """Everything `build` reads."""

    inventory: Inventory
    nodes: dict[str, NodeState]
    lanes: dict[str, Lane] = field(default_factory=dict)
    runs: list[RunSummary] = field(default_factory=list)
    profile: str | None = None  # only this lane's containers, lane info and records
    polls: int = 0
    poll_duration_s: float | None = None
    polled_at: float | None = None
    watches: list[WatchStatus] = field(default_factory=list)  # `sparkfleet watch` status files


@dataclass(frozen=True)
class Snapshot:
    """What a scrape reads: the families built after a poll, their exposition, when each node's facts arrived."""

    families: tuple[Metric, ...] = ()
    facts_at: tuple[tuple[str, float], ...] = ()
    text: bytes = b""  # generate_latest() of `families`


def _gauge(m: n.Metric) -> GaugeMetricFamily:
    assert m.kind == "gauge", m
    return GaugeMetricFamily(m.name, m.help, labels=list(m.labels))


def _counter(m: n.Metric) -> CounterMetricFamily:
    assert m.kind == "counter", m
    return CounterMetricFamily(m.name, m.help, labels=list(m.labels))


def groups_of(inv: Inventory, node: str) -> str:
    """The node's groups, comma-joined in inventory order (one label value even in several groups)."""
    return ",".join(g for g, members in inv.groups.items() if node in members)


def clock_state(hw_band: tuple[int, int], fraction: float, sm: int | None, top: int | None,
                reasons: int | None) -> str:
    """One facts sample judged as the clock check judges a probe sample (checks/probe.classify).

    A facts snapshot carries no "load running" flag; the GpuIdle reason bit is what says the GPU was
    idle, so the sample is offered as under load and `classify` answers idle when that bit is set.
    """
    return probe.classify({"load": True, "sm": sm, "max": top, "reasons": reasons}, hw_band, fraction)


def _node_families(view: FleetView, out: dict[str, Metric]) -> None:
    inv = view.inventory
    for node in inv.nodes.values():
        st = view.nodes.get(node.name) or NodeState(node.name)
        f = st.facts if st.up else None  # a node that did not answer shows no stale readings
        group = groups_of(inv, node.name)
        simulated = node.simulation
        out[n.NODE_UP.name].add_metric([node.name, group, node.hardware], 1.0 if st.up else 0.0)
        out[n.NODE_INFO.name].add_metric([node.name, group, node.hardware, "true" if simulated else "false"], 1.0)
        for kind, count in sorted(st.failures.items()):
            out[n.NODE_POLL_FAILURES.name].add_metric([node.name, kind], float(count))
        if st.journal_readable is not None:
            out[n.EARLYOOM_JOURNAL.name].add_metric([node.name], 1.0 if st.journal_readable else 0.0)
            for sig, count in st.kills.items():
                out[n.EARLYOOM_KILLS.name].add_metric([node.name, sig], float(count))
        hw = inv.hardware(node)
        judged = clock.judged(hw)
        if judged and hw.clock_latch_mhz:
            out[n.GPU_LATCH_LOW.name].add_metric([node.name], float(hw.clock_latch_mhz[0]))
            out[n.GPU_LATCH_HIGH.name].add_metric([node.name], float(hw.clock_latch_mhz[1]))
        if f is None:
            continue
        if f.uptime_s is not None:
            out[n.NODE_UPTIME.name].add_metric([node.name], f.uptime_s)
        if f.meminfo is not None:
            out[n.MEM_TOTAL.name].add_metric([node.name], float(f.meminfo.mem_total_bytes))
            out[n.MEM_AVAILABLE.name].add_metric([node.name], float(f.meminfo.mem_available_bytes))
        if f.earlyoom is not None:
            out[n.EARLYOOM_RUNNING.name].add_metric([node.name], 1.0 if f.earlyoom.running else 0.0)
            if f.earlyoom.sigterm_threshold_bytes is not None:
                out[n.EARLYOOM_SIGTERM.name].add_metric([node.name], float(f.earlyoom.sigterm_threshold_bytes))
        _gpu_families(node, hw, judged, f, out)
        _container_families(node, f, view.profile, out)
        _fabric_node_families(node, f, out)


def _fabric_node_families(node: Node, f: NodeFacts, out: dict[str, Metric]) -> None:
    """The node's fabric links (the interfaces its facts were asked about), RDMA ports and clock offset."""
    for iface, link in sorted(f.links.items()):
        up = link.exists and link.operstate == "up" and link.carrier != 0
        out[n.FABRIC_LINK_UP.name].add_metric([node.name, iface], 1.0 if up else 0.0)
        if link.mtu is not None:
            out[n.FABRIC_LINK_MTU.name].add_metric([node.name, iface], float(link.mtu))
        if link.speed_mbps is not None:
            out[n.FABRIC_LINK_SPEED.name].add_metric([node.name, iface], link.speed_mbps * 1e6 / 8)
    for p in f.rdma:
        out[n.RDMA_PORT_ACTIVE.name].add_metric([node.name, p.hca, str(p.port)],
                                                1.0 if (p.state or "").upper() == "ACTIVE" else 0.0)
    if f.received_at is not None:
        out[n.NODE_CLOCK_OFFSET.name].add_metric([node.name], f.collected_at - f.received_at)


def _gpu_families(node: Node, hw: HardwareClass, judged: bool, f: NodeFacts, out: dict[str, Metric]) -> None:
    th = clock.thresholds(hw)
    for g in f.gpus:
        labels = [node.name, str(g.index)]
        if g.sm_clock_mhz is not None:
            out[n.GPU_SM_CLOCK.name].add_metric(labels, float(g.sm_clock_mhz))
        if g.max_sm_clock_mhz is not None:
            out[n.GPU_MAX_SM_CLOCK.name].add_metric(labels, float(g.max_sm_clock_mhz))
        if g.power_draw_w is not None:
            out[n.GPU_POWER.name].add_metric(labels, g.power_draw_w)
        if g.clock_event_reasons is not None:
            out[n.GPU_REASONS.name].add_metric(labels, float(g.clock_event_reasons))
            for bit, reason in n.REASONS.items():
                out[n.GPU_REASON.name].add_metric([*labels, reason], 1.0 if g.clock_event_reasons & bit else 0.0)
        if not judged:
            continue  # no latch thresholds for this class (GB300 by default): no verdict to export
        state = clock_state(th["latch_band"], th["latch_fraction"], g.sm_clock_mhz, g.max_sm_clock_mhz,
                            g.clock_event_reasons)
        if state == "unknown":
            continue  # clock or reasons unreadable: neither latched nor fine
        out[n.GPU_UNDER_LOAD.name].add_metric(labels, 0.0 if state == "idle" else 1.0)
        out[n.GPU_LATCHED.name].add_metric(labels, 1.0 if state == "latched" else 0.0)


def lane_containers(f: NodeFacts, profile: str | None = None) -> list[Container]:
    """Containers sparkfleet launched on this node (by label, never by name), optionally of one lane."""
    if f.docker is None:
        return []
    return [c for c in f.docker.containers
            if PROFILE_LABEL in c.labels and (profile is None or c.labels[PROFILE_LABEL] == profile)]


def _container_families(node: Node, f: NodeFacts, profile: str | None, out: dict[str, Metric]) -> None:
    for c in lane_containers(f, profile):
        labels = [node.name, c.labels[PROFILE_LABEL], c.labels.get(RANK_LABEL, ""), c.name]
        out[n.LANE_CONTAINER_STATE.name].add_metric([*labels, c.state], 1.0)
        started = docker_time(c.started_at)
        if c.state == "running" and started is not None:
            # both times are the node's clock: no skew between the exporter and the node
            out[n.LANE_CONTAINER_UPTIME.name].add_metric(labels, max(0.0, f.collected_at - started))


def _lane_families(view: FleetView, out: dict[str, Metric]) -> None:
    for name, lane in sorted(view.lanes.items()):
        p = lane.profile
        head = lane.ranks.get(0)
        image = p.image.pinned if p.image else ""
        st = view.nodes.get(head) if head else None
        if st is not None and st.up and st.facts is not None:
            running = [c for c in lane_containers(st.facts, name) if c.labels.get(RANK_LABEL) == "0"]
            if running:
                image = running[0].image  # what the head actually runs, if it differs from the profile
        model = engine_for(p.engine).model_label(p)
        checkpoint = (p.model.revision if p.model else None) or "unknown"
        out[n.LANE_INFO.name].add_metric([name, p.engine, image, model, checkpoint, p.group or ""], 1.0)
        for rank, path in sorted(lane.manifests.items()):
            node = lane.ranks[rank]
            st = view.nodes.get(node)
            answer = st.manifests.get(path) if st is not None and st.up else None
            if answer is None:
                continue  # node down, or the manifest was not read this poll: unknown, not invalid
            manifest = answer.get("manifest")
            valid = False
            if manifest is not None:
                findings = judge_rank(manifest, profile=p, rank=rank, node=node, dest=posixpath.dirname(path),
                                      harvest=lane.harvest)
                valid = not any(x.status == "fail" for x in findings)
            out[n.ENGRAM_COPY_VALID.name].add_metric([name, str(rank), node], 1.0 if valid else 0.0)


def _newest(runs: Iterable[RunSummary], has: Callable[[RunSummary], Any]) -> dict[str, RunSummary]:
    """Per profile, the newest run for which `has(run)` is not None (runs come oldest first)."""
    out: dict[str, RunSummary] = {}
    for r in runs:
        if has(r) is not None:
            out[r.profile] = r
    return out


def _record_families(view: FleetView, out: dict[str, Metric]) -> None:
    runs = [r for r in view.runs if view.profile is None or r.profile == view.profile]
    outcomes = Counter((r.profile, r.playbook, r.outcome) for r in runs)
    for labels, count in sorted(outcomes.items()):
        out[n.RUNS.name].add_metric(list(labels), float(count))
    last: dict[tuple[str, str], RunSummary] = {}
    for r in runs:
        last[(r.profile, r.playbook)] = r
    for (profile, playbook), r in sorted(last.items()):
        labels = [profile, playbook]
        if r.duration_s is not None:
            out[n.LAST_RUN_DURATION.name].add_metric(labels, r.duration_s)
        if r.finished is not None:
            out[n.LAST_RUN_TIME.name].add_metric(labels, r.finished)
        out[n.LAST_RUN_OK.name].add_metric(labels, 1.0 if r.outcome == "ok" else 0.0)
    for profile, r in sorted(_newest(runs, lambda r: r.startup).items()):
        assert r.startup is not None
        for point, seconds in r.startup.items():
            out[n.STARTUP.name].add_metric([profile, point], seconds)
    for profile, r in sorted(_newest(runs, lambda r: r.checks).items()):
        assert r.checks is not None
        for (node, check), status in sorted(r.checks.items()):
            out[n.CHECK_PASSED.name].add_metric([profile, node, check], 0.0 if status in ("fail", "unknown") else 1.0)
        if r.checks_at is not None:
            out[n.CHECK_TIME.name].add_metric([profile], r.checks_at)
    for profile, r in sorted(_newest(runs, lambda r: r.gates).items()):
        assert r.gates is not None
        for gate, status in sorted(r.gates.items()):
            if status in ("pass", "fail"):
                out[n.GATE_PASSED.name].add_metric([profile, gate], 1.0 if status == "pass" else 0.0)
        if r.gates_at is not None:
            out[n.GATE_TIME.name].add_metric([profile], r.gates_at)
    for profile, r in sorted(_newest(runs, lambda r: r.engram).items()):
        assert r.engram is not None
        lane = view.lanes.get(profile)
        for rank, source in sorted(r.engram.items()):
            node = r.rank_nodes.get(rank) or (lane.ranks.get(rank) if lane else None) or ""
            for s in ENGRAM_SOURCES:
                out[n.ENGRAM_SOURCE.name].add_metric([profile, str(rank), node, s], 1.0 if source == s else 0.0)
    for profile, r in sorted(_newest(runs, lambda r: r.fabric).items()):
        assert r.fabric is not None
        for x in r.fabric:
            for src, dst, bps in ((x["a"], x["b"], x["a_to_b_bps"]), (x["b"], x["a"], x["b_to_a_bps"])):
                if isinstance(bps, int | float):
                    out[n.PROBE_LINK_BANDWIDTH.name].add_metric([profile, x["name"], src, dst], float(bps) / 8)
            for size, t in sorted(x["rtt_s"].items()):
                out[n.PROBE_LINK_RTT.name].add_metric([profile, x["name"], str(size)], float(t))
            out[n.PROBE_LINK_OK.name].add_metric([profile, x["name"]], 1.0 if x["ok"] else 0.0)
        if r.fabric_at is not None:
            out[n.PROBE_TIME.name].add_metric([profile], r.fabric_at)
    for profile, r in sorted(_newest(runs, lambda r: r.patches).items()):
        assert r.patches is not None
        for node, ok in sorted(r.patches["nodes"].items()):
            out[n.PATCHES_VERIFIED.name].add_metric([profile, node, r.patches["set"]], 1.0 if ok else 0.0)


def _watch_families(view: FleetView, out: dict[str, Metric]) -> None:
    for w in view.watches:
        if view.profile is not None and w.profile != view.profile:
            continue
        p = [w.profile]
        for state in WATCH_STATES:
            out[n.WATCH_STATE.name].add_metric([w.profile, state], 1.0 if w.state == state else 0.0)
        for reason in sorted(set(WATCH_REASONS) | set(w.restarts)):  # every reason from 0, so rate() sees the first
            out[n.WATCH_RESTARTS.name].add_metric([w.profile, reason], float(w.restarts.get(reason, 0)))
        if w.probe_ok is not None:
            out[n.WATCH_PROBE_OK.name].add_metric(p, 1.0 if w.probe_ok else 0.0)
        if w.probe_latency_s is not None:
            out[n.WATCH_PROBE_LATENCY.name].add_metric(p, w.probe_latency_s)
        out[n.WATCH_BUDGET_LEFT.name].add_metric(p, float(w.budget_left))
        out[n.WATCH_UPDATED.name].add_metric(p, w.updated)


def build(view: FleetView) -> list[Metric]:
    """Every family except facts age (scrape-time), in names.ALL order; families without samples included."""
    out: dict[str, Metric] = {m.name: (_gauge(m) if m.kind == "gauge" else _counter(m))
                              for m in n.ALL if m is not n.NODE_FACTS_AGE}
    if view.polls:  # before the first poll nothing is known: no node is "down" just because it was not asked yet
        _node_families(view, out)
        _lane_families(view, out)
        _record_families(view, out)
        _watch_families(view, out)
    out[n.POLLS.name].add_metric([], float(view.polls))
    if view.poll_duration_s is not None:
        out[n.POLL_DURATION.name].add_metric([], view.poll_duration_s)
    if view.polled_at is not None:
        out[n.POLL_TIME.name].add_metric([], view.polled_at)
    return list(out.values())


class _Families(Collector):
    """A fixed list of families with the registry's `collect()`, for generate_latest."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def snapshot(view: FleetView) -> Snapshot:
    """The families for `view`, frozen and rendered for scrapes."""
    facts_at = tuple((name, st.facts_at) for name, st in view.nodes.items() if st.facts_at is not None)
    families = tuple(build(view))
    return Snapshot(families, facts_at, generate_latest(_Families(families)))


def facts_age(snap: Snapshot, now: float) -> Metric:
    """Seconds since each node's facts arrived, as of `now`."""
    age = _gauge(n.NODE_FACTS_AGE)
    for node, at in snap.facts_at:
        age.add_metric([node], max(0.0, now - at))
    return age


def exposition(snap: Snapshot, now: float) -> bytes:
    """The text exposition a scrape at `now` gets: the snapshot's, rendered once, plus facts age."""
    return snap.text + generate_latest(_Families([facts_age(snap, now)]))


class FleetCollector(Collector):
    """Yields the newest snapshot's families, plus facts age as of this scrape."""

    def __init__(self, source: Callable[[], Snapshot], clock: Callable[[], float]) -> None:
        self.source = source  # e.g. `lambda: poller.snapshot`: one attribute read, no lock
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        snap = self.source()
        yield from snap.families
        yield facts_age(snap, self.clock())


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics here")
            return
        body = self.server.render()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # a scrape every few seconds would flood stderr


class MetricsServer(ThreadingHTTPServer):
    """GET /metrics -> `render()`; one thread per connection, daemon threads (never blocks shutdown)."""

    daemon_threads = True

    def __init__(self, host: str, port: int, render: Callable[[], bytes]) -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.render = render
        super().__init__((host, port), _Handler)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="sparkfleet-metrics-http", daemon=True)
        t.start()
        return t
