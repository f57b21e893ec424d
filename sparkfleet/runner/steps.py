"""The playbook steps. Each takes the run context and the step, and returns a StepResult.

A step that fails stops the run; once ranks have started, the runner stops every rank of this
launch before it gives up (and keeps their last log lines in the record).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from sparkfleet.engines.logs import LogFacts, feed
from sparkfleet.engines.registry import engine_for
from sparkfleet.findings import Finding, failed
from sparkfleet.fleet.facts import NodeFacts
from sparkfleet.fleet.transport import Result
from sparkfleet.plan import make_plan
from sparkfleet.runner.context import RunContext, Started
from sparkfleet.spec.playbook import Step

LABEL = "sparkfleet.profile"
LOG_TAIL = 60  # lines of each rank's log kept in the record when a launch fails


@dataclass
class StepResult:
    status: str  # ok | warn | fail | skip
    summary: str
    findings: list[Finding] = field(default_factory=list)
    data: dict = field(default_factory=dict)


StepFn = Callable[[RunContext, Step], StepResult]
STEPS: dict[str, StepFn] = {}


def step(name: str) -> Callable[[StepFn], StepFn]:
    def wrap(fn: StepFn) -> StepFn:
        STEPS[name] = fn
        return fn
    return wrap


def _unreachable(ctx: RunContext, results: dict[str, Result]) -> list[Finding]:
    return [Finding("reach", "fail", r.message or (r.stderr.strip() or f"exit {r.exit_code}"), node=name,
                    remedy="bring the node back (or fix its SSH), then run again")
            for name, r in results.items() if not r.ok]


def gather_facts(ctx: RunContext, with_lane: bool = True) -> dict:
    from sparkfleet.fleet.gather import facts_requests, gather

    requests = facts_requests(ctx.inventory, ctx.plan, ctx.profile) if with_lane else {}
    return gather(ctx.transport, ctx.nodes, requests)


# -- stop ------------------------------------------------------------------------------------------

@step("stop")
def stop(ctx: RunContext, st: Step) -> StepResult:
    """Stop every container of this lane on the lane's nodes and wait until they are gone.

    Only containers carrying this lane's label are touched: another lane's or a foreign container is
    reported by `check` and never stopped here (CATALOG FM-48). Removing them (not just stopping) means
    no old head's rendezvous is left on the master port for a new worker to join (FM-01)."""
    keep = ctx.options.keep
    found, bad = _lane_containers(ctx, running_only=False)
    if bad:
        return StepResult("fail", "cannot list containers on every node", bad)
    if not found:
        return StepResult("ok", "no container of this lane on its nodes")
    ranks = {r.node.name: r.rank for r in ctx.plan.ranks}
    head_first = st.args.get("order") == "head-first"
    order = sorted(found, key=lambda n: (ranks.get(n, 99) if head_first else -ranks.get(n, 99)))
    if ctx.options.dry_run:
        return StepResult("ok", "would stop " + ", ".join(f"{n}: {len(found[n])}" for n in order))
    verb = "docker stop" if keep else "docker rm -f"
    commands = {n: f"{verb} {' '.join(map(shlex.quote, found[n]))}" for n in order}
    if head_first:  # down: the head first, so workers see it go rather than a half-dead lane serving
        results = {}
        for n in order:
            results.update(ctx.run_each({n: commands[n]}))
    else:
        results = ctx.run_each(commands)
    bad = _unreachable(ctx, results)
    if bad:
        return StepResult("fail", "could not stop every container", bad)
    deadline = time.time() + ctx.options.stop_timeout_s
    while True:
        left, bad = _lane_containers(ctx, running_only=keep)
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


