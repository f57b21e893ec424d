"""The Slurm launcher's side of the launch and stop steps (inventory `launcher: slurm`).

`launch` submits the lane as ONE job (slurm/job.py renders it from the same launches the SSH launcher
runs), controller-side through the run's one executor (so `--dry-run` shows the sbatch command and script
and submits nothing), records the job in the run record, then waits until the job's tasks have started the
chosen ranks' containers on their nodes and hands them to the same readiness, fast-fail, expect and gates
steps as `Started` ranks. A job still pending after `slurm.pending_s` is cancelled, naming Slurm's reason;
a job that ends before its ranks appear fails the step with what Slurm and the job's output say.

`stop` cancels only this lane's jobs (its job name AND a run label as comment: slurm/ops.py `ours`), waits
until Slurm has let them go, then the SSH stop step proves that no container of the lane remains (removing
any the job left behind, said so). `explain` adds the job's view to a rank failure that wait_ready found,
and `cancel_run` is the Ctrl-C path: this run's job, before any container of it may exist.

runner/steps/{launch,stop}.py and runner/ranks.py dispatch here; nothing here imports them (no loops), which is
why it sits beside ranks.py rather than in the steps package (whose registry imports every step).
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable

from sparkfleet import naming
from sparkfleet.engines.base import Launch
from sparkfleet.findings import Finding
from sparkfleet.fleet import ops
from sparkfleet.fleet.op import placeholder
from sparkfleet.runner.context import RunContext, Started
from sparkfleet.runner.ops import StepGen, StepResult, query
from sparkfleet.schema.playbook import Step
from sparkfleet.slurm import ops as slurm
from sparkfleet.slurm.job import WORKER_WAIT_S, render_job, run_comment

POLL_S = 0.5
# A running job's containers appear once its tasks have run `docker run -d`; the head's only after every
# worker accepts (the job's bounded wait, WORKER_WAIT_S), so allow that and the docker runs themselves.
START_BOUND_S = WORKER_WAIT_S + 120
ENDED_BOUND_S = 30.0  # how long explain waits for a failing job to leave RUNNING (kill-on-bad-exit's cascade)
RUNNING = ("RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT")
OUTPUT_LINES = 40  # lines of the job's output kept in the record when it failed
# srun's line for a task that ended badly (srun 22.05: "srun: error: reddie: task 2: Exited with exit code 143")
TASK_EXIT = re.compile(r"srun: error: (\S+): task (\d+): Exited with exit code (\d+)")
SIGNALLED = {"143", "137"}  # 128+SIGTERM, 128+SIGKILL: a task ended by Slurm, not the rank that failed


def job_of(ctx: RunContext) -> dict | None:
    """This run's job (None before submission, and under --dry-run)."""
    return ctx.slurm_job


def launch(ctx: RunContext, chosen: list[Launch], env: dict[str, str] | None) -> StepGen:
    """Submit the lane's job (in the launch step that starts its workers, or the lane's only step), then wait
    for the chosen ranks' containers. `env` (the API key) is given to sbatch, which exports it to the tasks."""
    inv, launches = ctx.inventory, ctx.plan.launches
    workers = [x for x in launches if x.role != "head"]
    submits = job_of(ctx) is None and (any(x.role != "head" for x in chosen) or not workers
                                       or not ctx.options.dry_run)
    ranks = ", ".join(f"rank {x.rank} on {x.node}" for x in chosen)
    if submits:
        job = render_job(launches, inv, ctx.profile.name, ctx.record.run_id)
        op = slurm.submit(inv, job)
        op.env = {**(op.env or {}), **(env or {})}
        res = yield op
        if res is None:
            ctx.would(chosen)
            return StepResult("ok", f"would submit Slurm job {job.name} ({job.comment}): one task per node on "
                              f"{', '.join(job.nodes)}{', heterogeneous' if job.het else ''}, starting {ranks}",
                              data={"slurm_job": {"name": job.name, "comment": job.comment, "script": job.script}})
        r = res[slurm.CONTROLLER]
        if not r.ok:
            why = slurm.said(r)
            return StepResult("fail", f"sbatch refused the lane's job: {why}; nothing was started",
                              [Finding("slurm-submit", "fail", f"sbatch: {why}", "see Slurm's message")])
        job_id = slurm.parse_submitted(r.stdout)
        ctx.slurm_job = {"job_id": job_id, "name": job.name, "comment": job.comment, "nodes": job.nodes,
                         "het": job.het, "submitted_at": round(time.time(), 3), "script": job.script}
        ctx.record.data["slurm_job"] = ctx.slurm_job  # the same dict: the record follows what the run learns
        ctx.events.emit("message", text=f"submitted Slurm job {job_id} ({job.name}, {job.comment})")
    elif job_of(ctx) is None:  # --dry-run: the job was shown by the step that would submit it
        ctx.would(chosen)
        return StepResult("ok", f"would wait for the Slurm job to start {ranks}")
    return (yield from _await_ranks(ctx, chosen))


