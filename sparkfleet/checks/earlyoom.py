"""earlyoom: running on every node (INV-14), and its SIGTERM line below the lane's MemAvailable after load.

The seeds' 10 GiB-KV lane left the head at 2 GB MemAvailable against earlyoom's ~2.4 GB (FM-15,
HLT-24): earlyoom would have killed the engine under load. The predicted MemAvailable after load is,
in order: the headroom the profile measured for the rank's role (memory.headroom_after_load_gb); else,
on unified memory, MemTotal − model − KV budget (an upper bound); else no prediction (warn).
"""

from __future__ import annotations

from sparkfleet.findings import Finding
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.placement import Rank

from .context import CheckContext, gb, gib, part_error, role_value, unread
from .seeds import EARLYOOM_MARGIN_BYTES, GB, GiB

CHECK = "earlyoom"
FM15 = "10 GiB of KV left the head at 2 GB and was refused; 8 GiB left 9 GB (docs/failure-modes.md FM-15; HLT-24)"


def kv_bytes(ctx: CheckContext) -> int | None:
    """The KV budget from --kv-cache-memory-bytes, when the lane sets one."""
    value = ctx.profile.flags.get("--kv-cache-memory-bytes")
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def predict(ctx: CheckContext, r: Rank, f: NodeFacts) -> tuple[int | None, str]:
    """(predicted MemAvailable after load in bytes, how it was predicted); None when it cannot be."""
    p = ctx.profile
    measured = role_value(p.memory.headroom_after_load_gb, r)
    if measured is not None:
        key, value = measured
        return int(value * GB), f"measured headroom after load (memory.headroom_after_load_gb.{key}: {value:g} GB)"
    hw = ctx.hardware(r.node)
    if hw.host_memory_gib is not None:
        # separate host RAM (GB300 Grace): the model's GiB are GPU memory and say nothing about MemAvailable
        return None, ("no prediction: the profile has no memory budget for host memory "
                      "(set memory.headroom_after_load_gb from a measured boot)")
    model = p.memory.model_gib_per_rank_max or p.memory.model_gib_per_rank  # the widest slice binds
    if model is None or f.meminfo is None:
        return None, ("no prediction: the profile has no memory budget "
                      "(memory.headroom_after_load_gb or memory.model_gib_per_rank)")
    kv = kv_bytes(ctx)
    predicted = f.meminfo.mem_total_bytes - int(model * GiB) - (kv or 0)
    how = (f"MemTotal {gib(f.meminfo.mem_total_bytes)} - model {model:g} GiB"
           + (f" - KV {gib(kv)}" if kv else " (no --kv-cache-memory-bytes)")
           + "; an upper bound: CUDA graphs, activations and the OS come on top")
    return predicted, how


def check(ctx: CheckContext) -> list[Finding]:
    out: list[Finding] = []
    for r, f in ctx.ranks():
        node = r.node.name
        hw = ctx.hardware(r.node)
        eo = f.earlyoom
        want_pct = f"-m {hw.earlyoom_percent:g}" if hw.earlyoom_percent is not None else "-m PERCENT"
        # the process list unread: earlyoom would read as "not running" (a false fail)
        error = part_error(f, "earlyoom") if eo is None else part_error(f, "processes")
        if error:
            out.append(unread(CHECK, node, error, "earlyoom running"))
            continue
        if eo is None:
            out.append(Finding(CHECK, "warn", "earlyoom state unknown: the node did not report it",
                               f"see the facts errors (`sparkfleet facts --node {node}`)", node=node,
                               observed="; ".join(f.errors) or "not reported", expected="earlyoom running"))
            continue
        if not eo.running:
            out.append(Finding(
                CHECK, "fail", "earlyoom is not running: when memory runs out, the watchdogs reset the node",
                f"start it on {node}: EARLYOOM_ARGS=\"{want_pct}\" in /etc/default/earlyoom, then "
                "`systemctl enable --now earlyoom` (INV-13, INV-14)",
                node=node, observed="not running", expected="earlyoom running"))
            continue
        total = f.meminfo.mem_total_bytes if f.meminfo else None
        threshold = eo.sigterm_threshold_bytes
        pct = eo.mem_term_percent
        if threshold is None and total is not None and pct is not None:
            threshold = int(total * pct / 100)
        predicted, how = predict(ctx, r, f)
        floor = role_value(ctx.profile.expect.mem_available_floor_gb, r)
        line = f"SIGTERM at MemAvailable <= {gb(threshold)}" + (f" (-m {pct:g}%)" if pct is not None else "")
        if threshold is None:
            out.append(Finding(CHECK, "warn", "earlyoom runs, but its SIGTERM threshold is unknown",
                               "see the facts errors", node=node, observed=f"pid {eo.pid}, {line}"))
            continue
        required = threshold + EARLYOOM_MARGIN_BYTES
        why = f"{gb(threshold)} SIGTERM line + {gb(EARLYOOM_MARGIN_BYTES)} margin"
        if floor is not None and floor[1] * GB > required:
            required = int(floor[1] * GB)
            why = f"expect.mem_available_floor_gb.{floor[0]}: {floor[1]:g} GB"
        expected = f"predicted MemAvailable after load >= {gb(required)} ({why})"
        if predicted is None:
            out.append(Finding(CHECK, "warn", how, "record the MemAvailable a measured boot left in "
                               "memory.headroom_after_load_gb (head/workers) so the margin can be checked",
                               node=node, observed=f"running, {line}", expected=expected))
            continue
        observed = f"predicted {gb(predicted)} after load ({how}); earlyoom {line}"
        if predicted >= required:
            out.append(Finding(CHECK, "ok", f"running; predicted MemAvailable after load {gb(predicted)} "
                               f"clears its SIGTERM line {gb(threshold)}", node=node, observed=observed,
                               expected=expected))
            continue
        remedy = f"lower the lane's memory use (--kv-cache-memory-bytes): {FM15}"
        if hw.earlyoom_percent is not None and pct is not None and pct > hw.earlyoom_percent:
            remedy += (f"; earlyoom runs at -m {pct:g}, above the {r.node.hardware} class's "
                       f"{hw.earlyoom_percent:g}%: set EARLYOOM_ARGS=\"{want_pct}\" in /etc/default/earlyoom")
        out.append(Finding(CHECK, "fail", f"refused: predicted MemAvailable after load {gb(predicted)} is below "
                           f"{gb(required)}; earlyoom would kill the engine under load", remedy, node=node,
                           observed=observed, expected=expected))
    return out