def _lane_containers(ctx: RunContext, running_only: bool) -> tuple[dict[str, list[str]], list[Finding]]:
    """This lane's container ids per node, by label (one `docker ps` per node)."""
    flag = "" if running_only else " -a"
    cmd = f"docker ps{flag} -q --no-trunc --filter {shlex.quote(f'label={LABEL}={ctx.profile.name}')}"
    results = ctx.transport.run(ctx.nodes, cmd, timeout_s=60)
    bad = _unreachable(ctx, results)
    found = {n: r.stdout.split() for n, r in results.items() if r.ok and r.stdout.strip()}
    return found, bad


# -- facts, check -----------------------------------------------------------------------------------

@step("facts")
def facts(ctx: RunContext, st: Step) -> StepResult:
    from sparkfleet.fleet.gather import resolve_gid_indexes

    ctx.facts = gather_facts(ctx)
    ctx.gid_index = resolve_gid_indexes(ctx.nodes, ctx.facts)
    ctx.record.data["facts"] = {n: (f.model_dump(mode="json") if isinstance(f, NodeFacts) else
                                    {"error": f.error, "message": f.message}) for n, f in ctx.facts.items()}
    bad = _unreachable(ctx, {n: f for n, f in ctx.facts.items() if isinstance(f, Result)})
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
    ctx.record.data["patches"] = {"set": name, "manifest_sha256": manifest_hash(ctx), "nodes": {
        k: {"ok": v.ok, "missing": v.missing, "wrong": v.wrong} for k, v in states.items()}}
    if failed(findings):
        return StepResult("fail", f"a rank lacks patch set {name!r} files: the whole launch is aborted", findings)
    return StepResult("ok", f"patch set {name!r}: {len(manifest.files)} file(s) verified on every rank", findings)


def manifest_hash(ctx: RunContext) -> str | None:
    from sparkfleet.patches import manifest as pm

    name = ctx.profile.patches
    path = pm.set_dir(ctx.spec.root, name) / pm.MANIFEST if name else None
    return hashlib.sha256(path.read_bytes()).hexdigest() if path and path.is_file() else None


@step("drop_caches")
def drop_caches(ctx: RunContext, st: Step) -> StepResult:
    if ctx.options.dry_run:
        return StepResult("ok", "would drop the page cache on every node")
    from sparkfleet.fleet.commands import drop_caches as drop

    done = drop(ctx.transport, ctx.nodes)
    ctx.caches_dropped = done
    bad = [Finding("drop-caches", "fail", f"could not drop the page cache: {v if v is not True else ''}",
                   "sparkfleet needs root on the node for this (as the seeds' launcher had)", node=n)
           for n, v in done.items() if v is not True]
    missing = [n.name for n in ctx.nodes if n.name not in done]
    bad += [Finding("reach", "fail", "did not answer", node=n) for n in missing]
    if bad:
        return StepResult("fail", "could not drop caches everywhere", bad)
    return StepResult("ok", f"dropped the page cache on {len(done)} node(s)")


ENGRAM_MANIFEST = "engram-manifest.json"


