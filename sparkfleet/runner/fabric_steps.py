"""The fabric steps of a playbook: `fabric_probe` (measured links between the ranks) and `nccl` (transport).

Registered into runner/steps.py's STEPS when that module is imported. Both run before any rank is
started, so a slow link or a socket fallback fails the launch while nothing is running yet.
"""

from __future__ import annotations

from sparkfleet.findings import failed
from sparkfleet.runner.context import RunContext
from sparkfleet.runner.ops import StepResult
from sparkfleet.runner.steps import step
from sparkfleet.spec.playbook import Step


def probe_ratio(ctx: RunContext):
    def ratio(link) -> float | None:
        return ctx.inventory.hardware(ctx.inventory.nodes[link.a]).fabric_probe_ratio
    return ratio


@step("fabric_probe")
def fabric_probe(ctx: RunContext, st: Step) -> StepResult:
    """Measure every pair of the lane's ranks over their fabric IPs; a link far off the others fails."""
    from sparkfleet.checks.fabric_probe import suspects, verdict
    from sparkfleet.fleet import fabric_probe as fp

    ranks = ctx.plan.ranks
    if len(ranks) < 2:
        return StepResult("skip", "one rank: nothing crosses the fabric")
    if not ctx.options.fabric_probe:
        return StepResult("skip", "fabric probe off (--no-fabric-probe)")
    if all(r.node.transport == "local" for r in ranks):
        # the local transport runs on this machine: its ranks share one network, there is no link to measure
        return StepResult("skip", "every rank is on the local transport (this machine): no fabric between them; "
                          "`sparkfleet check --fabric` probes anyway")
    bulk = int(st.args.get("bulk_bytes", fp.BULK_BYTES))
    nodes, missing = fp.endpoints(ranks)
    links = [x for rnd in fp.plan_links(nodes) for x in rnd]
    if ctx.options.dry_run:
        for what, node, request in fp.requests(nodes, bulk):
            ctx.events.emit("would", what=what, node=node, command=fp.command(), stdin=request)
        return StepResult("ok", f"would measure {len(links)} link(s) over the fabric IPs on port {fp.PORT} "
                          f"({fp.HELPER} on each rank; RTT at "
                          + ", ".join(f"{s // 1024} KB" for s in fp.RTT_SIZES)
                          + f", {bulk // 2**20} MB each way): " + "; ".join(
                              f"{x.a} {x.a_ip} <-> {x.b} {x.b_ip}" for x in links),
                          data={"links": [x.name for x in links]})
    run = fp.probe(ctx.transport, ranks, bulk_bytes=bulk, confirm=suspects(probe_ratio(ctx)))
    findings = verdict(run, probe_ratio(ctx))
    ctx.record.data["fabric_probe"] = {**run.as_dict(), "findings": [f.as_dict() for f in findings]}
    if failed(findings):
        bad = [f for f in findings if f.status == "fail"]
        return StepResult("fail", f"{len(bad)} fabric link(s) failed the probe: nothing was started", findings)
    slowest = min((x for x in run.links if x.bps), key=lambda x: x.bps or 0, default=None)
    return StepResult("ok", f"{len(run.links)} link(s) measured"
                      + (f"; slowest {slowest.name} {slowest.bps / 1e9:.3g} Gb/s" if slowest and slowest.bps else ""),
                      findings)


@step("nccl")
def nccl(ctx: RunContext, st: Step) -> StepResult:
    """Optional (add `- nccl` after `check`): the NCCL all-reduce in the lane's image; sockets on an RDMA lane fail."""
    from sparkfleet.checks import nccl as judge
    from sparkfleet.fleet import nccl as allreduce

    ranks = ctx.plan.ranks
    if ctx.profile.image is None:
        return StepResult("skip", "the lane has no image to run NCCL in")
    runs = allreduce.commands(ctx.profile, ranks, ctx.plan.launches, ctx.gid_index, run_id=ctx.record.run_id)
    if ctx.options.dry_run:
        for x in runs:
            ctx.events.emit("would", what="NCCL all-reduce in the lane's image", node=x.node, command=x.command)
        return StepResult("ok", f"would run the NCCL all-reduce on {len(runs)} rank(s)")
    allreduce.run(ctx.transport, ranks, runs)
    findings, seen = judge.judge(runs, judge.expects_rdma(ranks))
    ctx.record.data["nccl"] = {"ranks": seen, "findings": [f.as_dict() for f in findings]}
    if failed(findings):
        return StepResult("fail", "NCCL's all-reduce failed or fell back to sockets: nothing was started", findings)
    return StepResult("ok", f"NCCL all-reduce on {len(runs)} rank(s)", findings)
