"""The playbook steps: thin decisions over node operations (sparkfleet/fleet/commands.py).

A step yields the commands it wants run per node (runner/ops.py runs them, or prints them under
--dry-run) and returns a StepResult. A step that fails stops the run; once ranks have started, the
runner stops every rank of this launch before it gives up (and keeps their last log lines in the record).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import httpx

from sparkfleet.engines.logs import LogFacts
from sparkfleet.engines.registry import engine_for
from sparkfleet.engram.manifest import judge_lane
from sparkfleet.findings import Finding, failed
from sparkfleet.fleet import commands as nodeops
from sparkfleet.fleet.facts import NodeFacts
from sparkfleet.fleet.transport import Result
from sparkfleet.naming import PROFILE_LABEL as LABEL
from sparkfleet.plan import make_plan
from sparkfleet.runner.context import RunContext, Started
from sparkfleet.runner.ops import NodeCommands, StepFn, StepGen, StepResult, query
from sparkfleet.runner.ranks import LOG_TAIL, follow, launch_failure, stop_launch, stop_launch_commands
from sparkfleet.spec.errors import UserError
from sparkfleet.spec.playbook import Step

__all__ = ["LABEL", "LOG_TAIL", "STEPS", "StepResult", "stop_launch"]

STEPS: dict[str, StepFn] = {}
# What a step that reads the live lane over HTTP would do, said under --dry-run instead of running it.
DRY: dict[str, Callable[[RunContext, Step], str]] = {}


def step(name: str, dry: Callable[[RunContext, Step], str] | None = None) -> Callable[[StepFn], StepFn]:
    def wrap(fn: StepFn) -> StepFn:
        STEPS[name] = fn
        if dry:
            DRY[name] = dry
        return fn
    return wrap


def gather_facts(ctx: RunContext, with_lane: bool = True) -> dict:
    from sparkfleet.fleet.gather import facts_requests, gather

    requests = facts_requests(ctx.inventory, ctx.plan, ctx.profile, root=ctx.spec.root) if with_lane else {}
    return gather(ctx.transport, ctx.nodes, requests)


# -- stop ------------------------------------------------------------------------------------------

def lane_containers(ctx: RunContext, running_only: bool) -> StepGen:
    """This lane's container ids per node, by label (one `docker ps` per node); node failures as findings."""
    cmd = nodeops.lane_containers_command(ctx.profile.name, running_only)
    results = yield query("list the lane's containers", {n.name: cmd for n in ctx.nodes})
    found, bad = {}, []
    for name, res in results.items():
        ids = nodeops.parse_container_ids(res)
        if isinstance(ids, nodeops.NodeError):
            bad.append(ids.finding())
        elif ids:
            found[name] = ids
    return found, bad


@step("stop")
def stop(ctx: RunContext, st: Step) -> StepGen:
    """Stop every container of this lane on the lane's nodes and wait until they are gone.

    Only containers carrying this lane's label are touched: another lane's or a foreign container is
    reported by `check` and never stopped here (docs/failure-modes.md FM-48). Removing them (not just stopping) means
    no old head's rendezvous is left on the master port for a new worker to join (FM-01)."""
    keep = ctx.options.keep
    found, bad = yield from lane_containers(ctx, running_only=False)
    if bad:
        return StepResult("fail", "cannot list containers on every node", bad)
    if not found:
        return StepResult("ok", "no container of this lane on its nodes")
    ranks = {r.node.name: r.rank for r in ctx.plan.ranks}
    head_first = st.args.get("order") == "head-first"
    order = sorted(found, key=lambda n: (ranks.get(n, 99) if head_first else -ranks.get(n, 99)))
    # down: the head first, so workers see it go rather than a half-dead lane serving
    results = yield NodeCommands("stop the lane's containers",
                                 {n: nodeops.stop_command(found[n], remove=not keep) for n in order}, serial=head_first)
    if results is None:
        return StepResult("ok", "would stop " + ", ".join(f"{n}: {len(found[n])}" for n in order))
    bad = nodeops.failures(results)
    if bad:
        return StepResult("fail", "could not stop every container", bad)
    deadline = time.time() + ctx.options.stop_timeout_s
    while True:
        left, bad = yield from lane_containers(ctx, running_only=keep)
        if bad:
            return StepResult("fail", "lost a node while stopping", bad)
        if not left:
            break
        if time.time() > deadline:
            return StepResult("fail", "containers still there after stopping: "
                              + ", ".join(f"{n}: {len(v)}" for n, v in left.items()))
        time.sleep(0.3)
    n = sum(len(v) for v in found.values())
    return StepResult("ok", f"{'stopped (kept)' if keep else 'removed'} {n} container(s) on " + ", ".join(order),
                      data={"stopped": {k: found[k] for k in order}})


