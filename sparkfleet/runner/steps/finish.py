"""The steps after the lane serves: expectations asserted, the answer gates, and where the record is written."""

from __future__ import annotations

from sparkfleet.findings import failed
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.runner.context import RunContext
from sparkfleet.runner.expect import assert_expectations
from sparkfleet.runner.gates_step import gates_step
from sparkfleet.runner.ops import StepGen, StepResult
from sparkfleet.runner.ranks import stop_launch_commands
from sparkfleet.runner.steps.preflight import gather_facts
from sparkfleet.schema.playbook import Step


def expect(ctx: RunContext, st: Step) -> StepGen:

    after = yield from gather_facts(ctx)
    if ctx.lane_shown_only:  # --dry-run: the facts were shown (or, with =facts, read); there are no logs to judge
        return StepResult("ok", "would assert the profile's expectations on the ranks' logs and the facts above "
                          "(KV tokens, MoE backend, node-local Engram, MemAvailable after load)")
    ctx.facts_after_load = after
    ctx.record.data["facts_after_load"] = {n: f.model_dump(mode="json") for n, f in after.items()
                                           if isinstance(f, NodeFacts)}
    findings = assert_expectations(ctx, after)
    ctx.record.data["expect"] = [f.as_dict() for f in findings]
    if failed(findings):
        yield stop_launch_commands(ctx)
        return StepResult("fail", "expectations not met; every rank of this launch was stopped", findings)
    warns = [f for f in findings if f.status == "warn"]
    return StepResult("warn" if warns else "ok", f"{len(findings)} expectation(s) checked", findings)


def gates(ctx: RunContext, st: Step) -> StepResult:

    if ctx.options.gate_args:
        st = st.model_copy(update={"args": {**st.args, **ctx.options.gate_args}})
    return gates_step(ctx, st)


def record(ctx: RunContext, st: Step) -> StepResult:
    """Where a playbook says its record is written; the runner writes it (runner/run.py execute) as the run
    ends, whatever the outcome and with or without this step, so a failed or interrupted run has one too.
    The step stays a valid name (shipped and user playbooks end with it) and says just that."""
    if ctx.options.dry_run:
        return StepResult("ok", f"run {ctx.record.run_id}: a dry run writes no record")
    return StepResult("ok", f"run {ctx.record.run_id}: the record is written as the run ends")
