"""The launch steps: the ranks started in waves (workers, then the head), and waiting until the lane serves
while following every rank (fast-fail on an exited rank or a fatal line)."""

from __future__ import annotations

import os
import time

import httpx

from sparkfleet.engines.logs import LogFacts
from sparkfleet.engines.registry import engine_for
from sparkfleet.findings import Finding
from sparkfleet.fleet import ops
from sparkfleet.gates.client import ApiClient, RequestFailed
from sparkfleet.runner import autotune, progress, slurm_launch
from sparkfleet.runner.context import RunContext, Started
from sparkfleet.runner.ops import StepGen, StepResult, query
from sparkfleet.runner.ranks import follow, launch_failure, stop_launch_commands, stop_run, stopped_every_rank
from sparkfleet.runner.served import launch_records
from sparkfleet.schema.playbook import Step

FIRST_TOKEN_TIMEOUT_S = 60.0  # the receipt's one request: a lane that serves answers one token well within it


def _render(ctx: RunContext) -> None:
    """The run's one plan (rendered with its run id) carries the GID indexes facts resolved: the facts step
    bound them; a playbook without one launches with `auto`, as rendered. What the run keeps for restore is
    built here, once, from the launches it starts."""
    if not ctx.rendered:
        ctx.plan.bind_gids(ctx.gid_index)  # nothing left to bind after the facts step
        ctx.rendered = True
        ctx.launches = launch_records(ctx)
        ctx.record.data["launches"] = [x.model_dump(mode="json") for x in ctx.launches]


def _api_key(ctx: RunContext) -> str | None:
    """The lane's API key from the env var the profile names (registered as a secret for the record)."""
    if not ctx.profile.api_key_env:
        return None
    key = os.environ.get(ctx.profile.api_key_env)
    if key:
        ctx.record.secret_values.add(key)
    return key


def launch(ctx: RunContext, st: Step) -> StepGen:
    _render(ctx)
    want = {"workers": ("worker",), "head": ("head",), "all": ("worker", "head")}[st.role or "all"]
    chosen = [x for x in ctx.plan.launches if x.role in want]
    if not chosen:
        return StepResult("skip", f"no {st.role} rank in this lane")
    env = None
    if ctx.profile.api_key_env:
        key = _api_key(ctx)
        if not key and not ctx.options.dry_run:
            return StepResult("fail", f"the lane needs an API key in ${ctx.profile.api_key_env} (profile api_key_env); "
                              "it is not set here")
        var = engine_for(ctx.profile.engine).api_key_var
        assert var is not None  # a lane rule refuses api_key_env for an engine without one
        env = {var: key or ""}
    if ctx.inventory.launcher == "slurm":  # one Slurm job starts every rank (runner/slurm_launch.py)
        return (yield from slurm_launch.launch(ctx, chosen, env))
    dry = False
    for wave in sorted({x.wave for x in chosen}):
        batch = [x for x in chosen if x.wave == wave]
        starts = {x.node: ops.StartRank(x.script, x.container) for x in batch}
        results = yield ops.on(f"start rank(s) {', '.join(str(x.rank) for x in batch)}", starts, 300, env=env,
                               files={x.node: x.files for x in batch if x.files})
        if results is None:  # --dry-run: shown, not started
            dry = True
            ctx.would(batch)
            continue
        started_at = time.time()
        refused = [x for x in batch if not results[x.node].ok]
        for x in batch:  # every rank of the wave that did start is recorded first, so the failure stops it too
            cid = starts[x.node].parse(results[x.node])
            if not isinstance(cid, ops.NodeError):
                ctx.started.append(Started(x.node, x.rank, x.container, cid))
                if x.rank == 0:  # the startup receipt counts from here (wait_ready adds what follows)
                    ctx.record.data["startup"] = {"head_started": round(started_at, 3)}
        if refused:
            x, res = refused[0], results[refused[0].node]
            bad = ops.failures({y.node: results[y.node] for y in refused})
            why = f"rank {x.rank} on {x.node} did not start: {res.message or res.stderr.strip()[-300:]}"
            if ctx.started:  # the ranks that did start (this wave's or earlier) must not serve half a lane
                return (yield from _fail_launch(ctx, why, bad))
            return StepResult("fail", why, bad)
        checks = {x.node: ops.ReadyCheck(x.ready_check) for x in batch if x.ready_check}
        if checks:  # the wave is up only when each such rank says so (Launch.ready_check)
            ready = yield ops.on(f"wait until rank(s) {', '.join(str(x.rank) for x in batch if x.ready_check)} "
                                 "accept", checks, 120)
            for x in batch:
                res = (ready or {}).get(x.node)
                if x.ready_check and res is not None and not res.ok:
                    yield stop_launch_commands(ctx)  # the head would fail on the missing rank: stop them all
                    return StepResult("fail", f"rank {x.rank} on {x.node} did not come up: "
                                      f"{res.message or res.stderr.strip()[-300:]}; every rank of this launch "
                                      "was stopped", ops.failures({x.node: res}))
    if dry:
        return StepResult("ok", "would start " + ", ".join(f"rank {x.rank} on {x.node}" for x in chosen),
                          data={"launches": [x.as_dict() for x in chosen]})
    return StepResult("ok", "started " + ", ".join(f"rank {x.rank} on {x.node}" for x in chosen))