@step("engram")
def engram(ctx: RunContext, st: Step) -> StepResult:
    """Per rank: node-local Engram rows (a copy with a complete manifest) or NFS fallback (a warning)."""
    from sparkfleet.engines.docker import engram_host_dir

    e = ctx.profile.engram
    if e is None or not e.node_local:
        return StepResult("skip", "the lane reads no node-local Engram rows")
    cmds, where = {}, {}
    for r in ctx.plan.ranks:
        d = engram_host_dir_for(ctx, r, engram_host_dir)
        if d:
            where[r.node.name] = (r.rank, d)
            cmds[r.node.name] = f"cat {shlex.quote(d + '/' + ENGRAM_MANIFEST)}"
    results = ctx.run_each(cmds, timeout_s=30)
    findings, per_rank = [], {}
    for r in ctx.plan.ranks:
        name = r.node.name
        if name not in where and r.rank in e.nfs_ranks and r.node.storage.model_local:
            per_rank[r.rank] = "node-local"  # the node holding the checkpoint reads its rows from local disk
            findings.append(Finding("engram", "ok", f"rank {r.rank}: rows from the local checkpoint", node=name))
            continue
        if name not in where:
            per_rank[r.rank] = "nfs"
            findings.append(Finding("engram", "warn", f"rank {r.rank} reads Engram rows over NFS "
                                    "(listed in engram.nfs_ranks or no engram_local_dir)", node=name,
                                    remedy="sparkfleet engram-local --profile ... (6-8 ms a step over NFS vs 3)"))
            continue
        res = results[name]
        verdict = engram_verdict(ctx, res)
        per_rank[r.rank] = "node-local" if verdict is None else "nfs"
        if verdict is None:
            sha = hashlib.sha256(res.stdout.encode()).hexdigest()
            ctx.record.data.setdefault("engram_manifests", {})[str(r.rank)] = sha
            findings.append(Finding("engram", "ok", f"rank {r.rank}: node-local copy at {where[name][1]}", node=name))
        else:
            findings.append(Finding("engram", "warn", f"rank {r.rank} will fall back to NFS: {verdict}", node=name,
                                    remedy=f"sparkfleet engram-local --profile {ctx.profile.name} --node {name}"))
    ctx.record.data["engram"] = per_rank
    nfs = [str(k) for k, v in per_rank.items() if v == "nfs"]
    return StepResult("warn" if nfs else "ok",
                      "node-local on every rank" if not nfs else f"ranks on NFS: {', '.join(nfs)}", findings)


def engram_host_dir_for(ctx: RunContext, r, fn) -> str | None:
    from sparkfleet.engines.base import LaneContext

    lane = LaneContext(ctx.profile, ctx.inventory, ctx.plan.ranks, ctx.spec.root / "templates")
    return fn(lane, r)


def engram_verdict(ctx: RunContext, res: Result) -> str | None:
    """None when the copy's manifest matches this lane's checkpoint and format; else why not."""
    if not res.ok:
        return "no engram-manifest.json (no complete copy)"
    try:
        m = json.loads(res.stdout)
    except ValueError:
        return "engram-manifest.json is not JSON"
    source = m.get("source") or {}
    want_rev = ctx.profile.model.revision if ctx.profile.model else None
    got_rev = source.get("revision") if isinstance(source, dict) else None
    if want_rev and got_rev and got_rev != want_rev:
        return f"copy is of checkpoint {got_rev[:12]}, the lane runs {want_rev[:12]} (FM-62)"
    want_fmt = ctx.profile.engram.format if ctx.profile.engram else None
    if want_fmt and m.get("format") and m.get("format") != want_fmt:
        return f"copy format {m.get('format')} != lane format {want_fmt} (FM-24)"
    return None


def _rail2_commands(ctx: RunContext, add: bool) -> dict[str, str]:
    r2 = ctx.profile.rail2
    cmds = {}
    for name in (r2.nodes if r2 else []):
        node = ctx.node(name)
        if not (node.rail2_alias and node.rdma and node.rdma.rail2_iface):
            continue
        alias, dev = shlex.quote(node.rail2_alias), shlex.quote(node.rdma.rail2_iface)
        # runtime only: `ip addr` never writes persistent network config (CATALOG LCH-T4)
        cmds[name] = (f"ip addr del {alias} dev {dev} 2>/dev/null; ip addr add {alias} dev {dev}" if add
                      else f"ip addr del {alias} dev {dev} 2>/dev/null || true")
    return cmds


@step("rail2_up")
def rail2_up(ctx: RunContext, st: Step) -> StepResult:
    if ctx.profile.rail2 is None:
        return StepResult("skip", "the lane uses one rail")
    cmds = _rail2_commands(ctx, add=True)
    missing = [n for n in ctx.profile.rail2.nodes if n not in cmds]
    if missing:
        return StepResult("fail", f"no rail2_alias/rail2_iface in the inventory for {', '.join(missing)}")
    if ctx.options.dry_run:
        return StepResult("ok", "would add " + "; ".join(f"{n}: {c}" for n, c in cmds.items()))
    bad = _unreachable(ctx, ctx.run_each(cmds))
    if bad:
        return StepResult("fail", "could not add the rail-2 aliases", bad)
    ctx.record.data["rail2"] = {n: ctx.node(n).rail2_alias for n in cmds}
    return StepResult("ok", "rail-2 aliases added (runtime only) on " + ", ".join(cmds))


