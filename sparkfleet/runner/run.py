"""Run a playbook for one lane: lock the fleet, run the steps in order, record everything."""

from __future__ import annotations

import time

from sparkfleet.fleet.connect import transport_for
from sparkfleet.fleet.op import NoConnection
from sparkfleet.opsdir import Spec
from sparkfleet.plan import make_plan
from sparkfleet.root import state_dir
from sparkfleet.runner.context import RunContext, RunOptions
from sparkfleet.runner.events import Events
from sparkfleet.runner.lock import FleetLock, NodeLock
from sparkfleet.runner.ops import StepResult, drive
from sparkfleet.runner.ranks import stop_launch
from sparkfleet.runner.record import Record, new_run_id
from sparkfleet.runner.served import finish, template_hashes
from sparkfleet.runner.steps import DRY, STEPS
from sparkfleet.schema.inventory import Inventory
from sparkfleet.schema.load import Loaded
from sparkfleet.schema.playbook import Playbook


def execute(spec: Spec, loaded: Loaded, inventory: Inventory, playbook: Playbook, options: RunOptions,
            events: Events, command: str) -> Record:
    """Run every step until one fails; the record is written whatever happens (also on Ctrl-C)."""
    state = state_dir()
    run_id = new_run_id()
    record = Record(run_id, playbook.name, loaded.profile.name, inventory.name, command)
    plan = make_plan(loaded, inventory, playbook, spec.root, run_id=run_id)
    record.data["plan_findings"] = [f.as_dict() for f in plan.findings]
    record.data["overrides"] = plan.overrides  # -o KEY=VALUE: restore reloads the profile with them

    record.profile_merged = loaded.profile.model_dump(mode="json")
    record.template_hashes = template_hashes(spec.root)
    events.emit("run", text=f"{playbook.name} {loaded.profile.name} (run {run_id}"
                + (", dry run" if options.dry_run else "") + ")", run_id=run_id)
    if plan.refused:
        record.outcome, record.reason = "refused", "the lane is refused by its rules"
        events.findings("plan", [f for f in plan.findings if f.status == "fail"])
        events.step("plan", "fail", record.reason)
        record.finished = time.time()
        if not options.dry_run:
            record.write(state / "runs")
        return record
    with FleetLock(state / "locks" / f"{inventory.name}.lock", command):
        # --dry-run opens no connection at all: a transport that refuses any use (--dry-run=facts reads)
        transport = NoConnection() if options.dry_run and not options.dry_reads else transport_for(
            [r.node for r in plan.ranks])
        ctx = RunContext(spec, loaded, inventory, playbook, plan, transport, record, events, options, state)
        lock = NodeLock(ctx)
        try:
            lock.take()  # refused (Busy) while another controller holds a node of the lane: nothing was done
        except BaseException:
            transport.close()
            raise
        try:
            _steps(ctx)
        except KeyboardInterrupt:
            record.outcome, record.reason = "interrupted", "interrupted by the user"
            if ctx.started and not options.dry_run:
                stop_launch(ctx)
                record.reason += "; every rank of this launch was stopped"
            events.step("interrupt", "fail", record.reason)
        finally:
            lock.release()
            ctx.close()
            transport.close()
            record.finished = time.time()
            if not options.dry_run:
                path = record.write(state / "runs")
                events.emit("message", text=f"record: {path}")
    return record


def _steps(ctx: RunContext) -> None:
    record, events = ctx.record, ctx.events
    for st in ctx.playbook.steps:
        name = st.step + (f":{st.role}" if st.role else "")
        events.step(name, "start")
        t0 = time.time()
        if ctx.options.dry_run and st.step in DRY:  # a step that needs the live lane: say what it would do
            result = StepResult("ok", DRY[st.step](ctx, st))
        else:
            result = drive(ctx, STEPS[st.step](ctx, st))
        elapsed = round(time.time() - t0, 3)
        record.steps.append({"step": name, "status": result.status, "summary": result.summary,
                             "elapsed_s": elapsed, "findings": [f.as_dict() for f in result.findings],
                             **({"data": result.data} if result.data else {})})
        if result.findings:
            events.findings(name, result.findings)
        events.step(name, result.status, result.summary, elapsed_s=elapsed)
        if result.status == "fail":
            record.outcome, record.reason = "failed", f"{name}: {result.summary}"
            return
    record.outcome = "ok"

    finish(ctx)
    if ctx.options.save_as and not ctx.options.dry_run:
        from sparkfleet.runner.restore import save_point

        path = save_point(ctx, ctx.options.save_as)
        events.emit("message", text=f"restore point {ctx.options.save_as!r}: {path}")
        record.data["restore_point"] = ctx.options.save_as
