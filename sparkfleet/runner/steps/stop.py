"""The stop step: every container of this lane on its nodes, found by label, removed (or kept), gone."""

from __future__ import annotations

import time

from sparkfleet.findings import Finding
from sparkfleet.fleet import ops
from sparkfleet.fleet.op import placeholder
from sparkfleet.runner import slurm_launch
from sparkfleet.runner.context import RunContext
from sparkfleet.runner.ops import StepGen, StepResult
from sparkfleet.schema.playbook import Step

NAMED_UP_TO = 8  # more nodes than this that answered are counted, not named: the ones that failed are named after


def listed(names: list[str], other: str) -> str:
    """Nodes that answered as their names, or past NAMED_UP_TO as a count (`the 62 other nodes`), so a line about
    a 64-node lane still shows the nodes that did not answer."""
    return ", ".join(names) if len(names) <= NAMED_UP_TO else f"the {len(names)} {other} nodes"


def lane_containers(ctx: RunContext, running_only: bool, nodes: list[str] | None = None) -> StepGen:
    """This lane's container ids per node, by label (one `docker ps` per node); node failures as NodeErrors."""
    lane = ops.LaneContainers(ctx.profile.name, running_only)
    names = [n.name for n in ctx.nodes] if nodes is None else nodes
    results = yield ops.on("list the lane's containers", dict.fromkeys(names, lane), 60)
    if results is None:  # --dry-run: not read; the stop command names what it would have found
        return {n: [placeholder(f"ids of the lane's containers on {n}")] for n in names}, {}
    found, bad = {}, {}
    for name, res in results.items():
        ids = lane.parse(res)
        if isinstance(ids, ops.NodeError):
            bad[name] = ids
        elif ids:
            found[name] = ids
    return found, bad


def unreached(ctx: RunContext, bad: dict[str, ops.NodeError]) -> tuple[list[Finding], dict]:
    """One finding per node that could not be asked (unreachable, docker not answering): the rank of this
    lane that may still run there, and the remedy; and the record's `unreachable` entry."""
    ranks = {r.node.name: r.rank for r in ctx.plan.ranks}
    findings, doc = [], {}
    for node, e in bad.items():
        rank = ranks.get(node)
        remedy = (f"{e.remedy or 'bring the node back'}; rank {rank} of {ctx.profile.name} may still run there "
                  f"(holding its GPU memory and port): once {node} answers, run `sparkfleet down --profile "
                  f"{ctx.profile.name} --limit {node}`")
        # the check is what failed there (reach, docker-down, ...): the message is the node's own answer
        findings.append(Finding(e.kind, "fail", e.message, remedy, node=node))
        doc[node] = {"rank": rank, "kind": e.kind, "why": e.message, "remedy": remedy}
    return findings, doc


def stop(ctx: RunContext, st: Step) -> StepGen:
    """The lane's Slurm job first when it runs as one (slurm_launch.stop), then its containers (below)."""
    if ctx.inventory.launcher == "slurm":
        return (yield from slurm_launch.stop(ctx, st, containers))
    return (yield from containers(ctx, st))


def containers(ctx: RunContext, st: Step) -> StepGen:
    """Stop every container of this lane on every node that answers, wait until they are gone, then fail
    naming each node that could not be asked (and the rank that may still run there).

    Only containers carrying this lane's label are touched: another lane's or a foreign container is
    reported by `check` and never stopped here (docs/failure-modes.md FM-48). Removing them (not just stopping) means
    no old head's rendezvous is left on the master port for a new worker to join (FM-01). A node that does
    not answer does not keep the survivors up: they are stopped all the same (one dead node must not leave
    three ranks holding GPU memory and the port)."""
    keep = ctx.options.keep
    found, bad = yield from lane_containers(ctx, running_only=False)
    reached = [n.name for n in ctx.nodes if n.name not in bad]
    ranks = {r.node.name: r.rank for r in ctx.plan.ranks}
    head_first = st.args.get("order") == "head-first"
    order = sorted(found, key=lambda n: (ranks.get(n, 99) if head_first else -ranks.get(n, 99)))
    n = sum(len(v) for v in found.values())
    if found:
        # down: the head first, so workers see it go rather than a half-dead lane serving
        stops = {x: ops.Stop(tuple(found[x]), remove=not keep) for x in order}
        results = yield ops.on("stop the lane's containers", stops, 120, serial=head_first)
        if results is None:
            return StepResult("ok", "would stop this lane's containers on " + ", ".join(order))
        failed = {x: e for x, e in ((x, stops[x].parse(r)) for x, r in results.items()) if e is not None}
        if any(e.kind != "reach" for e in failed.values()):
            return StepResult("fail", "could not stop every container", [e.finding() for e in failed.values()])
        bad.update(failed)
        reached = [x for x in reached if x not in failed]
        deadline = time.time() + ctx.options.stop_timeout_s
        while reached:
            left, lost = yield from lane_containers(ctx, running_only=keep, nodes=reached)
            bad.update(lost)
            reached = [x for x in reached if x not in lost]
            left = {x: v for x, v in left.items() if x in reached}
            if not left:
                break
            if time.time() > deadline:
                return StepResult("fail", "containers still there after stopping: "
                                  + ", ".join(f"{x}: {len(v)}" for x, v in left.items()))
            time.sleep(0.3)
    if found:
        done = f"{'stopped (kept)' if keep else 'removed'} {n} container(s) on " + ", ".join(order)
    else:
        done = "no container of this lane on " + (listed(reached, "other") if bad else "its nodes") if reached else \
            "no node answered"
    data = {"stopped": {k: found[k] for k in order}} if found else {}
    if not bad:
        return StepResult("ok", done, data=data)
    findings, doc = unreached(ctx, bad)
    ctx.record.data["unreachable"] = doc
    one = len(bad) == 1
    return StepResult("fail", f"{done}; " + ", ".join(f"{x} ({e.kind})" for x, e in bad.items())
                      + f" did not answer: rank {', '.join(str(ranks.get(x)) for x in bad)} may still be running "
                      f"there; once {'it answers' if one else 'they answer'}, run `sparkfleet down --profile "
                      f"{ctx.profile.name} --limit {','.join(bad)}`", findings, data)