@step("rail2_down")
def rail2_down(ctx: RunContext, st: Step) -> StepResult:
    if ctx.profile.rail2 is None:
        return StepResult("skip", "the lane uses one rail")
    cmds = _rail2_commands(ctx, add=False)
    if ctx.options.dry_run:
        return StepResult("ok", "would remove the rail-2 aliases on " + ", ".join(cmds))
    bad = _unreachable(ctx, ctx.run_each(cmds))
    return StepResult("fail" if bad else "ok", "rail-2 aliases removed on " + ", ".join(cmds), bad)


# -- pins (restore) ----------------------------------------------------------------------------------

@step("pins")
def pins(ctx: RunContext, st: Step) -> StepResult:
    from sparkfleet.runner.restore import current_pins, diff_pins

    point = ctx.options.restore_point
    if point is None:
        return StepResult("warn", "no recorded restore point: restoring from the profile's own pins")
    ctx.facts = gather_facts(ctx)
    now = current_pins(ctx)
    drift = diff_pins(point["pins"], now)
    ctx.record.data["pins"] = {"recorded": point["pins"], "now": now, "drift": drift}
    if drift and not ctx.options.force:
        return StepResult("fail", f"{len(drift)} pin(s) drifted since {point['name']!r} was recorded", [
            Finding("pins", "fail", d, "put it back, or restore anyway with --force") for d in drift])
    if drift:
        return StepResult("warn", f"{len(drift)} pin(s) drifted; going on (--force)",
                          [Finding("pins", "warn", d) for d in drift])
    return StepResult("ok", f"every pin of {point['name']!r} matches the fleet")


# -- launch, wait_ready -------------------------------------------------------------------------------

def _render(ctx: RunContext) -> None:
    """Re-render the plan with this run's id (container labels) and the GID indexes the facts resolved."""
    if not ctx.rendered:
        ctx.plan = make_plan(ctx.loaded, ctx.inventory, ctx.playbook, ctx.spec.root,
                             run_id=ctx.record.run_id, gid_index=ctx.gid_index)
        ctx.rendered = True
        ctx.record.data["launches"] = [launch.as_dict() for launch in ctx.plan.launches]


@step("launch")
def launch(ctx: RunContext, st: Step) -> StepResult:
    _render(ctx)
    want = {"workers": ("worker",), "head": ("head",), "all": ("worker", "head")}[st.role or "all"]
    chosen = [x for x in ctx.plan.launches if x.role in want]
    if not chosen:
        return StepResult("skip", f"no {st.role} rank in this lane")
    if ctx.options.dry_run:
        return StepResult("ok", "would start " + ", ".join(f"rank {x.rank} on {x.node}" for x in chosen),
                          data={"launches": [x.as_dict() for x in chosen]})
    env = None
    if ctx.profile.api_key_env:
        import os

        key = os.environ.get(ctx.profile.api_key_env)
        if not key:
            return StepResult("fail", f"the lane needs an API key in ${ctx.profile.api_key_env} (profile api_key_env); "
                              "it is not set here")
        ctx.record.secret_values.add(key)
        var = engine_for(ctx.profile.engine).api_key_var
        assert var is not None  # a lane rule refuses api_key_env for an engine without one
        env = {var: key}
    for wave in sorted({x.wave for x in chosen}):
        batch = [x for x in chosen if x.wave == wave]
        for x in batch:
            for path, content in x.files.items():
                res = ctx.transport.put([ctx.node(x.node)], content.encode(), path)[x.node]
                if not res.ok:
                    return StepResult("fail", f"could not write {path} on {x.node}", _unreachable(ctx, {x.node: res}))
        results = ctx.run_each({x.node: x.script for x in batch}, timeout_s=300, env=env)
        for x in batch:
            res = results[x.node]
            if not res.ok:
                return StepResult("fail", f"rank {x.rank} on {x.node} did not start: "
                                  f"{res.message or res.stderr.strip()[-300:]}")
            cid = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else x.container
            ctx.started.append(Started(x.node, x.rank, x.container, cid))
    return StepResult("ok", "started " + ", ".join(f"rank {x.rank} on {x.node}" for x in chosen))


