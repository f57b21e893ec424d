"""KV sizing on a multi-rank vLLM lane: --gpu-memory-utilization alone sizes each rank's KV from what that
rank profiled, so the ranks differ and the pool follows the smallest (docs/failure-modes.md FM-16).

[003] "--gpu-memory-utilization 0.80 gave 4.1-6.7 GiB of KV depending on the rank, and the pool follows
the smallest ... --kv-cache-memory-bytes makes every rank identical." The lanes that shipped the seeds'
figures (dcp1, dcp2) set --kv-cache-memory-bytes; the others are kept as the seeds ran them, so this is a
warning that says so, not a refusal.
"""

from __future__ import annotations

from sparkfleet.findings import Finding

from .context import CheckContext, gib
from .earlyoom import kv_bytes

CHECK = "kv-sizing"
REF = "docs/failure-modes.md FM-16"


def check(ctx: CheckContext) -> list[Finding]:
    p = ctx.profile
    ranks = len(ctx.plan.ranks)
    if p.engine != "vllm" or ranks < 2:
        return []
    head = ctx.head.name
    kv = kv_bytes(ctx)
    if kv is not None:
        return [Finding(CHECK, "ok", f"KV pinned at {gib(kv)} on each of the {ranks} ranks "
                        "(--kv-cache-memory-bytes)", node=head, field="flags.--kv-cache-memory-bytes",
                        observed=f"--kv-cache-memory-bytes {kv}", expected="the same KV on every rank")]
    gmu = p.flags.get("--gpu-memory-utilization")
    how = f"--gpu-memory-utilization {gmu}" if gmu is not None else "vLLM's default --gpu-memory-utilization"
    return [Finding(CHECK, "warn", f"KV sized by {how} on {ranks} ranks: each rank gets what it profiled "
                    "(4.1-6.7 GiB across the four Sparks at 0.80) and the pool follows the smallest rank",
                    "set flags.--kv-cache-memory-bytes so every rank holds the same KV (the seeds shipped "
                    f"8 GiB on DCP1, 6 GiB on DCP2; {REF})", node=head, field="flags.--kv-cache-memory-bytes",
                    observed=f"{how}, no --kv-cache-memory-bytes", expected="--kv-cache-memory-bytes set")]