def _await_ranks(ctx: RunContext, chosen: list[Launch]) -> StepGen:
    """Until every chosen rank's container (this run's label) is on its node; the job pending too long, ending,
    or not starting them within START_BOUND_S fails the step (and cancels the job)."""
    job, inv = job_of(ctx), ctx.inventory
    assert job is not None and inv.slurm is not None
    jid = job["job_id"]
    lane = ops.LaneContainers(ctx.profile.name, run_id=ctx.record.run_id)
    want = {x.node: x for x in chosen}
    while True:
        state, reason, failed = yield from _state(ctx)
        if failed:
            yield from _cancel_run_job(ctx, jid)
            return StepResult("fail", f"cannot ask Slurm about job {jid}: {failed}; the job was cancelled")
        now = time.time()
        if state == "PENDING" and now - job["submitted_at"] > inv.slurm.pending_s:
            left = yield from _cancel_run_job(ctx, jid)
            return StepResult("fail", f"Slurm job {jid} still pending after {inv.slurm.pending_s:g} s "
                              f"(slurm.pending_s), Slurm's reason: {reason}; the job was cancelled{left}, "
                              "nothing was started",
                              [Finding("slurm-pending", "fail", f"job {jid} pending: {reason}",
                                       "free what Slurm waits for (a drained/down node, a reservation, the "
                                       "queue), or raise slurm.pending_s in the inventory")])
        if state is None or state not in RUNNING and state != "PENDING":
            return (yield from _ended_early(ctx, chosen, state))
        if state in RUNNING:
            job.setdefault("running_at", round(now, 3))
            found = yield ops.on(f"find the ranks Slurm job {jid} started", dict.fromkeys(want, lane), 30)
            ids = {n: lane.parse(res) for n, res in (found or {}).items()}
            lost = {n: e for n, e in ids.items() if isinstance(e, ops.NodeError)}
            if lost:
                left = yield from _cancel_run_job(ctx, jid)
                return StepResult("fail", "cannot look for the job's containers on " + ", ".join(lost)
                                  + f"; Slurm job {jid} was cancelled{left}", [e.finding() for e in lost.values()])
            if all(ids.get(n) for n in want):
                for n, x in want.items():
                    ctx.started.append(Started(n, x.rank, x.container, ids[n][0]))
                return StepResult("ok", f"Slurm job {jid} started " + ", ".join(
                    f"rank {x.rank} on {x.node}" for x in chosen))
            if now - job["running_at"] > START_BOUND_S:
                missing = [f"rank {x.rank} on {n}" for n, x in want.items() if not ids.get(n)]
                left = yield from _cancel_run_job(ctx, jid)
                return StepResult("fail", f"Slurm job {jid} has run {START_BOUND_S} s without starting "
                                  f"{', '.join(missing)}; the job was cancelled{left}")
        time.sleep(min(ctx.options.poll_s, POLL_S))


