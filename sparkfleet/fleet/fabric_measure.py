"""The measured fabric probe: every pair of a lane's ranks, over their fabric IPs, with a stdlib helper.

Each node runs `nodeside/fabric_probe.py` (nothing installed there): first a server on its own fabric
IP on every node, then rounds of disjoint pairs (a round-robin schedule, so no node is in two
measurements at once), where the lower rank of each pair drives: round-trip time at the decode
message sizes, then one-way bandwidth each way. The only addresses in any request are the lane's
fabric IPs, and the helper refuses any other peer; servers listen on the fabric IP only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkfleet.fleet.op import OpGen, Pending, run_ops
from sparkfleet.fleet.ops.base import on
from sparkfleet.fleet.ops.fabric_helper import HELPER, FabricProbe, why
from sparkfleet.fleet.ship import helper_ops
from sparkfleet.fleet.transport import Transport
from sparkfleet.placement import Rank
from sparkfleet.schema.inventory import Node

PORT = 29570  # the probe's TCP port on each fabric IP (not one of the lanes' 8410/29551 ...)
RTT_SIZES = (48 * 1024, 400 * 1024)  # a TP decode step's all-reduces are 48-400 KB (INV-28)
BULK_BYTES = 64 * 1024 * 1024
RTT_COUNT = 20
CONNECT_WAIT_S = 5.0
CONFIRM_ROUNDS = 3  # how many more times a suspect link is measured (see probe_ops)
CONFIRM_PAUSE_S = 1.0  # before the first re-measure, doubling before each next one (see probe_ops)


@dataclass
class Link:
    """One pair of ranks: `a` (the lower rank, which drove) and `b`, with what was measured."""

    a: str
    b: str
    a_ip: str
    b_ip: str
    port: int
    rtt_s: dict[str, float] = field(default_factory=dict)  # message size in bytes -> least round trip
    rtt_median_s: dict[str, float] = field(default_factory=dict)  # ... and the median of the samples
    a_to_b_bps: float | None = None
    b_to_a_bps: float | None = None
    error: str | None = None
    elapsed_s: float | None = None
    remeasured: bool = False  # looked off after the first pass: measured again, the better figures kept

    @property
    def name(self) -> str:
        return f"{self.a} <-> {self.b}"

    @property
    def bps(self) -> float | None:
        """The link's bandwidth: its slower direction (a link is as fast as its slow side)."""
        both = [x for x in (self.a_to_b_bps, self.b_to_a_bps) if x is not None]
        return min(both) if both else None


@dataclass
class ProbeRun:
    links: list[Link]
    port: int
    bulk_bytes: int
    rtt_sizes: tuple[int, ...]
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (node, why) outside any one link

    def as_dict(self) -> dict[str, Any]:
        return {"port": self.port, "bulk_bytes": self.bulk_bytes, "rtt_sizes": list(self.rtt_sizes),
                "links": [{**asdict(x), "name": x.name} for x in self.links],
                "problems": [{"node": n, "why": w} for n, w in self.problems]}


def rounds(n: int) -> list[list[tuple[int, int]]]:
    """Every pair of n ranks exactly once, in rounds of disjoint pairs (the circle method); (i, j) with i < j."""
    ids: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(ids)
    out = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            x, y = ids[k], ids[m - 1 - k]
            if x is not None and y is not None:
                pairs.append((min(x, y), max(x, y)))
        out.append(sorted(pairs))
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return [r for r in out if r]


def endpoints(ranks: list[Rank]) -> tuple[list[Node], list[tuple[str, str]]]:
    """The ranks' nodes that have a fabric IP (in rank order), and (node, why) for those that do not."""
    nodes, missing = [], []
    for r in ranks:
        if r.node.fabric_ip:
            nodes.append(r.node)
        else:
            missing.append((r.node.name, "no fabric_ip in the inventory: its links cannot be probed"))
    return nodes, missing


def plan_links(nodes: list[Node], port: int = PORT) -> list[list[Link]]:
    """The links to measure, round by round."""
    return [[Link(nodes[i].name, nodes[j].name, str(nodes[i].fabric_ip), str(nodes[j].fabric_ip), port)
             for i, j in rnd] for rnd in rounds(len(nodes))]


