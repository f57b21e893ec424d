"""After the lane serves: the profile's expectations against what the logs and the nodes say. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkfleet.findings import Finding
from sparkfleet.fleet.nodefacts import NodeFacts

if TYPE_CHECKING:
    from sparkfleet.runner.context import RunContext

GB = 1e9
# Margin above earlyoom's SIGTERM threshold that MemAvailable must keep after load. The seeds' refused
# lane sat at 2 GB against ~2.4 GB (FM-15); the head floor of 5 GB (HLT-23) is the profile's to set.
EARLYOOM_MARGIN_BYTES = int(1 * GB)


def assert_expectations(ctx: RunContext, after: dict) -> list[Finding]:
    p = ctx.profile
    e = p.expect
    out: list[Finding] = []
    head_rank = 0
    kv = {r: lf.kv_tokens for r, lf in ctx.log_facts.items() if lf.kv_tokens is not None}
    lo, hi = (e.kv_tokens.min, e.kv_tokens.max) if e.kv_tokens is not None else (None, None)
    point = ctx.options.restore_point
    if point and point.get("kv_tokens"):  # a restore accepts the recorded value and the profile's range
        rec = point["kv_tokens"]
        lo, hi = min(rec, lo if lo is not None else rec), max(rec, hi if hi is not None else rec)
    if lo is not None and hi is not None:
        got = kv.get(head_rank) if head_rank in kv else (min(kv.values()) if kv else None)
        want = f"{lo:,}" + (f"..{hi:,}" if hi != lo else "")
        if got is None:
            out.append(Finding("kv-tokens", "fail", "no 'GPU KV cache size' line in the logs", expected=want))
        elif not lo <= got <= hi:
            out.append(Finding("kv-tokens", "fail", f"KV cache {got:,} tokens is outside the expected range {want}",
                               "a changed budget or graph-capture size moved it; look before serving (HLT-20)",
                               observed=f"{got:,}", expected=want))
        else:
            note = f" (recorded {point['kv_tokens']:,})" if point and point.get("kv_tokens") else ""
            out.append(Finding("kv-tokens", "ok", f"KV cache {got:,} tokens{note}", observed=f"{got:,}", expected=want))
    if e.moe_backend:
        lines = {r: lf.moe_backend_line for r, lf in ctx.log_facts.items()}
        missing = [r for r, line in sorted(lines.items()) if line is None or e.moe_backend not in line]
        if missing:
            out.append(Finding("moe-backend", "fail", f"ranks {missing} did not log {e.moe_backend!r}",
                               "the b12x kernels are not in use (HLT-21)", expected=e.moe_backend))
        else:
            out.append(Finding("moe-backend", "ok", e.moe_backend))
    if e.engram_node_local and p.engram is not None:
        out += engram_node_local(ctx)
    seen = ctx.log_facts[head_rank].expected_seen if head_rank in ctx.log_facts else {}
    for line in e.log_lines:  # matched on every head line as it was read (engines/logs.py feed), not a tail
        if line not in seen:
            out.append(Finding("log-line", "fail", f"the head never logged {line!r}", expected=line))
    out += memory_after_load(ctx, after)
    return out


def engram_node_local(ctx: RunContext) -> list[Finding]:
    """expect.engram_node_local: every rank outside engram.nfs_ranks logged 'read from node-local'. A rank that
    read NFS rows although its copy qualified before launch (the engine found its bytes short or changed) fails."""
    assert ctx.profile.engram is not None
    nfs_ok = set(ctx.profile.engram.nfs_ranks)
    nodes = {r.rank: r.node.name for r in ctx.plan.ranks}
    nfs_layers = {r: nfs_read(lf) for r, lf in ctx.log_facts.items()}
    on_nfs = [r for r, layers in sorted(nfs_layers.items()) if layers is not None]
    out = [Finding("engram-local", "fail", f"rank {r} ({nodes.get(r, '?')}) read Engram "
                   + (f"layer(s) {', '.join(map(str, nfs_layers[r]))}" if nfs_layers[r] else "rows")
                   + " over NFS, not from its node-local copy (expect.engram_node_local; 6-8 ms a step against 3, "
                   "ENG-16)",
                   "its manifest qualified before launch, so the copy's bytes are not what it claims (short, "
                   f"changed): copy again: sparkfleet engram-local --profile {ctx.profile.name} --node "
                   f"{nodes.get(r, 'NODE')} --force",
                   node=nodes.get(r), observed="read from the model directory", expected="read from node-local")
           for r in on_nfs if r not in nfs_ok]
    listed = [r for r in on_nfs if r in nfs_ok]
    if not out:
        out.append(Finding("engram-local", "ok", "every rank logged 'read from node-local'" if not listed
                           else f"every other rank logged 'read from node-local'; ranks {listed} read the model "
                           "directory (engram.nfs_ranks)"))
    return out


def nfs_read(lf) -> list[int] | None:
    """None when the rank read Engram node-local: every layer's boot line says so (engines that print one per
    layer), else its one 'read from node-local' line; else the layers read over NFS ([] when not per layer)."""
    if lf.engram_layer_local:
        layers = sorted(k for k, local in lf.engram_layer_local.items() if not local)
        return layers or None
    return None if lf.engram_node_local else []


def memory_after_load(ctx: RunContext, after: dict) -> list[Finding]:
    """MemAvailable on every node: at or above its floor and clear of earlyoom's threshold (HLT-23/24)."""
    floors = ctx.profile.expect.mem_available_floor_gb
    out = []
    for r in ctx.plan.ranks:
        f = after.get(r.node.name)
        if not isinstance(f, NodeFacts) or f.meminfo is None:
            out.append(Finding("mem-after-load", "warn", "no memory facts after load", node=r.node.name))
            continue
        avail = f.meminfo.mem_available_bytes
        role = "head" if r.rank == 0 else "workers"
        floor = floors.get(role)
        threshold = f.earlyoom.sigterm_threshold_bytes if f.earlyoom else None
        if floor is not None and avail < floor * GB:
            out.append(Finding("mem-after-load", "fail", f"MemAvailable {avail / GB:.1f} GB under the {role} floor",
                               "lower the KV budget (the seeds' 10 GiB lane left the head at 2 GB)",
                               node=r.node.name, observed=f"{avail / GB:.1f} GB", expected=f">= {floor} GB"))
        elif threshold is not None and avail < threshold + EARLYOOM_MARGIN_BYTES:
            out.append(Finding("mem-after-load", "fail", f"MemAvailable is within {EARLYOOM_MARGIN_BYTES / GB:.0f} GB "
                               "of earlyoom's SIGTERM threshold",
                               "lower the KV budget", node=r.node.name, observed=f"{avail / GB:.1f} GB",
                               expected=f">= {(threshold + EARLYOOM_MARGIN_BYTES) / GB:.1f} GB"))
        else:
            out.append(Finding("mem-after-load", "ok", f"MemAvailable {avail / GB:.1f} GB", node=r.node.name))
    return out