# -- facts, check -----------------------------------------------------------------------------------

@step("facts")
def facts(ctx: RunContext, st: Step) -> StepResult:
    from sparkfleet.fleet.gather import resolve_gid_indexes

    ctx.facts = gather_facts(ctx)
    ctx.gid_index = resolve_gid_indexes(ctx.nodes, ctx.facts)
    ctx.record.data["facts"] = {n: (f.model_dump(mode="json") if isinstance(f, NodeFacts) else
                                    {"error": f.error, "message": f.message}) for n, f in ctx.facts.items()}
    bad = nodeops.failures({n: f for n, f in ctx.facts.items() if isinstance(f, Result)})
    if bad:
        return StepResult("fail", f"{len(bad)} node(s) did not answer", bad)
    sim = any(isinstance(f, NodeFacts) and f.simulated for f in ctx.facts.values())
    return StepResult("ok", f"{len(ctx.facts)} node(s) answered" + (" [sim]" if sim else ""),
                      data={"gid_index": ctx.gid_index})


@step("check")
def check(ctx: RunContext, st: Step) -> StepResult:
    from sparkfleet.checks import run_checks

    findings = run_checks(ctx.plan, ctx.inventory, ctx.facts, profile=ctx.profile,
                          caches_dropped=ctx.caches_dropped)
    ctx.record.data["findings"] = [f.as_dict() for f in findings]
    if failed(findings):
        n = sum(1 for f in findings if f.status == "fail")
        return StepResult("fail", f"{n} check(s) failed: nothing was started", findings)
    warns = sum(1 for f in findings if f.status == "warn")
    return StepResult("warn" if warns else "ok", f"{len(findings)} finding(s), {warns} warning(s)", findings)


@step("probe")
def probe(ctx: RunContext, st: Step) -> StepGen:
    """Load every rank's GPU (in the lane's image, as `check --probe` does) and judge clock latch and slow
    state from the samples under load; a latched rank stops the run before anything starts (FM-09).

    The clock findings replace the check step's idle snapshot in the record ("unknown": not judged)."""
    from sparkfleet.checks import clock
    from sparkfleet.checks import probe as clock_probe

    judged = [r.node for r in ctx.plan.ranks if clock.judged(ctx.inventory.hardware(r.node))]
    if not judged:
        return StepResult("skip", "no rank's hardware class has clock-latch thresholds")
    if ctx.options.no_probe:
        findings = [Finding(clock.CHECK, "unknown", "not judged: the clock probe was skipped (--no-probe)",
                            "run without --no-probe to judge the clock under load", node=n.name) for n in judged]
        ctx.record.data["probe"] = {"skipped": "--no-probe"}
        _replace_clock_findings(ctx, findings)
        return StepResult("skip", "clock probe skipped (--no-probe): clock latch and slow state not judged",
                          findings)
    cmds = {n.name: clock_probe.probe_command(clock.load_for(n, _facts_of(ctx, n.name), ctx.profile,
                                                             seconds=ctx.options.probe_seconds))
            for n in judged}
    results = yield NodeCommands("load each rank's GPU and sample its clock", cmds,
                                 timeout_s=clock_probe.PROBE_MAX_S + 30)
    if results is None:
        return StepResult("ok", "would probe the GPU clock under load on " + ", ".join(cmds))
    findings: list[Finding] = []
    runs = {}
    for n in judged:
        res = results[n.name]
        run = clock_probe.parse_output(res.stdout) if res.ok else {
            "error": (nodeops.classify(res) or nodeops.NodeError(n.name, "failed", "", "")).message}
        runs[n.name] = run
        findings += clock.from_probe(n.name, ctx.inventory.hardware(n), run)
    ctx.record.data["probe"] = {name: clock_probe.verdict(run, **clock.thresholds(ctx.inventory.hardware(
        ctx.node(name)))) for name, run in runs.items()}
    _replace_clock_findings(ctx, findings)
    bad = [f for f in findings if f.status == "fail"]
    if bad:
        return StepResult("fail", f"{len(bad)} rank(s) failed the clock probe: nothing was started", findings)
    unknown = [f for f in findings if f.status == "unknown"]
    warns = [f for f in findings if f.status == "warn"]
    return StepResult("warn" if unknown or warns else "ok",
                      f"clock under load judged on {len(judged) - len({f.node for f in unknown})} of {len(judged)} "
                      "rank(s)" + (f", {len(unknown)} not judged" if unknown else ""), findings)