def _state(ctx: RunContext) -> StepGen:
    """(state, reason, why squeue failed) of this run's job; state None once squeue no longer lists it."""
    job, inv = job_of(ctx), ctx.inventory
    assert job is not None
    res = yield slurm.lane_jobs(inv, job["name"])
    r = res[slurm.CONTROLLER]
    if not r.ok:
        return None, None, slurm.said(r)
    mine = [j for j in slurm.parse_jobs(r.stdout) if j["id"].split("+")[0] == job["job_id"]]
    state, reason = (mine[0]["state"], mine[0]["reason"]) if mine else (None, None)
    job.update(state=state or job.get("state"), reason=reason or job.get("reason"))
    return state, reason, None


def _ended_early(ctx: RunContext, chosen: list[Launch], state: str | None) -> StepGen:
    """The job ended before its ranks were all seen: what Slurm and the job's output say; what it left, removed."""
    job = job_of(ctx)
    assert job is not None
    why, _ = yield from _why_ended(ctx)
    left = yield from _leftovers(ctx)
    return StepResult("fail", f"Slurm job {job['job_id']} ended before it started "
                      + ", ".join(f"rank {x.rank} on {x.node}" for x in chosen) + f": {why}{left}",
                      [Finding("slurm-job", "fail", f"job {job['job_id']} {job.get('state') or state or 'ended'}: "
                               f"{why}", "see the job's output lines in the run record (last_log_lines)")])


def _why_ended(ctx: RunContext) -> StepGen:
    """One line: the job's final state and exit code (scontrol), and the telling line of its output (srun's
    line for the first task that failed not by Slurm's signal, else the output's last line); with the output's
    last lines."""
    job, inv = job_of(ctx), ctx.inventory
    assert job is not None
    res = yield slurm.show_job(inv, job["job_id"])
    f = slurm.parse_job(res[slurm.CONTROLLER].stdout) if res[slurm.CONTROLLER].ok else {}
    if f:
        job.update(state=f.get("JobState", job.get("state")), reason=f.get("Reason"),
                   batch_host=f.get("BatchHost"), output=f.get("StdOut"))
    lines = yield from _output(ctx)
    said = f"{job.get('state') or 'gone from squeue'}"
    if f.get("ExitCode"):
        said += f", exit code {f['ExitCode']}"
    if job.get("reason") not in (None, "None"):
        said += f", reason {job['reason']}"
    culprit = _culprit(lines)
    tell = culprit[3] if culprit else next((x for x in reversed(lines) if x.strip()), "")
    return f"{said}" + (f"; the job's output: {tell.strip()[-300:]}" if tell else ""), lines


def _output(ctx: RunContext) -> StepGen:
    """The job's last output lines, read on its batch host (kept in the record's last_log_lines)."""
    job = job_of(ctx)
    assert job is not None
    host, path = job.get("batch_host"), job.get("output")
    if not host or not path or host not in ctx.inventory.nodes:
        return []
    res = yield query(f"read Slurm job {job['job_id']}'s output", {
        host: f"tail -n {OUTPUT_LINES} {shlex.quote(path)}"}, 30)
    r = (res or {}).get(host)
    lines = r.stdout.splitlines() if r is not None and r.ok else []
    if lines:
        ctx.record.data.setdefault("last_log_lines", {})[f"slurm job {job['job_id']}"] = lines
    return lines


def _culprit(lines: list[str]) -> tuple[str, str, str, str] | None:
    """(node, task, exit code, line) of the first task srun says ended badly on its own (not by a signal)."""
    hits = [(m.group(1), m.group(2), m.group(3), line) for line in lines if (m := TASK_EXIT.search(line))]
    return next((h for h in hits if h[2] not in SIGNALLED), hits[0] if hits else None)