def drive_request(link: Link, allow: list[str], bulk_bytes: int, rtt_sizes: tuple[int, ...],
                  rtt_count: int = RTT_COUNT, connect_wait_s: float = CONNECT_WAIT_S) -> dict[str, Any]:
    return {"mode": "drive", "source": link.a_ip, "peer": link.b_ip, "port": link.port, "allow": allow,
            "rtt_sizes": list(rtt_sizes), "rtt_count": rtt_count, "bulk_bytes": bulk_bytes,
            "connect_wait_s": connect_wait_s}


def serve_request(node: Node, allow: list[str], sessions: int, port: int, timeout_s: float) -> dict[str, Any]:
    return {"mode": "serve", "bind": node.fabric_ip, "port": port, "allow": allow, "sessions": sessions,
            "timeout_s": timeout_s}


def command() -> str:
    """The command each node runs (the helper, verified by sha256); the request goes on its stdin."""
    return FabricProbe({}).command()


def server_life(links: list[Link]) -> float:
    """Servers answer any number of sessions until `quit`; this bounds their life should the quit be lost."""
    return 60.0 + 60.0 * len(links)


def _disjoint(links: list[Link]) -> list[list[Link]]:
    """Links in batches where no node is in two links (greedy, in order)."""
    batches: list[list[Link]] = []
    for x in links:
        for b in batches:
            if not any({x.a, x.b} & {y.a, y.b} for y in b):
                b.append(x)
                break
        else:
            batches.append([x])
    return batches


def _best(x: Link, doc: dict[str, Any]) -> None:
    """Merge a second measurement into a link: the better figure of each (noise only ever makes one worse)."""
    def hi(a: float | None, b: Any) -> float | None:
        vals = [v for v in (a, b) if isinstance(v, int | float)]
        return max(vals) if vals else None
    x.a_to_b_bps, x.b_to_a_bps = hi(x.a_to_b_bps, doc.get("out_bps")), hi(x.b_to_a_bps, doc.get("in_bps"))
    for k, v in (doc.get("rtt_s") or {}).items():
        x.rtt_s[k] = min(x.rtt_s.get(k, float(v)), float(v))
    for k, v in (doc.get("rtt_median_s") or {}).items():
        x.rtt_median_s[k] = min(x.rtt_median_s.get(k, float(v)), float(v))
    x.remeasured = True