def _facts_of(ctx: RunContext, node: str) -> NodeFacts | None:
    f = ctx.facts.get(node)
    return f if isinstance(f, NodeFacts) else None


def _replace_clock_findings(ctx: RunContext, findings: list[Finding]) -> None:
    """The probe's verdicts stand for the clock checks in the record (what the exporter publishes)."""
    from sparkfleet.checks import clock

    nodes = {f.node for f in findings}
    kept = [f for f in ctx.record.data.get("findings", [])
            if not (f.get("check") in (clock.CHECK, clock.SLOW) and f.get("node") in nodes)]
    ctx.record.data["findings"] = kept + [f.as_dict() for f in findings]


# -- patches, drop_caches, engram, rail2 ------------------------------------------------------------

@step("patches")
def patches(ctx: RunContext, st: Step) -> StepResult:
    from sparkfleet.patches import manifest as pm
    from sparkfleet.patches import sync

    name = ctx.profile.patches
    if not name:
        return StepResult("skip", "the lane uses no patch set")
    if not (pm.set_dir(ctx.spec.root, name) / pm.MANIFEST).is_file():
        return StepResult("fail", f"patch set {name!r} has no manifest", [Finding(
            "patches", "fail", f"patches/{name}/{pm.MANIFEST} does not exist",
            f"sparkfleet patches build DIR --name {name}")])
    manifest = pm.load(ctx.spec.root, name)
    if not manifest.complete:
        return StepResult("fail", f"patch set {name!r} is not known in full: nothing was started", [Finding(
            "patches", "fail", f"patches/{name}/{pm.MANIFEST}: {manifest.seed_gap}",
            f"sparkfleet patches build DIR --name {name} --mounts mounts.txt")])
    local = pm.verify_local(ctx.spec.root, manifest)
    if local:
        return StepResult("fail", f"patch set {name!r} differs from its manifest here", local)
    states = sync.inspect(ctx.transport, ctx.nodes, manifest)
    findings = sync.findings(states, manifest)
    ctx.record.data["patches"] = {"set": name, "manifest_sha256": ctx.patch_manifest_sha256(), "nodes": {
        k: {"ok": v.ok, "missing": v.missing, "wrong": v.wrong, "found": v.found} for k, v in states.items()}}
    if failed(findings):
        return StepResult("fail", f"a rank lacks patch set {name!r} files: the whole launch is aborted", findings)
    return StepResult("ok", f"patch set {name!r}: {len(manifest.files)} file(s) verified on every rank", findings)


@step("drop_caches")
def drop_caches(ctx: RunContext, st: Step) -> StepGen:
    results = yield NodeCommands("drop the page cache", {n.name: nodeops.DROP_CACHES for n in ctx.nodes},
                                 timeout_s=nodeops.DROP_TIMEOUT_S)
    if results is None:
        return StepResult("ok", "would drop the page cache on every node")
    done = {n: v for n, v in ((n, nodeops.parse_drop_caches(r)) for n, r in results.items()) if v is not None}
    ctx.caches_dropped = done
    bad = [Finding("drop-caches", "fail", f"could not drop the page cache: {v if v is not True else ''}",
                   "sparkfleet needs root on the node for this (as the seeds' launcher had)", node=n)
           for n, v in done.items() if v is not True]
    bad += nodeops.failures({n: r for n, r in results.items() if n not in done})
    if bad:
        return StepResult("fail", "could not drop caches everywhere", bad)
    return StepResult("ok", f"dropped the page cache on {len(done)} node(s)")