def explain(ctx: RunContext, failure: tuple[int, str, str], states: dict) -> StepGen:
    """wait_ready found a failed rank (`states`: rank -> (node, ContainerState)): when that rank is gone, once
    the job has ended (kill-on-bad-exit ends every task, and each task's trap removes its container, so the
    peers read as vanished), name the rank srun says failed first, with its exit code, and the job's end.
    Unchanged while the failed rank still runs (a fatal line): stopping the ranks then ends the job."""
    job = job_of(ctx)
    gone = ("exited", "dead", "missing")
    if job is None or failure[0] in states and states[failure[0]][1].status not in gone:
        return failure
    end = time.time() + ENDED_BOUND_S
    while True:
        state, _, failed = yield from _state(ctx)
        if failed or state is None or state not in RUNNING or time.time() > end:
            break
        time.sleep(POLL_S)
    if state in RUNNING and not failed:
        return failure
    why, output = yield from _why_ended(ctx)
    rank, node, text = failure
    culprit = _culprit(output)
    by_node = {x.node: x.rank for x in ctx.plan.launches}
    if culprit and culprit[0] in by_node and "vanished" in text:
        rank, node = by_node[culprit[0]], culprit[0]
        text = f"rank {rank} on {node} exited with code {culprit[2]}"
    return rank, node, (f"{text}; Slurm job {job['job_id']} ended ({why}), every task's trap removing its "
                        "container")


def stop(ctx: RunContext, st: Step, containers: Callable[[RunContext, Step], StepGen]) -> StepGen:
    """Cancel this lane's jobs (only those carrying its job name and a run label), wait until Slurm lets them
    go, then `containers` (the SSH stop step) proves no container of the lane remains, removing any left."""
    inv = ctx.inventory
    if ctx.options.keep:
        return StepResult("fail", "down --keep cannot keep a Slurm lane's containers: cancelling its job makes "
                          "each task's trap remove them (launcher: slurm); nothing was done")
    name = naming.slurm_job_name(ctx.profile.name)
    res = yield slurm.lane_jobs(inv, name)
    if res is None:  # --dry-run: the ids are what squeue would list
        yield slurm.cancel(inv, [placeholder(f"ids of the Slurm jobs named {name} with a run label")])
        ids: list[str] = []
    else:
        r = res[slurm.CONTROLLER]
        if not r.ok:
            return StepResult("fail", f"cannot list the lane's Slurm jobs (squeue): "
                              f"{r.message or r.stderr.strip()[-300:]}; nothing was stopped")
        ids = slurm.ours(slurm.parse_jobs(r.stdout), name, naming.RUN_LABEL + "=")
    if ids and ctx.options.limit:
        return StepResult("fail", f"Slurm job {', '.join(ids)} of this lane still runs on all its nodes: "
                          f"`down --profile {ctx.profile.name}` without --limit cancels it; nothing was done")
    if ids:
        gone = yield from _cancel(ctx, ids)
        if gone:
            return StepResult("fail", f"Slurm job {', '.join(ids)} cancelled but still listed after "
                              f"{slurm.END_BOUND_S:g} s ({gone}); its containers were not touched")
    result = yield from containers(ctx, st)
    if res is None:
        return result
    removed = result.data.get("stopped")
    jobs = f"cancelled Slurm job {', '.join(ids)}" if ids else "no Slurm job of this lane"
    if removed:  # the job was gone (or its traps did not run): these containers outlived it
        n = sum(len(v) for v in removed.values())
        said = (f"{jobs}, but {n} container(s) of the lane remained on {', '.join(removed)}: "
                f"{result.summary}")
    else:
        said = f"{jobs}; {result.summary}"
    result.summary = said
    result.data["slurm_jobs_cancelled"] = ids
    return result


def _cancel(ctx: RunContext, ids: list[str]) -> StepGen:
    """scancel `ids` and wait (bounded) until squeue lists none of them unended: "" then, else what it still
    lists. Once a job has ended every task has, and each task's trap has removed its container."""
    inv = ctx.inventory
    if (yield slurm.cancel(inv, ids)) is None:  # --dry-run (=facts too): shown, not cancelled, nothing to wait for
        return ""
    end = time.time() + slurm.END_BOUND_S
    while True:
        res = yield slurm.lane_jobs(inv, naming.slurm_job_name(ctx.profile.name))
        r = res[slurm.CONTROLLER]
        left = [j for j in slurm.parse_jobs(r.stdout) if j["id"].split("+")[0] in ids and j["state"] not in
                slurm.ENDED] if r.ok else []
        if not left:
            return ""
        if time.time() > end:
            return ", ".join(f"{j['id']} {j['state']}" for j in left)
        time.sleep(POLL_S)


