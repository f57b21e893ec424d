"""CUDA-graph memory on the Station's offloaded lanes: combinations the seeds could not boot.

FM-46: adaptive verification (the V2 runner's varlen FULL decode graphs, ~6.5 GiB against ~1 GiB of graphs
on V1) "still cannot boot at off60 on this box": the capture pushes experts into Grace. FM-47: vLLM charges
graph memory against KV, "the KV pool cannot pay for graphs much above 512 tokens", and P1 "reopens only
when bundled with an HBM source (shorter max-model-len or nvfp4_ds_mla KV), with a capture cap of 512 or
1024" ([000]). Both are refused before launch (docs/failure-modes.md FM-46, FM-47).
"""

from __future__ import annotations

from sparkfleet.engines.vllm import capture_sizes, speculative
from sparkfleet.findings import Finding

from .context import CheckContext

CHECK = "graph-memory"
OFFLOAD_NO_ADAPTIVE_GB = 60  # [000] "Adaptive still cannot boot at off60"
CAPTURE_CAP_KV = 512  # [000] "the KV pool cannot pay for graphs much above 512 tokens"
CAPTURE_CAP_HBM = 1024  # [000] "with a capture cap of 512 or 1024", and only with an HBM source
FULL_CONTEXT = 1048576  # the Station lanes' --max-model-len (1M), against which "shorter" is read
HBM_KV_DTYPE = "nvfp4_ds_mla"


def number(value: object) -> float | None:
    """A flag's numeric value, or None when it is unset or not a number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def station_vllm(ctx: CheckContext) -> bool:
    return ctx.profile.engine == "vllm" and any(r.node.hardware == "gb300" for r in ctx.plan.ranks)


def hbm_source(ctx: CheckContext) -> str | None:
    """What frees HBM for bigger graphs, as the seeds name it; None when the lane has neither."""
    flags = ctx.profile.flags
    if str(flags.get("--kv-cache-dtype", "")) == HBM_KV_DTYPE:
        return f"--kv-cache-dtype {HBM_KV_DTYPE}"
    mml = number(flags.get("--max-model-len"))
    if mml is not None and mml < FULL_CONTEXT:
        return f"--max-model-len {int(mml)} (shorter than {FULL_CONTEXT})"
    return None


def check(ctx: CheckContext) -> list[Finding]:
    if not station_vllm(ctx):
        return []
    p, head = ctx.profile, ctx.head.name
    out: list[Finding] = []
    spec = speculative(p) or {}
    offload = number(p.flags.get("--cpu-offload-gb"))
    if spec.get("enable_adaptive_verification") is True and offload is not None and offload <= OFFLOAD_NO_ADAPTIVE_GB:
        out.append(Finding(CHECK, "fail", f"adaptive verification at --cpu-offload-gb {offload:g}: its varlen graph "
                           "capture (~6.5 GiB) pushes experts into Grace and the seeds' lane could not boot at off60",
                           "turn enable_adaptive_verification off (static k or a k-schedule); it booted only with "
                           "~6 GiB more experts in Grace, and then missed the bars (docs/failure-modes.md FM-46)",
                           node=head,
                           field="flags.--speculative-config", observed=f"enable_adaptive_verification: true, "
                           f"--cpu-offload-gb {offload:g}", expected="adaptive verification off at off60"))
    sizes, path = capture_sizes(p)
    top = max(sizes) if sizes else None
    if top is not None and top > CAPTURE_CAP_KV:
        source = hbm_source(ctx)
        cap = CAPTURE_CAP_HBM if source else CAPTURE_CAP_KV
        if top > cap:
            why = (f"with {source} the seeds' cap is {CAPTURE_CAP_HBM}" if source else
                   "without an HBM source (a shorter --max-model-len or nvfp4_ds_mla KV) the KV pool cannot pay "
                   f"for graphs much above {CAPTURE_CAP_KV} tokens")
            out.append(Finding(CHECK, "fail", f"CUDA graphs captured up to {top} tokens: vLLM charges graph memory "
                               f"against KV, and {why}",
                               f"cap the capture list at {cap} (the list is also part of the FlashInfer autotune "
                               "hash: a new list is a new first boot; docs/failure-modes.md FM-47)", node=head,
                               field=".".join(path[:2]), observed=f"largest capture size {top}",
                               expected=f"<= {cap}"))
    if not out:
        out.append(Finding(CHECK, "ok", "graph capture fits the offloaded lane"
                           + (f" (largest capture size {top})" if top is not None else ""), node=head,
                           observed=f"largest capture size {top}" if top is not None else "no capture list",
                           expected=f"<= {CAPTURE_CAP_KV} without an HBM source; no adaptive verification at off60"))
    return out