def _container_state(ctx: RunContext) -> dict[int, dict]:
    """State and exit code of every container this run started (one command per node)."""
    by_node: dict[str, list[Started]] = {}
    for s in ctx.started:
        by_node.setdefault(s.node, []).append(s)
    cmds = {n: "docker inspect " + " ".join(shlex.quote(s.id) for s in ss) for n, ss in by_node.items()}
    results = ctx.run_each(cmds, timeout_s=30)
    out: dict[int, dict] = {}
    for n, ss in by_node.items():
        res = results[n]
        try:
            docs = json.loads(res.stdout) if res.ok else []
        except ValueError:
            docs = []
        by_id = {d.get("Id"): d for d in docs}
        by_name = {str(d.get("Name", "")).lstrip("/"): d for d in docs}
        for s in ss:
            d = by_id.get(s.id) or by_name.get(s.container) or next(
                (v for k, v in by_id.items() if k and k.startswith(s.id)), None)
            state = (d or {}).get("State") or {}
            out[s.rank] = {"node": n, "state": state.get("Status", "missing" if res.ok else "unknown"),
                           "exit_code": state.get("ExitCode"), "reachable": res.ok}
    return out


def _new_log_lines(ctx: RunContext) -> dict[int, list[str]]:
    cmds, by_node = {}, {}
    for s in ctx.started:
        seen = ctx.log_facts.setdefault(s.rank, LogFacts()).lines_seen
        cmds[s.node] = f"docker logs {shlex.quote(s.id)} 2>&1 | tail -n +{seen + 1}"
        by_node[s.node] = s.rank
    results = ctx.run_each(cmds, timeout_s=30)
    return {by_node[n]: (r.stdout.splitlines() if r.ok else []) for n, r in results.items()}


def stop_launch(ctx: RunContext) -> None:
    """Stop every rank this run started (they stay, stopped, for inspection)."""
    by_node: dict[str, list[str]] = {}
    for s in ctx.started:
        by_node.setdefault(s.node, []).append(s.id)
    ctx.run_each({n: "docker stop " + " ".join(map(shlex.quote, ids)) for n, ids in by_node.items()}, timeout_s=120)