@step("engram")
def engram(ctx: RunContext, st: Step) -> StepGen:
    """Per rank: node-local Engram rows (a copy the one Engram rule accepts) or NFS fallback, said before
    launch: a warning, or, with `expect.engram_node_local: true`, a failure for every rank outside
    engram.nfs_ranks without a qualifying copy (none at all, wrong revision or format, missing rows,
    unverified, another rank's): nothing starts."""
    from sparkfleet.engram import ranges as engram_ranges
    from sparkfleet.engram.fleet import manifest_reads

    e = ctx.profile.engram
    if e is None or not e.node_local:
        return StepResult("skip", "the lane reads no node-local Engram rows")
    try:
        harvest = engram_ranges.stored(ctx.profile)
    except UserError as exc:
        return StepResult("fail", "the lane's harvested Engram ranges cannot be read",
                          [Finding("engram", "fail", str(exc), "harvest again (sparkfleet engram-local harvest)")])
    dirs = ctx.engram_dirs()
    results = yield query("read each rank's Engram manifest", manifest_reads(dirs), 30)
    findings, per_rank, shas = judge_lane(ctx.profile, ctx.plan.ranks, dirs, results, harvest)
    if shas:
        ctx.record.data["engram_manifests"] = shas
    ctx.record.data["engram"] = per_rank
    if harvest is not None:
        ctx.record.data["engram_ranges"] = "harvested"
    nfs = [str(k) for k, v in per_rank.items() if v == "nfs"]
    bad = [f for f in findings if f.status == "fail"]
    if bad:
        first = bad[0]
        return StepResult("fail", f"expect.engram_node_local: {first.message}"
                          + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""), findings)
    return StepResult("warn" if nfs else "ok",
                      "node-local on every rank" if not nfs else f"ranks on NFS: {', '.join(nfs)}", findings)


def _rail2_commands(ctx: RunContext, add: bool) -> dict[str, str]:
    r2 = ctx.profile.rail2
    cmds = {}
    for name in (r2.nodes if r2 else []):
        node = ctx.node(name)
        if node.rail2_alias and node.rdma and node.rdma.rail2_iface:
            cmds[name] = nodeops.rail2_alias_command(node.rail2_alias, node.rdma.rail2_iface, add)
    return cmds


@step("rail2_up")
def rail2_up(ctx: RunContext, st: Step) -> StepGen:
    if ctx.profile.rail2 is None:
        return StepResult("skip", "the lane uses one rail")
    cmds = _rail2_commands(ctx, add=True)
    missing = [n for n in ctx.profile.rail2.nodes if n not in cmds]
    if missing:
        return StepResult("fail", f"no rail2_alias/rail2_iface in the inventory for {', '.join(missing)}")
    results = yield NodeCommands("add the rail-2 aliases", cmds)
    if results is None:
        return StepResult("ok", "would add the rail-2 aliases on " + ", ".join(cmds))
    bad = nodeops.failures(results)
    if bad:
        return StepResult("fail", "could not add the rail-2 aliases", bad)
    ctx.record.data["rail2"] = {n: ctx.node(n).rail2_alias for n in cmds}
    return StepResult("ok", "rail-2 aliases added (runtime only) on " + ", ".join(cmds))


@step("rail2_down")
def rail2_down(ctx: RunContext, st: Step) -> StepGen:
    if ctx.profile.rail2 is None:
        return StepResult("skip", "the lane uses one rail")
    cmds = _rail2_commands(ctx, add=False)
    results = yield NodeCommands("remove the rail-2 aliases", cmds)
    if results is None:
        return StepResult("ok", "would remove the rail-2 aliases on " + ", ".join(cmds))
    bad = nodeops.failures(results)
    return StepResult("fail" if bad else "ok", "rail-2 aliases removed on " + ", ".join(cmds), bad)


# -- pins (restore) ----------------------------------------------------------------------------------

@step("pins")
def pins(ctx: RunContext, st: Step) -> StepResult:
    """restore: adopt the recorded launches, say what today would render differently, refuse on drifted pins."""
    from sparkfleet.runner import restore as rp

    view = ctx.options.restore_point
    if view is None:
        return StepResult("warn", "no recorded restore point: restoring from the profile's own pins")
    point = view["point"]
    rp.adopt(ctx, point)
    ctx.facts = gather_facts(ctx)
    changes = rp.today_changes(ctx, point)
    drift = rp.pin_drift(ctx, point)
    ctx.record.data["pins"] = {"drift": [f.message for f in drift], "today": [f.message for f in changes]}
    if drift and not ctx.options.force:
        return StepResult("fail", f"{len(drift)} pin(s) drifted since {point.name!r} was recorded: nothing was "
                          "stopped", drift + changes)
    if drift:
        ctx.record.forced = True
        return StepResult("warn", f"{len(drift)} pin(s) drifted; relaunching the recorded lane anyway (--force)",
                          [dataclasses.replace(f, status="warn") for f in drift] + changes)
    if changes:
        return StepResult("warn", f"every pin of {point.name!r} matches; today's lane would differ in "
                          f"{len(changes)} place(s), relaunching the recorded lane", changes)
    return StepResult("ok", f"every pin of {point.name!r} matches the fleet")