def probe_ops(ranks: list[Rank], *, port: int = PORT, bulk_bytes: int = BULK_BYTES,
              rtt_sizes: tuple[int, ...] = RTT_SIZES, rtt_count: int = RTT_COUNT,
              connect_wait_s: float = CONNECT_WAIT_S,
              confirm: Callable[[ProbeRun], list[Link]] | None = None) -> OpGen[ProbeRun | None]:
    """Measure every pair of the ranks' fabric IPs, as the node commands it yields (the run's executor runs
    them, or under --dry-run shows each one: the servers, every round's drivers, the quit); a link that could
    not be measured carries its error. None under --dry-run (nothing measured).

    `confirm` picks the links that look off after the first pass (the verdict's suspects); each is
    measured again, alone, up to CONFIRM_ROUNDS times while it still looks off, keeping its best figures,
    so a moment of CPU contention on one node does not fail a healthy link while a slow link fails every
    time. On the lab's veths (two shared cores) one healthy link in a few dozen probes read 3x the others'
    48 KB round trip, twice in a row (CI, 2026-12-02): a second look was not enough; and with three looks
    back to back (within half a second) one read 2.4x four times (CI, 2026-12-05): what slowed it outlasted
    them; spread over 3.5 s, one link of a freshly started lab still failed in the next run. So the looks are
    spread over 7 s (CONFIRM_PAUSE_S, doubling; spent only while a link looks off, small beside a boot), and
    a slow link, slow whenever it is measured, still fails each time. What outlasted the looks was found
    later: the helper's ends slept in recv, and a link whose ends sat on different CPUs paid a wake-up per
    echo (nodeside/fabric_probe.py `_echoes` now spins; bench/fabric_rtt_cpus.py). The spread looks stay
    for what else a busy node can do to one measurement.
    """
    nodes, problems = endpoints(ranks)
    schedule = plan_links(nodes, port)
    run = ProbeRun([x for rnd in schedule for x in rnd], port, bulk_bytes, tuple(rtt_sizes), problems=problems)
    if not run.links:
        return run
    allow = [str(n.fabric_ip) for n in nodes]
    shipped = yield from helper_ops(HELPER, nodes, run=False)
    bad = {n: r for n, r in shipped.items() if not r.ok}
    for n, r in bad.items():
        run.problems.append((n, f"could not ship {HELPER}: {why(r)}"))
    if bad:
        for x in run.links:
            x.error = "not measured: " + ", ".join(sorted(bad)) + " cannot run the probe"
        return run
    timeout_s = server_life(run.links)
    serving = [n for n in nodes if any(x.b == n.name for x in run.links)]
    # the servers answer while the rounds run: left running (background), their answers read at the end
    serve = {n.name: FabricProbe(serve_request(n, allow, 0, port, timeout_s)) for n in serving}
    servers = yield on("fabric probe server", serve, timeout_s + 30, background=True,
                       stdin={n: op.stdin() for n, op in serve.items()})

    def measure(what: str, batch: list[Link]) -> OpGen[dict[str, tuple[Link, dict[str, Any] | str]] | None]:
        drive = {x.a: FabricProbe(drive_request(x, allow, bulk_bytes, tuple(rtt_sizes), rtt_count, connect_wait_s))
                 for x in batch}
        got = yield on(what, drive, 120.0 + bulk_bytes * 16 / 1e7, stdin={n: op.stdin() for n, op in drive.items()})
        return None if got is None else {x.name: (x, drive[x.a].parse(got[x.a])) for x in batch}

    closed = False  # closed while suspended (abandoned): nothing may be yielded any more
    try:
        for i, rnd in enumerate(schedule, 1):
            measured = yield from measure(f"fabric probe round {i}: " + ", ".join(x.name for x in rnd), rnd)
            for x, doc in (measured or {}).values():
                if isinstance(doc, str):
                    x.error = f"the probe on {x.a} failed: {doc}"
                    continue
                x.elapsed_s = doc.get("elapsed_s")
                x.rtt_s = {k: float(v) for k, v in (doc.get("rtt_s") or {}).items()}
                x.rtt_median_s = {k: float(v) for k, v in (doc.get("rtt_median_s") or {}).items()}
                x.a_to_b_bps, x.b_to_a_bps = doc.get("out_bps"), doc.get("in_bps")
                x.error = doc.get("error")
        for i in range(CONFIRM_ROUNDS):  # each a new connection: a healthy link's bad moment does not last
            suspects = [x for x in (confirm(run) if confirm and servers is not None else []) if x.error is None]
            if suspects:
                time.sleep(CONFIRM_PAUSE_S * 2 ** i)
            for batch in _disjoint(suspects):
                again = yield from measure("fabric probe again: " + ", ".join(x.name for x in batch), batch)
                for x, doc in (again or {}).values():
                    if isinstance(doc, dict) and not doc.get("error"):
                        _best(x, doc)
    except GeneratorExit:
        closed = True
        raise
    finally:  # also when a round raised (a transport's error, Ctrl-C): the servers must not hold the port
        if not closed:
            quit_ = {n.name: FabricProbe({"mode": "quit", "bind": n.fabric_ip, "port": port}) for n in serving}
            yield on("stop the fabric probe servers", quit_, 30.0, stdin={n: op.stdin() for n, op in quit_.items()})
    if servers is None:  # --dry-run: shown, not run
        return None
    assert isinstance(servers, Pending)
    servers.wait(30.0)
    for n in serving:
        r = servers.get(n.name)
        got = serve[n.name].parse(r) if r is not None else None
        doc = got if isinstance(got, dict) else None
        run.servers[n.name] = doc or {"error": why(r) if r is not None else "no answer"}
        if doc is not None and doc.get("error"):
            run.problems.append((n.name, str(doc["error"])))
            for x in run.links:
                if x.b == n.name and x.error:
                    x.error += f" ({n.name}: {doc['error']})"
        elif doc is None:
            run.problems.append((n.name, f"the probe's server did not report: {run.servers[n.name]['error']}"))
    return run


def probe(transport: Transport, ranks: list[Rank], **kw: Any) -> ProbeRun:
    """probe_ops run now (check --fabric, the bench): every pair measured."""
    run = run_ops(transport, [r.node for r in ranks], probe_ops(ranks, **kw))
    assert run is not None  # run_ops has no dry run
    return run