def _cancel_run_job(ctx: RunContext, jid: str) -> StepGen:
    """Cancel this run's job, then remove what it left: the text a failure message ends with."""
    still = yield from _cancel(ctx, [jid])
    left = yield from _leftovers(ctx)
    return left + (f" (Slurm still lists: {still})" if still else "")


def _leftovers(ctx: RunContext) -> StepGen:
    """Containers of this run still on the lane's nodes after its job ended: removed, said (`` when none)."""
    mine = ops.LaneContainers(ctx.profile.name, run_id=ctx.record.run_id)
    listed = yield ops.on("list this run's containers", {n.name: mine for n in ctx.nodes}, 30)
    found = {n: ids for n, res in (listed or {}).items() if isinstance(ids := mine.parse(res), list) and ids}
    if not found:
        return ""
    yield ops.on("remove the containers the job left", {n: ops.Stop(tuple(ids)) for n, ids in found.items()}, 120)
    return "; removed " + ", ".join(f"{len(ids)} container(s) it left on {n}" for n, ids in found.items())


def cancel_run(ctx: RunContext) -> StepGen:
    """Ctrl-C, SIGTERM or a failed gate: this run's job (found by its name and this run's label, so also one
    whose submission the signal cut short) cancelled, then any container of the run removed. Returns what
    could not be done, by place (ranks.stop_run's contract)."""
    inv, name = ctx.inventory, naming.slurm_job_name(ctx.profile.name)
    res = yield slurm.lane_jobs(inv, name)
    r = (res or {}).get(slurm.CONTROLLER)
    if r is None:
        return {}
    if not r.ok:
        return {slurm.CONTROLLER: f"squeue: {r.message or r.stderr.strip()[-300:]}"}
    label = run_comment(ctx.record.run_id)
    ids = slurm.ours(slurm.parse_jobs(r.stdout), name, label)  # run ids are of one length: a prefix is the id
    still = (yield from _cancel(ctx, ids)) if ids else ""
    yield from _leftovers(ctx)
    return {slurm.CONTROLLER: f"Slurm job still listed: {still}"} if still else {}


PREFLIGHT = ("facts", "check", "probe", "fabric_probe", "nccl")  # the steps whose failures --drain-on-fail acts on
REASON_MAX = 200  # characters of the finding kept as Slurm's reason (sinfo -R shows it; keep it one line)


def drain(ctx: RunContext, result: StepResult) -> StepGen:
    """up --drain-on-fail: each lane node a failed preflight step names is drained in Slurm (`scontrol update
    NodeName=N State=DRAIN Reason=...`), its first failing finding as the reason, so the scheduler gives it to
    nobody until an admin resumes it. A failure naming no node drains nothing."""
    lane = {n.name for n in ctx.nodes}
    reasons: dict[str, str] = {}
    for f in result.findings:
        if f.status == "fail" and f.node in lane and f.node not in reasons:
            reasons[f.node] = " ".join(f"sparkfleet {f.check}: {f.message}".split())[:REASON_MAX]
    if not reasons:
        return None
    res = yield slurm.drain(ctx.inventory, reasons)
    r = (res or {}).get(slurm.CONTROLLER)
    if r is not None and not r.ok:
        ctx.events.emit("message", text=f"could not drain {', '.join(reasons)}: {r.message or r.stderr.strip()}")
        return None
    if r is not None:
        ctx.record.data["slurm_drained"] = reasons
        for n, why in reasons.items():
            ctx.events.emit("message", text=f"drained {n} in Slurm (reason: {why}); `scontrol update "
                            f"NodeName={n} State=RESUME` gives it back")
    return None