# -- launch, wait_ready -------------------------------------------------------------------------------

def _render(ctx: RunContext) -> None:
    """Re-render the plan with this run's id (container labels) and the GID indexes the facts resolved."""
    if not ctx.rendered:
        ctx.plan = make_plan(ctx.loaded, ctx.inventory, ctx.playbook, ctx.spec.root,
                             run_id=ctx.record.run_id, gid_index=ctx.gid_index)
        ctx.rendered = True
        from sparkfleet.runner.restore import launch_records

        ctx.record.data["launches"] = launch_records(ctx)


def _api_key(ctx: RunContext) -> str | None:
    """The lane's API key from the env var the profile names (registered as a secret for the record)."""
    if not ctx.profile.api_key_env:
        return None
    key = os.environ.get(ctx.profile.api_key_env)
    if key:
        ctx.record.secret_values.add(key)
    return key


@step("launch")
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
    dry = False
    for wave in sorted({x.wave for x in chosen}):
        batch = [x for x in chosen if x.wave == wave]
        results = yield NodeCommands(f"start rank(s) {', '.join(str(x.rank) for x in batch)}",
                                     {x.node: x.script for x in batch}, timeout_s=300, env=env,
                                     files={x.node: x.files for x in batch if x.files})
        if results is None:
            dry = True
            continue
        for x in batch:
            res = results[x.node]
            if not res.ok:
                bad = nodeops.failures({x.node: res})
                return StepResult("fail", f"rank {x.rank} on {x.node} did not start: "
                                  f"{res.message or res.stderr.strip()[-300:]}", bad)
            cid = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else x.container
            ctx.started.append(Started(x.node, x.rank, x.container, cid))
    if dry:
        return StepResult("ok", "would start " + ", ".join(f"rank {x.rank} on {x.node}" for x in chosen),
                          data={"launches": [x.as_dict() for x in chosen]})
    return StepResult("ok", "started " + ", ".join(f"rank {x.rank} on {x.node}" for x in chosen))


@step("wait_ready", dry=lambda ctx, st: f"would wait for {ctx.endpoint()}/health")
def wait_ready(ctx: RunContext, st: Step) -> StepGen:
    """Poll the head's /health and /v1/models; follow every rank; fast-fail on a vanished or exited rank,
    a fatal line, or a node whose docker stopped answering."""
    if not ctx.started:
        return StepResult("fail", "no rank was started by this run")
    budget = ctx.options.boot_budget_s or ctx.profile.expect.boot_budget_s or 900
    deadline = time.time() + budget
    engine = engine_for(ctx.profile.engine)
    names = set(ctx.profile.served_names)
    base = ctx.endpoint()
    key = _api_key(ctx)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    station = [r.node for r in ctx.plan.ranks if r.node.hardware == "gb300"]
    started_at = time.time() - 60  # hash dirs the tuner makes for this launch are newer than this
    if station:
        from sparkfleet.runner import autotune

        changed = autotune.shape_changes(ctx.state_dir / "runs", ctx.profile.name, ctx.plan.launches[-1].argv)
        if changed:
            ctx.events.emit("message", text=f"kernel shapes changed since the last good run ({', '.join(changed)}): "
                            "seeding the autotune cache cannot help; the first boot retunes (75-90 min, LCH-G3)")
            ctx.record.data["autotune_shape_changes"] = changed
    with httpx.Client(timeout=5.0, headers=headers) as http:
        polls: list[float] = []  # when each poll began (the last few go into the record)
        ctx.record.data["wait_ready"] = watch = {"poll_s": ctx.options.poll_s, "polls": 0, "poll_started": []}
        while True:
            polls.append(time.time())
            watch.update(polls=len(polls), poll_started=[round(t, 3) for t in polls[-20:]])
            if station:  # seed new autotune hash dirs before the tuner reads them (LCH-G2)
                seeded = yield NodeCommands("seed the autotune cache", {
                    n.name: autotune.seed_command(n.storage.cache_dir, started_at) for n in station}, timeout_s=30)
                for n, res in (seeded or {}).items():
                    for d in (autotune.parse(res.stdout)["seeded"] if res.ok else []):
                        ctx.events.emit("message", text=f"seeded autotune cache {d} on {n}")
                        ctx.record.data.setdefault("autotune_seeded", []).append(d)
            states, errors = yield from follow(ctx)
            ctx.events.ranks([{"node": n, "rank": r, "state": s.status,
                               "phase": ctx.log_facts.get(r, LogFacts()).phase,
                               "lines": ctx.log_facts.get(r, LogFacts()).lines_seen}
                              for r, (n, s) in sorted(states.items())])
            failure = launch_failure(ctx, states)
            if failure:
                rank, node, why = failure
                watch.update(failed_rank=rank, failed_node=node, detected_at=round(time.time(), 3))
                return (yield from _fail_launch(ctx, why))
            if errors:
                rank, node, err = errors[0]
                watch.update(failed_rank=rank, failed_node=node, detected_at=round(time.time(), 3))
                return (yield from _fail_launch(ctx, f"cannot follow rank {rank} on {node}: {err.message}",
                                                [e.finding() for _, _, e in errors]))
            ready, why = _api_ready(http, base, names)
            if ready and engine.ready_from_log and not ctx.log_facts.get(0, LogFacts()).api_up:
                ready, why = False, f"{why}, but the head has not logged that it serves"
            if ready:
                ctx.record.data["log_facts"] = {str(r): lf.as_dict() for r, lf in ctx.log_facts.items()}
                return StepResult("ok", f"serving at {base} ({why})")
            if time.time() > deadline:
                return (yield from _fail_launch(ctx, f"not healthy after {budget:.0f} s (the profile's boot budget): "
                                                f"{why}"))
            time.sleep(ctx.options.poll_s)