@step("wait_ready")
def wait_ready(ctx: RunContext, st: Step) -> StepResult:
    """Poll the head's /health and /v1/models; follow every rank's log; fast-fail on an exit or a fatal line."""
    if ctx.options.dry_run:
        return StepResult("ok", f"would wait for {ctx.endpoint()}/health")
    if not ctx.started:
        return StepResult("fail", "no rank was started by this run")
    budget = ctx.options.boot_budget_s or ctx.profile.expect.boot_budget_s or 900
    deadline = time.time() + budget
    signatures = ctx.profile.fatal_signatures
    engine = engine_for(ctx.profile.engine)
    names = set(ctx.profile.served_names)
    base = ctx.endpoint()
    headers = {}
    if ctx.profile.api_key_env:
        import os

        key = os.environ.get(ctx.profile.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
            ctx.record.secret_values.add(key)
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
        while True:
            for node in station:  # seed new autotune hash dirs before the tuner reads them (LCH-G2)
                res = ctx.run_each({node.name: autotune.seed_command(node.storage.cache_dir, started_at)},
                                   timeout_s=30)[node.name]
                seeded = autotune.parse(res.stdout)["seeded"] if res.ok else []
                for d in seeded:
                    ctx.events.emit("message", text=f"seeded autotune cache {d} on {node.name}")
                    ctx.record.data.setdefault("autotune_seeded", []).append(d)
            states = _container_state(ctx)
            for rank, lines in _new_log_lines(ctx).items():
                tail = ctx.logs_tail.setdefault(rank, [])
                tail.extend(lines)
                del tail[:-LOG_TAIL]
                feed(ctx.log_facts[rank], lines, signatures, engine.log)
            ctx.events.ranks([{"node": s["node"], "rank": r, "state": s["state"],
                               "phase": ctx.log_facts.get(r, LogFacts()).phase,
                               "lines": ctx.log_facts.get(r, LogFacts()).lines_seen}
                              for r, s in sorted(states.items())])
            for rank, lf in sorted(ctx.log_facts.items()):
                if lf.fatal:
                    detail = f" ... {lf.fatal_detail}" if lf.fatal_detail else ""
                    return _fail_launch(ctx, f"rank {rank} logged a fatal line: {lf.fatal}{detail}")
            for rank, s in sorted(states.items()):
                if s["state"] in ("exited", "dead", "missing"):
                    return _fail_launch(ctx, f"rank {rank} on {s['node']} {s['state']}"
                                        + (f" with code {s['exit_code']}" if s["exit_code"] is not None else ""))
            ready, why = _api_ready(http, base, names)
            if ready and engine.ready_from_log and not ctx.log_facts.get(0, LogFacts()).api_up:
                ready, why = False, f"{why}, but the head has not logged that it serves"
            if ready:
                ctx.record.data["log_facts"] = {str(r): lf.as_dict() for r, lf in ctx.log_facts.items()}
                return StepResult("ok", f"serving at {base} ({why})")
            if time.time() > deadline:
                return _fail_launch(ctx, f"not healthy after {budget:.0f} s (the profile's boot budget): {why}")
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


def _fail_launch(ctx: RunContext, why: str) -> StepResult:
    stop_launch(ctx)
    ctx.record.data["log_facts"] = {str(r): lf.as_dict() for r, lf in ctx.log_facts.items()}
    ctx.record.data["last_log_lines"] = {str(r): lines for r, lines in ctx.logs_tail.items()}
    return StepResult("fail", why + "; every rank of this launch was stopped")


# -- expect, gates -----------------------------------------------------------------------------------

@step("expect")
def expect(ctx: RunContext, st: Step) -> StepResult:
    from sparkfleet.runner.expect import assert_expectations

    if ctx.options.dry_run:
        return StepResult("ok", "would assert the profile's expectations")
    after = gather_facts(ctx)
    ctx.record.data["facts_after_load"] = {n: f.model_dump(mode="json") for n, f in after.items()
                                           if isinstance(f, NodeFacts)}
    findings = assert_expectations(ctx, after)
    ctx.record.data["expect"] = [f.as_dict() for f in findings]
    if failed(findings):
        stop_launch(ctx)
        return StepResult("fail", "expectations not met; every rank of this launch was stopped", findings)
    warns = [f for f in findings if f.status == "warn"]
    return StepResult("warn" if warns else "ok", f"{len(findings)} expectation(s) checked", findings)


@step("gates")
def gates(ctx: RunContext, st: Step) -> StepResult:
    try:
        from sparkfleet.gates.run import gates_step
    except ImportError:
        return StepResult("skip", "answer gates are not part of this build")
    if ctx.options.gate_args:
        st = st.model_copy(update={"args": {**st.args, **ctx.options.gate_args}})
    return gates_step(ctx, st)


@step("record")
def record(ctx: RunContext, st: Step) -> StepResult:
    return StepResult("ok", f"run {ctx.record.run_id} recorded")