def wait_ready(ctx: RunContext, st: Step) -> StepGen:
    """Poll the head's /health and /v1/models; follow every rank; fast-fail on a vanished or exited rank,
    a fatal line, a node whose docker stopped answering, or a lane silent and idle for its stall window.
    Under --dry-run (the ranks shown, not started) one poll's node commands are shown."""
    if not ctx.started and not ctx.lane_shown_only:
        return StepResult("fail", "no rank was started by this run")
    budget = ctx.options.boot_budget_s or ctx.profile.expect.boot_budget_s or 900
    deadline = time.time() + budget
    engine = engine_for(ctx.profile.engine)
    names = set(ctx.profile.served_names)
    base = ctx.endpoint()
    key = _api_key(ctx)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    station = [r.node for r in ctx.plan.ranks if r.node.hardware in engine.autotune_hardware]
    started_at = time.time() - 60  # hash dirs the tuner makes for this launch are younger than now - this
    if station:
        changed = autotune.shape_changes(ctx.state_dir / "runs", ctx.profile.name, ctx.plan.launches[-1].argv)
        if changed:
            ctx.events.emit("message", text=f"kernel shapes changed since the last good run ({', '.join(changed)}): "
                            "seeding the autotune cache cannot help; the first boot retunes (75-90 min, LCH-G3)")
            ctx.record.data["autotune_shape_changes"] = changed
    stall_s = ctx.options.stall_s or ctx.profile.expect.stall_s or progress.STALL_S
    silence = progress.Silence(stall_s, time.time())
    with httpx.Client(timeout=5.0, headers=headers) as http:
        polls: list[float] = []  # when each poll began (the last few go into the record)
        ctx.record.data["wait_ready"] = watch = {"poll_s": ctx.options.poll_s, "polls": 0, "poll_started": [],
                                                 "stall_s": stall_s}
        while True:
            polls.append(time.time())
            watch.update(polls=len(polls), poll_started=[round(t, 3) for t in polls[-20:]])
            if station:  # seed new autotune hash dirs before the tuner reads them (LCH-G2)
                seeds = {n.name: ops.SeedAutotune(n.storage.cache_dir, time.time() - started_at) for n in station}
                seeded = yield ops.on("seed the autotune cache", seeds, 30)
                for n, res in (seeded or {}).items():
                    for d in seeds[n].parse(res):
                        ctx.events.emit("message", text=f"seeded autotune cache {d} on {n}")
                        ctx.record.data.setdefault("autotune_seeded", []).append(d)
            followed = yield from follow(ctx)
            if followed is None:  # --dry-run: the reads above were shown
                return StepResult("ok", f"would poll {base}/health and /v1/models every {ctx.options.poll_s:g} s "
                                  f"until it serves {sorted(names)} (boot budget {budget:.0f} s), reading every "
                                  "rank's state and new log lines as shown")
            states, errors = followed
            ctx.events.ranks([{"node": n, "rank": r, "state": s.status,
                               "phase": ctx.log_facts.get(r, LogFacts()).phase,
                               "lines": ctx.log_facts.get(r, LogFacts()).lines_seen}
                              for r, (n, s) in sorted(states.items())])
            failure = launch_failure(ctx, states)
            if failure and ctx.inventory.launcher == "slurm":  # the job's view: which task failed first
                failure = yield from slurm_launch.explain(ctx, failure, states)
            if failure:
                rank, node, why = failure
                watch.update(failed_rank=rank, failed_node=node, detected_at=round(time.time(), 3))
                return (yield from _fail_launch(ctx, why))
            if errors:
                rank, node, err = errors[0]
                watch.update(failed_rank=rank, failed_node=node, detected_at=round(time.time(), 3))
                return (yield from _fail_launch(ctx, f"cannot follow rank {rank} on {node}: {err.message}",
                                                [e.finding() for _, _, e in errors]))
            reached, why = _api_ready(http, base, names)
            ready = reached == "ready"
            if ready and engine.ready_from_log and not ctx.log_facts.get(0, LogFacts()).api_up:
                ready, why = False, f"{why}, but the head has not logged that it serves"
            receipt = _receipt(ctx, reached if reached != "ready" or ready else "health", time.time())
            if ready:
                ctx.record.data["log_facts"] = {str(r): lf.as_dict() for r, lf in ctx.log_facts.items()}
                if receipt is not None:
                    _first_token(receipt, base, key, sorted(names)[0] if names else None)
                return StepResult("ok", f"serving at {base} ({why})")
            silence.lines(sum(lf.lines_seen for lf in ctx.log_facts.values()), time.time())
            if silence.due(time.time()):
                verdict = silence.sample(time.time(), (yield from _cpu(ctx)))
                if verdict:
                    watch["silent"] = [{"kind": v.kind, "silent_s": round(v.silent_s, 1),
                                        "window_s": round(v.window_s, 1), "cpu_s": {str(r): s for r, s in
                                                                                    v.cpu_s.items()}}
                                       for v in silence.verdicts[-10:]]
                    if verdict.kind == "stalled":
                        return (yield from _fail_launch(ctx, verdict.text()))
                    ctx.events.emit("message", text=verdict.text())
            if time.time() > deadline:
                return (yield from _fail_launch(ctx, f"not healthy after {budget:.0f} s (the profile's boot budget): "
                                                f"{why}"))
            time.sleep(ctx.options.poll_s)