def _api_ready(http: httpx.Client, base: str, names: set[str]) -> tuple[bool, str]:
    try:
        h = http.get(f"{base}/health")
        if h.status_code != 200:
            return False, f"/health {h.status_code}"
        m = http.get(f"{base}/v1/models")
        listed = {x.get("id") for x in m.json().get("data", [])} if m.status_code == 200 else set()
    except (httpx.HTTPError, ValueError) as exc:
        return False, f"API not answering ({type(exc).__name__})"
    if not names <= listed:
        return False, f"/v1/models lacks {sorted(names - listed)}"
    return True, f"/health 200, models {sorted(listed)}"


def _fail_launch(ctx: RunContext, why: str, findings: list[Finding] | None = None) -> StepGen:
    ctx.events.emit("message", text=f"{why}: stopping every rank of this launch")
    yield stop_launch_commands(ctx)
    ctx.record.data["log_facts"] = {str(r): lf.as_dict() for r, lf in ctx.log_facts.items()}
    ctx.record.data["last_log_lines"] = {str(r): lines for r, lines in ctx.logs_tail.items()}
    return StepResult("fail", why + "; every rank of this launch was stopped", findings or [])


# -- expect, gates, record ---------------------------------------------------------------------------

@step("expect", dry=lambda ctx, st: "would assert the profile's expectations")
def expect(ctx: RunContext, st: Step) -> StepGen:
    from sparkfleet.runner.expect import assert_expectations

    after = gather_facts(ctx)
    ctx.record.data["facts_after_load"] = {n: f.model_dump(mode="json") for n, f in after.items()
                                           if isinstance(f, NodeFacts)}
    findings = assert_expectations(ctx, after)
    ctx.record.data["expect"] = [f.as_dict() for f in findings]
    if failed(findings):
        yield stop_launch_commands(ctx)
        return StepResult("fail", "expectations not met; every rank of this launch was stopped", findings)
    warns = [f for f in findings if f.status == "warn"]
    return StepResult("warn" if warns else "ok", f"{len(findings)} expectation(s) checked", findings)


@step("gates")
def gates(ctx: RunContext, st: Step) -> StepResult:
    from sparkfleet.runner.gates_step import gates_step

    if ctx.options.gate_args:
        st = st.model_copy(update={"args": {**st.args, **ctx.options.gate_args}})
    return gates_step(ctx, st)


@step("record")
def record(ctx: RunContext, st: Step) -> StepResult:
    return StepResult("ok", f"run {ctx.record.run_id} recorded")


from sparkfleet.runner import fabric_steps  # noqa: E402,F401  (registers fabric_probe and nccl)
