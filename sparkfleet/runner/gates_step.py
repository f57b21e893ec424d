"""The `gates` step of `up`: the profile's gates against the lane just started (sparkfleet/gates/run.py)."""

from __future__ import annotations

from sparkfleet.findings import Finding
from sparkfleet.gates import soak
from sparkfleet.gates.result import GateResult
from sparkfleet.gates.run import (
    GateSetupError,
    api_key_for,
    default_gates,
    options_from_args,
    profile_args,
    run_gates,
    summary,
)
from sparkfleet.runner.context import RunContext
from sparkfleet.runner.ops import StepResult
from sparkfleet.runner.ranks import stop_launch, stopped_every_rank
from sparkfleet.schema.playbook import Step


def gates_step(ctx: RunContext, st: Step) -> StepResult:
    """Run the profile's gates against the lane just started; a failure fails the `up` and stops every rank
    it started (an `up` nobody watches must not go on serving wrong answers). --keep-on-gate-failure leaves
    the lane up for inspection, said loudly in the output and in the record.
    """
    profile = ctx.profile
    base = ctx.endpoint()
    try:
        only, options = options_from_args({**profile_args(profile), **st.args})
        key = api_key_for(profile)
    except GateSetupError as exc:
        return StepResult("fail", str(exc))
    if key:
        ctx.record.secret_values.add(key)
    names = only or default_gates(profile)
    if ctx.lane_shown_only:  # --dry-run: nothing serves to ask (the tunnel, if any, was shown)
        return StepResult("ok", f"would run gates {', '.join(names)} against {base}")
    roles = [(r.node, r.role if r.role == "head" else "workers") for r in ctx.plan.ranks]
    options.api_key = key
    options.mem_sampler = soak.fleet_sampler(ctx.executor, roles, profile.expect.mem_available_floor_gb)

    def started(name: str) -> None:
        ctx.events.emit("message", text=f"gate {name} ...")

    def finished(r: GateResult) -> None:
        ctx.events.emit("message", text=f"gate {r.name}: {r.status} ({r.elapsed_s:.1f} s) {r.summary}")

    results = run_gates(base, profile, only, options, on_result=finished, on_start=started)
    ctx.gate_results = list(results)
    ctx.record.data["gates"] = {"endpoint": base, "results": [r.as_dict() for r in results]}
    failed = [r for r in results if r.status == "fail"]
    data = {"results": {r.name: r.status for r in results}}
    if not failed:
        return StepResult("ok", summary(results), data=data)
    findings = [Finding(f"gate {r.name}", "fail", r.summary, node=ctx.head.name,
                        observed="; ".join(f"{c.name}: {c.got}" for c in r.failures())[:500] or None)
                for r in failed]
    text = summary(results)
    if ctx.options.stop_on_gate_failure:
        text += stopped_every_rank(stop_launch(ctx))
    else:
        left = ", ".join(f"rank {s.rank} on {s.node}" for s in ctx.started)
        warning = (f"WARNING: gate(s) {', '.join(r.name for r in failed)} failed and the lane is LEFT RUNNING at "
                   f"{base} ({left}), answering as it failed, because of --keep-on-gate-failure; stop it with "
                   f"`sparkfleet down --profile {profile.name}`")
        ctx.events.emit("message", text=warning)
        ctx.record.data["gates"]["left_running"] = {"endpoint": base, "ranks": [
            {"node": s.node, "rank": s.rank, "container": s.container} for s in ctx.started], "warning": warning}
        text += f"; the lane is LEFT RUNNING at {base} (--keep-on-gate-failure): sparkfleet down --profile " \
                f"{profile.name}"
    return StepResult("fail", text, findings, data)
