"""The fabric probe's verdict: each link against the median of the lane's other links.

A healthy lane's links are alike (same NICs, same switch), so a link whose bandwidth is more than the
hardware class's ratio (default 2x) below the median of the others, or whose round trip is that much
above it, is the one slowing every all-reduce: it fails, named `nodeA <-> nodeB`. A link that could
not be measured fails with the pair and the port. With one link there is nothing to compare: its
figures are shown, not judged.
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import median

from sparkfleet.findings import Finding
from sparkfleet.fleet.fabric_measure import Link, ProbeRun

CHECK = "fabric-probe"
DEFAULT_RATIO = 2.0


def kib(size: str) -> str:
    return f"{int(size) // 1024} KB"


def figures(x: Link) -> str:
    rtt = ", ".join(f"RTT {kib(k)} {v * 1e3:.3g} ms" for k, v in x.rtt_s.items())
    bw = (f"{x.a}->{x.b} {gbps(x.a_to_b_bps)}, {x.b}->{x.a} {gbps(x.b_to_a_bps)}")
    again = " (measured again, the best figures)" if x.remeasured else ""
    return (f"{rtt}; {bw}" if rtt else bw) + again


def gbps(bps: float | None) -> str:
    return "?" if bps is None else f"{bps / 1e9:.3g} Gb/s"


def verdict(run: ProbeRun, ratio_of: Callable[[Link], float | None]) -> list[Finding]:
    """Findings per link (node None: a link belongs to two nodes) and per node problem."""
    out: list[Finding] = []
    for node, why in run.problems:
        out.append(Finding(CHECK, "fail", why, "check the node's fabric address and that python3 runs there",
                           node=node))
    measured = [x for x in run.links if x.error is None and x.bps is not None]
    for x in run.links:
        ratio = ratio_of(x) or DEFAULT_RATIO
        if x.error is not None or x.bps is None:
            out.append(Finding(CHECK, "fail", f"{x.name}: {x.error or 'no bandwidth measured'}",
                               f"check that {x.b_ip} is {x.b}'s fabric address and that nothing blocks TCP port "
                               f"{x.port} between {x.a_ip} and {x.b_ip}", observed=f"port {x.port}",
                               expected=f"{x.a} ({x.a_ip}) reaches {x.b} ({x.b_ip}) on port {x.port}"))
            continue
        others = [o for o in measured if o is not x]
        if not others:
            out.append(Finding(CHECK, "ok", f"{x.name}: one link, nothing to compare it with (not judged)",
                               observed=figures(x)))
            continue
        bw_median = median(o.bps for o in others if o.bps is not None)
        slow = []
        if x.bps < bw_median / ratio:
            slow.append(f"bandwidth {gbps(x.bps)} is {bw_median / x.bps:.1f}x below the others' median "
                        f"{gbps(bw_median)}")
        for size, t in x.rtt_s.items():
            theirs = [o.rtt_s[size] for o in others if size in o.rtt_s]
            if theirs and t > median(theirs) * ratio:
                slow.append(f"RTT at {kib(size)} {t * 1e3:.3g} ms is {t / median(theirs):.1f}x the others' median "
                            f"{median(theirs) * 1e3:.3g} ms")
        expected = f"within {ratio:g}x of the median of the lane's other links"
        if slow:
            out.append(Finding(CHECK, "fail", f"{x.name}: " + "; ".join(slow),
                               "check both ends' cables, transceivers, switch ports, MTU and qdisc "
                               "(`tc qdisc show`); the slowest link sets every all-reduce's pace",
                               observed=figures(x), expected=expected))
        else:
            out.append(Finding(CHECK, "ok", f"{x.name}: {gbps(x.bps)}, in line with the other links",
                               observed=figures(x), expected=expected))
    return out


def suspects(ratio_of: Callable[[Link], float | None]) -> Callable[[ProbeRun], list[Link]]:
    """For probe(confirm=...): the measured links the verdict would fail now (to be measured again)."""
    def pick(run: ProbeRun) -> list[Link]:
        bad = {f.message.split(":", 1)[0] for f in verdict(run, ratio_of) if f.status == "fail"}
        return [x for x in run.links if x.name in bad and x.error is None]
    return pick
