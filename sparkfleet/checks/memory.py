"""MemAvailable at launch: the per-rank floor of the hardware class (GB10: 100 GiB, HLT-03), and on a
pin-hot lane the host floor the hook aborts under (GB300: 10 GiB, HLT-13, FM-43)."""

from __future__ import annotations

from sparkfleet.findings import Finding

from .context import CheckContext, gb, gib, part_error, unread
from .seeds import GB, GiB

CHECK = "memory"


def pin_hot(ctx: CheckContext) -> bool:
    """The lane runs the pin-hot hook (LCH-G4: PIN_MODE in the env)."""
    return "PIN_MODE" in ctx.profile.env


def check(ctx: CheckContext) -> list[Finding]:
    out: list[Finding] = []
    for r, f in ctx.ranks():
        node = r.node.name
        hw = ctx.hardware(r.node)
        if f.meminfo is None and (error := part_error(f, "meminfo")):
            out.append(unread(CHECK, node, error, "MemAvailable at or above the launch floor"))
            continue
        if f.meminfo is None:
            out.append(Finding(CHECK, "warn", "MemAvailable unknown: the node did not report /proc/meminfo",
                               "see the facts errors (`sparkfleet facts --node " + node + "`)", node=node,
                               observed="; ".join(f.errors) or "no meminfo"))
            continue
        avail = f.meminfo.mem_available_bytes
        dropped = ctx.caches_dropped.get(node) is True
        floors: list[tuple[int, str, str]] = []  # (bytes, what, catalog id)
        if hw.min_mem_available_gib is not None:
            floors.append((int(hw.min_mem_available_gib * GiB), f"per rank, {r.node.hardware} class",
                           "HLT-03"))
        if pin_hot(ctx):
            host = ctx.profile.expect.mem_available_floor_gb.get("host")
            if host is not None:
                floors.append((int(host * GB), "host floor, expect.mem_available_floor_gb.host", "HLT-13"))
            elif hw.host_floor_gib is not None:
                floors.append((int(hw.host_floor_gib * GiB), f"host floor of the pin-hot hook, {r.node.hardware} "
                               "class", "docs/failure-modes.md FM-43; HLT-13"))
        if not floors:
            out.append(Finding(CHECK, "ok", f"MemAvailable {gib(avail)}; no launch floor for class "
                               f"{r.node.hardware}" + ("" if pin_hot(ctx) else " without the pin-hot hook"),
                               node=node, observed=f"MemAvailable {gib(avail)} ({gb(avail)})",
                               expected="no floor"))
            continue
        floor, what, ref = max(floors)
        note = "" if dropped else "; the page cache was not dropped first"
        expected = f">= {gib(floor)} ({what}; {ref})"
        observed = f"MemAvailable {gib(avail)} of {gib(f.meminfo.mem_total_bytes)}" + (
            ", after dropping caches" if dropped else ", caches not dropped")
        if avail >= floor:
            out.append(Finding(CHECK, "ok", f"MemAvailable {gib(avail)} meets the floor", node=node,
                               observed=observed, expected=expected))
            continue
        remedy = f"free memory on {node} (stop what holds it) before launching; the launch refuses it ({ref})"
        if not dropped:
            remedy = (f"run `sparkfleet check --profile {ctx.profile.name} --drop-caches` to measure after "
                      f"dropping the page cache; if still low, " + remedy[0].lower() + remedy[1:])
        out.append(Finding(CHECK, "fail", f"MemAvailable {gib(avail)} is below {gib(floor)}{note}",
                           remedy, node=node, observed=observed, expected=expected))
    return out
