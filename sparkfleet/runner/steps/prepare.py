"""The steps that prepare the nodes for a launch: patches verified, page cache dropped, Engram copies
judged, rail-2 aliases, and restore's pins."""

from __future__ import annotations

import dataclasses

from sparkfleet.engram import ranges as engram_ranges
from sparkfleet.engram.fleet import manifest_reads
from sparkfleet.engram.manifest import judge_lane
from sparkfleet.findings import Finding, failed
from sparkfleet.fleet import ops
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.fleet.ops import patches as patch_ops
from sparkfleet.patches import manifest as pm
from sparkfleet.runner import restore as rp
from sparkfleet.runner.context import RunContext
from sparkfleet.runner.ops import StepGen, StepResult, query
from sparkfleet.runner.steps.preflight import gather_facts
from sparkfleet.schema.errors import UserError
from sparkfleet.schema.playbook import Step


def patches(ctx: RunContext, st: Step) -> StepGen:

    name = ctx.profile.patches
    if not name:
        return StepResult("skip", "the lane uses no patch set")
    refused = pm.refusals(ctx.spec.root, name)  # the same judgement `profiles` shows as servable: no
    if refused:
        why = refused[0].observed if refused[0].observed in (
            "has no manifest", "is not known in full (the seeds do not list its files or checksums)") \
            else "differs from its manifest here"
        return StepResult("fail", f"patch set {name!r} {why}: nothing was started", refused)
    manifest = pm.load(ctx.spec.root, name)
    states = yield from patch_ops.inspect_ops(ctx.nodes, manifest)
    if states is None:
        return StepResult("ok", f"would verify patch set {name!r} ({len(manifest.files)} file(s)) on every rank")
    findings = patch_ops.findings(states, manifest)
    ctx.record.data["patches"] = {"set": name, "manifest_sha256": ctx.patch_manifest_sha256(), "nodes": {
        k: {"ok": v.ok, "missing": v.missing, "wrong": v.wrong, "found": v.found} for k, v in states.items()}}
    if failed(findings):
        return StepResult("fail", f"a rank lacks patch set {name!r} files: the whole launch is aborted", findings)
    return StepResult("ok", f"patch set {name!r}: {len(manifest.files)} file(s) verified on every rank", findings)


def drop_caches(ctx: RunContext, st: Step) -> StepGen:
    drop = ops.DropCaches()
    results = yield ops.on("drop the page cache", {n.name: drop for n in ctx.nodes}, drop.timeout_s)
    if results is None:
        return StepResult("ok", "would drop the page cache on every node")
    done = {n: v for n, v in ((n, drop.parse(r)) for n, r in results.items()) if v is not None}
    ctx.caches_dropped = done
    bad = [Finding("drop-caches", "fail", f"could not drop the page cache: {v if v is not True else ''}",
                   "sparkfleet needs root on the node for this (as the seeds' launcher had)", node=n)
           for n, v in done.items() if v is not True]
    bad += ops.failures({n: r for n, r in results.items() if n not in done})
    if bad:
        return StepResult("fail", "could not drop caches everywhere", bad)
    return StepResult("ok", f"dropped the page cache on {len(done)} node(s)")


def engram(ctx: RunContext, st: Step) -> StepGen:
    """Per rank: node-local Engram rows (a copy the one Engram rule accepts) or NFS fallback, said before
    launch: a warning, or, with `expect.engram_node_local: true`, a failure for every rank outside
    engram.nfs_ranks without a qualifying copy (none at all, wrong revision or format, missing rows,
    unverified, another rank's): nothing starts."""

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
    if results is None:
        return StepResult("ok", f"would judge the node-local Engram copies of {len(dirs)} rank(s) by their manifests")
    findings, per_rank, shas = judge_lane(ctx.profile, ctx.plan.ranks, dirs, results, harvest)
    if shas:
        ctx.engram_manifests = dict(shas)
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


def _rail2_commands(ctx: RunContext, add: bool) -> dict[str, ops.Rail2Alias]:
    r2 = ctx.profile.rail2
    cmds = {}
    for name in (r2.nodes if r2 else []):
        node = ctx.node(name)
        if node.rail2_alias and node.rdma and node.rdma.rail2_iface:
            cmds[name] = ops.Rail2Alias(node.rail2_alias, node.rdma.rail2_iface, add)
    return cmds


def rail2_up(ctx: RunContext, st: Step) -> StepGen:
    if ctx.profile.rail2 is None:
        return StepResult("skip", "the lane uses one rail")
    cmds = _rail2_commands(ctx, add=True)
    missing = [n for n in ctx.profile.rail2.nodes if n not in cmds]
    if missing:
        return StepResult("fail", f"no rail2_alias/rail2_iface in the inventory for {', '.join(missing)}")
    results = yield ops.on("add the rail-2 aliases", cmds, 120)
    if results is None:
        return StepResult("ok", "would add the rail-2 aliases on " + ", ".join(cmds))
    bad = ops.failures(results)
    if bad:
        return StepResult("fail", "could not add the rail-2 aliases", bad)
    ctx.record.data["rail2"] = {n: ctx.node(n).rail2_alias for n in cmds}
    return StepResult("ok", "rail-2 aliases added (runtime only) on " + ", ".join(cmds))


def rail2_down(ctx: RunContext, st: Step) -> StepGen:
    if ctx.profile.rail2 is None:
        return StepResult("skip", "the lane uses one rail")
    cmds = _rail2_commands(ctx, add=False)
    results = yield ops.on("remove the rail-2 aliases", cmds, 120)
    if results is None:
        return StepResult("ok", "would remove the rail-2 aliases on " + ", ".join(cmds))
    bad = ops.failures(results)
    return StepResult("fail" if bad else "ok", "rail-2 aliases removed on " + ", ".join(cmds), bad)


# -- pins (restore) ----------------------------------------------------------------------------------

def pins(ctx: RunContext, st: Step) -> StepGen:
    """restore: adopt the recorded launches, say what today would render differently, refuse on drifted pins."""

    view = ctx.options.restore_point
    if view is None:
        return StepResult("warn", "no recorded restore point: restoring from the profile's own pins")
    point = view["point"]
    rp.adopt(ctx, point)
    ctx.facts = yield from gather_facts(ctx)
    changes = rp.today_changes(ctx, point)
    drift = yield from rp.pin_drift(ctx, point)
    if drift is None:
        return StepResult("ok", f"would verify every pin of {point.name!r} against the fleet (not read under "
                          "--dry-run)", changes)
    ctx.record.data["pins"] = {"drift": [f.message for f in drift], "today": [f.message for f in changes]}
    silent = sorted({f.node for f in drift if f.node and not isinstance(ctx.facts.get(f.node), NodeFacts)})
    if silent and not ctx.options.force:  # a node that did not answer is not a drifted pin: say which it is
        rest = len(drift) - len(silent)
        return StepResult("fail", f"{', '.join(silent)} did not answer, so no pin of {point.name!r} can be checked "
                          "there" + (f"; {rest} pin(s) drifted elsewhere" if rest else "") + ": nothing was stopped",
                          drift + changes)
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