def _cpu(ctx: RunContext) -> StepGen:
    """CPU seconds used so far by each started rank's processes (None where they could not be read)."""
    by_node: dict[str, list[Started]] = {}
    for s in ctx.started:
        by_node.setdefault(s.node, []).append(s)
    results = yield query("read the ranks' CPU time", {n: progress.cpu_command([s.id for s in ss])
                                                        for n, ss in by_node.items()}, 30)
    out: dict[int, float | None] = {}
    for n, ss in by_node.items():
        res = (results or {}).get(n)
        used = progress.parse_cpu(res, [s.id for s in ss]) if res is not None else {}
        out.update({s.rank: used.get(s.id) for s in ss})
    return out


# how far a poll got: nothing answered, the port answered, /health said 200, or every served name is listed
REACHED = ("closed", "open", "health", "ready")
RECEIPT_KEYS = {"open": "port_open_s", "health": "health_s", "ready": "ready_s"}


def _api_ready(http: httpx.Client, base: str, names: set[str]) -> tuple[str, str]:
    """How far the head's API got (REACHED), and what it said."""
    try:
        h = http.get(f"{base}/health")
    except httpx.HTTPError as exc:
        return "closed", f"API not answering ({type(exc).__name__})"
    if h.status_code != 200:
        return "open", f"/health {h.status_code}"
    try:
        m = http.get(f"{base}/v1/models")
        listed = {x.get("id") for x in m.json().get("data", [])} if m.status_code == 200 else set()
    except (httpx.HTTPError, ValueError) as exc:
        return "health", f"/health 200, /v1/models not answering ({type(exc).__name__})"
    if not names <= listed:
        return "health", f"/v1/models lacks {sorted(names - listed)}"
    return "ready", f"/health 200, models {sorted(listed)}"


def _receipt(ctx: RunContext, reached: str, now: float) -> dict | None:
    """Note in the run's startup receipt the first poll at which the head reached each point up to `reached`
    (a point passed between two polls is seen at the later one); None when this run started no head."""
    receipt = ctx.record.data.get("startup")
    if not isinstance(receipt, dict) or receipt.get("head_started") is None:
        return None
    for point in REACHED[1:REACHED.index(reached) + 1]:
        receipt.setdefault(RECEIPT_KEYS[point], round(now - receipt["head_started"], 3))
    return receipt


def _first_token(receipt: dict, base: str, key: str | None, model: str | None) -> None:
    """The receipt's last point: one streamed chat request of one token, sent as the lane is ready; the time
    its first token arrived, from the head's start. A request that fails says why (the gates judge answers)."""
    if model is None:
        receipt["first_token_error"] = "the lane serves no model name"
        return
    body = {"model": model, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1,
            "temperature": 0}
    client = ApiClient(base, key, timeout_s=FIRST_TOKEN_TIMEOUT_S)
    try:
        reply = client.stream(body)
    except RequestFailed as exc:
        receipt["first_token_error"] = str(exc)
        return
    finally:
        client.http.close()
    if reply.ttft_s is None:
        receipt["first_token_error"] = "the stream carried no token"
        return
    receipt["first_token_s"] = round(time.time() - reply.elapsed_s + reply.ttft_s - receipt["head_started"], 3)


def _fail_launch(ctx: RunContext, why: str, findings: list[Finding] | None = None) -> StepGen:
    ctx.events.emit("message", text=f"{why}: stopping every rank of this launch")
    lost: dict[str, str] = {}
    if ctx.inventory.launcher == "slurm":
        # the job cancelled (when kill-on-bad-exit has not ended it) and whatever its tasks' traps left removed:
        # slurmd SIGKILLs a task whose trap outlives KillWait, and its container would outlive the job
        lost = yield from stop_run(ctx)
    else:
        yield stop_launch_commands(ctx)
    ctx.record.data["log_facts"] = {str(r): lf.as_dict() for r, lf in ctx.log_facts.items()}
    ctx.record.data["last_log_lines"] = {str(r): lines for r, lines in ctx.logs_tail.items()}
    return StepResult("fail", why + stopped_every_rank(lost), findings or [])
