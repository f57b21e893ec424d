"""Run a playbook for one lane: lock the fleet, run the steps in order, record everything."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sparkfleet.fleet.op import open_transport
from sparkfleet.opsdir import Spec
from sparkfleet.plan import make_plan
from sparkfleet.root import state_dir
from sparkfleet.runner import slurm_launch
from sparkfleet.runner.context import RunContext, RunOptions
from sparkfleet.runner.events import Events
from sparkfleet.runner.lock import FleetLock, NodeLock
from sparkfleet.runner.ops import drive
from sparkfleet.runner.ranks import stop_launch, stopped_every_rank
from sparkfleet.runner.record import Record, new_run_id
from sparkfleet.runner.restore import save_point
from sparkfleet.runner.served import finish, template_hashes
from sparkfleet.runner.steps import STEPS
from sparkfleet.schema.inventory import Inventory
from sparkfleet.schema.load import Loaded
from sparkfleet.schema.playbook import Playbook
from sparkfleet.slurm.ops import places as slurm_places
from sparkfleet.slurm.ops import refusals_now


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled exactly as Ctrl-C is (everything this run started is stopped); the CLI exits 143."""


@contextmanager
def _signals(during_cleanup: bool = False) -> Iterator[None]:
    """While a run runs, SIGTERM raises Terminated (so `kill` cleans up as Ctrl-C does); while it cleans up,
    SIGINT and SIGTERM are held off, so a second Ctrl-C cannot leave a rank running or a lock behind (every
    cleanup command has its own timeout). A caller that handles SIGTERM itself (watch) keeps its handler. Only
    the main thread can set handlers (tests may run elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        raise Terminated()

    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    if during_cleanup:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        # a caller with its own SIGTERM handling keeps it: watch finishes a group restart on the first SIGTERM
        signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def execute(spec: Spec, loaded: Loaded, inventory: Inventory, playbook: Playbook, options: RunOptions,
            events: Events, command: str, report: Callable[[Record], None] | None = None) -> Record:
    """Run every step until one fails; the record is written whatever happens (also on Ctrl-C). `report`
    gets the finished record while Ctrl-C is still held off: an operator who presses it again as the run
    ends (after the first one stopped every rank) cannot cut the run's result short (CI stop 36)."""
    state = state_dir()
    run_id = new_run_id()
    record = Record(run_id, playbook.name, loaded.profile.name, inventory.name, command)
    # the run's one plan: `auto` GID indexes stay slots until the facts step binds them (Plan.bind_gids)
    plan = make_plan(loaded, inventory, playbook, spec.root, run_id=run_id, late_gids=True)
    plan.findings += refusals_now(inventory, [r.node.name for r in plan.ranks],  # launcher: slurm (issue 30)
                                  dry_run=options.dry_run and not options.dry_reads)
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
        if report is not None:
            report(record)
        return record
    with _signals(), FleetLock(state / "locks" / f"{inventory.name}.lock", command):
        # --dry-run opens no connection at all: a transport that refuses any use (--dry-run=facts reads)
        # a node that only times out (a blackhole) costs the run one connect timeout, not one per step
        reached = [r.node for r in plan.ranks] + list(slurm_places(inventory).values())  # + the Slurm controller
        transport = open_transport(reached, dry_run=options.dry_run, reads=options.dry_reads, wait_once=True)
        ctx = RunContext(spec, loaded, inventory, playbook, plan, transport, record, events, options, state)
        lock = NodeLock(ctx)
        try:
            lock.take()  # refused (Busy) while another controller holds a node of the lane: nothing was done
        except BaseException:
            transport.close()
            raise
        interrupted: KeyboardInterrupt | None = None
        ended = False  # the steps ended or were interrupted (not a crash: that has no result to report)
        try:
            _steps(ctx)
            ended = True
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated)
            interrupted, ended = exc, True
        finally:
            with _signals(during_cleanup=True):
                if interrupted is not None:
                    _interrupted(ctx, interrupted)
                lock.release()
                ctx.close()
                transport.close()
                record.finished = time.time()
                if not options.dry_run:
                    path = record.write(state / "runs")
                    events.emit("message", text=f"record: {path}")
                if report is not None and ended:
                    report(record)
    return record


def _interrupted(ctx: RunContext, exc: KeyboardInterrupt) -> None:
    """Stop every container of this run on every node (by its run label), and say what could not be."""
    record = ctx.record
    sig = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
    record.outcome = "interrupted"
    record.reason = "terminated (SIGTERM)" if sig == "SIGTERM" else "interrupted by the user"
    record.data["interrupted_by"] = sig
    if not ctx.options.dry_run:
        _in_flight_done()
        record.reason += stopped_every_rank(stop_launch(ctx))
    ctx.events.step("interrupt", "fail", record.reason)


IN_FLIGHT_BOUND_S = 330.0  # the longest node command a step runs (a launch wave: 300 s), and a margin


def _in_flight_done(bound_s: float = IN_FLIGHT_BOUND_S) -> None:
    """Wait (bounded) for node commands still in flight when the signal came. A pool joins its workers when
    the interrupt unwinds it, except one the signal caught while it was being started (it is not yet in the
    pool's set): that worker's `docker run` would start a rank after the cleanup looked for them."""
    end = time.monotonic() + bound_s
    for t in threading.enumerate():
        if t is threading.current_thread() or t.daemon or not t.name.startswith("ThreadPoolExecutor"):
            continue
        while True:
            try:
                t.join(max(0.0, end - time.monotonic()))
                break
            except RuntimeError:  # "cannot join thread before it is started": the signal came inside its
                if time.monotonic() >= end:  # start(); the thread runs a moment later, so ask again
                    break
                time.sleep(0.01)


def _steps(ctx: RunContext) -> None:
    record, events = ctx.record, ctx.events
    for st in ctx.playbook.steps:
        name = st.step + (f":{st.role}" if st.role else "")
        events.step(name, "start")
        t0 = time.time()
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
            if ctx.options.drain_on_fail and st.step in slurm_launch.PREFLIGHT:  # up --drain-on-fail
                drive(ctx, slurm_launch.drain(ctx, result))
            return
    record.outcome = "ok"

    finish(ctx)
    if ctx.options.save_as and not ctx.options.dry_run:
        path = save_point(ctx, ctx.options.save_as)
        events.emit("message", text=f"restore point {ctx.options.save_as!r}: {path}")
        record.data["restore_point"] = ctx.options.save_as
