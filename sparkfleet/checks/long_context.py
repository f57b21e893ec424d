"""Full-1M context: what the seeds validated and what they did not.

FM-69: the v12 flags (--cpu-offload-gb 60 --gpu-memory-utilization 0.97) give "KV 4.89 GiB, 2.2x at 1M";
"For more than two concurrent full-1M requests use v11: --cpu-offload-gb 70 --gpu-memory-utilization
0.94" ([000]). Which requests arrive is the client's business, so a lane below v11's offload at 1M with
more than two seats is a warning that names the v11 lane, not a refusal (v23, the reference, is one).
FM-30: 1M context on vLLM Spark "after the top-k fix has not been re-run" ([002]): unvalidated.
"""

from __future__ import annotations

from sparkfleet.findings import Finding

from .context import CheckContext
from .graphs import FULL_CONTEXT, number

CHECK = "long-context"
V11_OFFLOAD_GB = 70  # [000] v11: --cpu-offload-gb 70 --gpu-memory-utilization 0.94
FULL_1M_AT_ONCE = 2  # [000] "more than two concurrent full-1M requests"


def check(ctx: CheckContext) -> list[Finding]:
    p = ctx.profile
    mml = number(p.flags.get("--max-model-len"))
    if p.engine != "vllm" or mml is None or mml < FULL_CONTEXT:
        return []
    head, hw = ctx.head.name, {r.node.hardware for r in ctx.plan.ranks}
    if "gb10" in hw:
        return [Finding(CHECK, "warn", f"--max-model-len {int(mml)} on vLLM across the Sparks: 1M context after "
                        "the top-k fix has not been re-run on this stack (boot 7 died on a 32K request at 1M)",
                        "treat the lane's 1M context as unvalidated until a needle at 1M passes "
                        "(docs/failure-modes.md FM-30)", node=head, field="flags.--max-model-len",
                        observed=f"--max-model-len {int(mml)}", expected="a context validated on this stack")]
    if "gb300" not in hw:
        return []
    offload = number(p.flags.get("--cpu-offload-gb"))
    seats = number(p.flags.get("--max-num-seqs"))
    if offload is None or offload >= V11_OFFLOAD_GB or (seats is not None and seats <= FULL_1M_AT_ONCE):
        return [Finding(CHECK, "ok", f"--max-model-len {int(mml)} with --cpu-offload-gb "
                        f"{offload if offload is None else f'{offload:g}'}"
                        + (f", {int(seats)} seat(s)" if seats is not None else ""), node=head,
                        observed=f"--cpu-offload-gb {offload}", expected=f">= {V11_OFFLOAD_GB} for more than "
                        f"{FULL_1M_AT_ONCE} concurrent full-1M requests")]
    gmu = p.flags.get("--gpu-memory-utilization")
    return [Finding(CHECK, "warn", f"a v12-class lane (--cpu-offload-gb {offload:g}, --gpu-memory-utilization "
                    f"{gmu}) at {int(mml)} context holds about two full-1M requests at once (v12: KV 4.89 GiB, "
                    "2.2x at 1M), and this lane takes "
                    + (f"{int(seats)} seats" if seats is not None else "vLLM's default number of seats"),
                    "send more than two concurrent full-1M requests to v11 (`sparkfleet up --profile gb300-v11`: "
                    "--cpu-offload-gb 70 --gpu-memory-utilization 0.94; docs/failure-modes.md FM-69)", node=head,
                    field="flags.--cpu-offload-gb", observed=f"--cpu-offload-gb {offload:g}",
                    expected=f">= {V11_OFFLOAD_GB} for more than {FULL_1M_AT_ONCE} concurrent full-1M requests")]
