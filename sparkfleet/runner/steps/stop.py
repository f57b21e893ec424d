"""The stop step: every container of this lane on its nodes, found by label, removed (or kept), gone."""

from __future__ import annotations

import time

from sparkfleet.fleet import commands as nodeops
from sparkfleet.fleet.op import placeholder
from sparkfleet.runner.context import RunContext
from sparkfleet.runner.ops import NodeCommands, StepGen, StepResult, query
from sparkfleet.spec.playbook import Step


def lane_containers(ctx: RunContext, running_only: bool) -> StepGen:
    """This lane's container ids per node, by label (one `docker ps` per node); node failures as findings."""
    cmd = nodeops.lane_containers_command(ctx.profile.name, running_only)
    results = yield query("list the lane's containers", {n.name: cmd for n in ctx.nodes})
    if results is None:  # --dry-run: not read; the stop command names what it would have found
        return {n.name: [placeholder(f"ids of the lane's containers on {n.name}")] for n in ctx.nodes}, []
    found, bad = {}, []
    for name, res in results.items():
        ids = nodeops.parse_container_ids(res)
        if isinstance(ids, nodeops.NodeError):
            bad.append(ids.finding())
        elif ids:
            found[name] = ids
    return found, bad


def stop(ctx: RunContext, st: Step) -> StepGen:
    """Stop every container of this lane on the lane's nodes and wait until they are gone.

    Only containers carrying this lane's label are touched: another lane's or a foreign container is
    reported by `check` and never stopped here (CATALOG FM-48). Removing them (not just stopping) means
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
        return StepResult("ok", "would stop this lane's containers on " + ", ".join(order))
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
