"""The preflight steps, before anything starts: facts, checks, the clock probe under load, the fabric probe
and NCCL's transport. Any failure here stops the run while nothing runs yet."""

from __future__ import annotations

from collections.abc import Generator

from sparkfleet.checks import clock, run_checks
from sparkfleet.checks import nccl as judge
from sparkfleet.checks import probe as clock_probe
from sparkfleet.checks.fabric_probe import suspects, verdict
from sparkfleet.findings import Finding, failed, unread
from sparkfleet.fleet import fabric_measure as fp
from sparkfleet.fleet import ops
from sparkfleet.fleet.gather import facts_requests, gather_ops, resolve_gid_indexes
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.fleet.ops import allreduce
from sparkfleet.fleet.transport import Result
from sparkfleet.runner.context import RunContext
from sparkfleet.runner.ops import NodeCommands, Reply, StepGen, StepResult
from sparkfleet.schema.playbook import Step


def gather_facts(ctx: RunContext, with_lane: bool = True) -> Generator[NodeCommands, Reply, dict]:
    """The lane's facts, one helper run per node; {} under --dry-run (unless --dry-run=facts)."""

    requests = facts_requests(ctx.inventory, ctx.plan, ctx.profile, root=ctx.spec.root) if with_lane else {}
    return (yield from gather_ops(ctx.nodes, requests))


def facts(ctx: RunContext, st: Step) -> StepGen:

    ctx.facts = yield from gather_facts(ctx)
    if not ctx.facts:  # --dry-run: the helper was not run; the launches show `auto`
        ctx.plan.bind_gids({})
        return StepResult("ok", f"would gather facts on {len(ctx.nodes)} node(s) (--dry-run=facts gathers them, "
                          "read-only)")
    ctx.gid_index = resolve_gid_indexes(ctx.nodes, ctx.facts)
    ctx.plan.bind_gids(ctx.gid_index)  # every later step (check, nccl, launch) reads the launches as they run
    ctx.record.data["facts"] = {n: (f.model_dump(mode="json") if isinstance(f, NodeFacts) else
                                    {"error": f.error, "message": f.message}) for n, f in ctx.facts.items()}
    bad = ops.failures({n: f for n, f in ctx.facts.items() if isinstance(f, Result)})
    if bad:
        return StepResult("fail", f"{len(bad)} node(s) did not answer", bad)
    sim = any(isinstance(f, NodeFacts) and f.simulated for f in ctx.facts.values())
    return StepResult("ok", f"{len(ctx.facts)} node(s) answered" + (" [sim]" if sim else ""),
                      data={"gid_index": ctx.gid_index})


def check(ctx: RunContext, st: Step) -> StepResult:

    if ctx.options.dry_run and not ctx.facts:
        return StepResult("ok", "would run the preflight checks on the facts (not gathered under --dry-run; "
                          "--dry-run=facts gathers them)")
    findings = run_checks(ctx.plan, ctx.inventory, ctx.facts, profile=ctx.profile,
                          caches_dropped=ctx.caches_dropped)
    ctx.findings = findings
    ctx.record.data["findings"] = [f.as_dict() for f in findings]
    if failed(findings):
        n = sum(1 for f in findings if f.status == "fail")
        return StepResult("fail", f"{n} check(s) failed: nothing was started", findings)
    # a check that could not read its part is not passed: stop as on a failure, unless the operator said to go
    # on; the idle clock's "not judged" (an unknown with no unread part) never stops a run
    unknown = unread(findings)
    if unknown and not ctx.options.accept_unknown:
        return StepResult("fail", f"{len(unknown)} check(s) could not judge a part the node could not read: "
                          "nothing was started (--accept-unknown goes on without them)", findings)
    if unknown:
        ctx.record.data["accepted_unknowns"] = [f.as_dict() for f in unknown]
    warns = sum(1 for f in findings if f.status == "warn")
    return StepResult("warn" if warns or unknown else "ok", f"{len(findings)} finding(s), {warns} warning(s)"
                      + (f", {len(unknown)} unknown(s) accepted (--accept-unknown)" if unknown else ""), findings)


def probe(ctx: RunContext, st: Step) -> StepGen:
    """Load every rank's GPU (in the lane's image, as `check --probe` does) and judge clock latch and slow
    state from the samples under load; a latched rank stops the run before anything starts (FM-09).

    The clock findings replace the check step's idle snapshot in the record ("unknown": not judged)."""

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
    probes = {n.name: ops.ClockProbe(clock.load_for(n, _facts_of(ctx, n.name), ctx.profile,
                                                    seconds=ctx.options.probe_seconds)) for n in judged}
    results = yield ops.on("load each rank's GPU and sample its clock", probes,
                           ops.ClockProbe.timeout_s)
    if results is None:
        return StepResult("ok", "would probe the GPU clock under load on " + ", ".join(probes))
    findings: list[Finding] = []
    runs = {}
    for n in judged:
        run = probes[n.name].parse(results[n.name])
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

    nodes = {f.node for f in findings}
    ctx.findings = [f for f in ctx.findings if not (f.check in (clock.CHECK, clock.SLOW) and f.node in nodes)] \
        + findings
    ctx.record.data["findings"] = [f.as_dict() for f in ctx.findings]


def probe_ratio(ctx: RunContext):
    def ratio(link) -> float | None:
        return ctx.inventory.hardware(ctx.inventory.nodes[link.a]).fabric_probe_ratio
    return ratio


def fabric_probe(ctx: RunContext, st: Step) -> StepGen:
    """Measure every pair of the lane's ranks over their fabric IPs; a link far off the others fails."""

    ranks = ctx.plan.ranks
    if len(ranks) < 2:
        return StepResult("skip", "one rank: nothing crosses the fabric")
    if not ctx.options.fabric_probe:
        return StepResult("skip", "fabric probe off (--no-fabric-probe)")
    if all(r.node.transport == "local" for r in ranks):
        # the local transport runs on this machine: its ranks share one network, there is no link to measure
        return StepResult("skip", "every rank is on the local transport (this machine): no fabric between them; "
                          "`sparkfleet check --fabric` probes anyway")
    if any(r.node.transport == "srun" for r in ranks):
        # the probe keeps a server on each node while others drive to it: two commands on one node at once,
        # which one-task jobs of their own on whole-node partitions cannot be (the second waits for the first)
        return StepResult("skip", "compute nodes reached through srun (slurm.ssh: false): a node runs one "
                          "command job at a time, and the probe needs a server and a driver there at once; "
                          "the links are not judged")
    bulk = int(st.args.get("bulk_bytes", fp.BULK_BYTES))
    run = yield from fp.probe_ops(ranks, bulk_bytes=bulk, confirm=suspects(probe_ratio(ctx)))
    if run is None:  # --dry-run: every command was shown
        links = [x for rnd in fp.plan_links(fp.endpoints(ranks)[0]) for x in rnd]
        return StepResult("ok", f"would measure {len(links)} link(s) over the fabric IPs on port {fp.PORT} "
                          f"({fp.HELPER} on each rank; RTT at "
                          + ", ".join(f"{s // 1024} KB" for s in fp.RTT_SIZES)
                          + f", {bulk // 2**20} MB each way): " + "; ".join(
                              f"{x.a} {x.a_ip} <-> {x.b} {x.b_ip}" for x in links),
                          data={"links": [x.name for x in links]})
    findings = verdict(run, probe_ratio(ctx))
    ctx.record.data["fabric_probe"] = {**run.as_dict(), "findings": [f.as_dict() for f in findings]}
    if failed(findings):
        bad = [f for f in findings if f.status == "fail"]
        return StepResult("fail", f"{len(bad)} fabric link(s) failed the probe: nothing was started", findings)
    slowest = min((x for x in run.links if x.bps), key=lambda x: x.bps or 0, default=None)
    return StepResult("ok", f"{len(run.links)} link(s) measured"
                      + (f"; slowest {slowest.name} {slowest.bps / 1e9:.3g} Gb/s" if slowest and slowest.bps else ""),
                      findings)


def nccl(ctx: RunContext, st: Step) -> StepGen:
    """Optional (add `- nccl` after `check`): the NCCL all-reduce in the lane's image; sockets on an RDMA lane fail."""

    ranks = ctx.plan.ranks
    if ctx.profile.image is None:
        return StepResult("skip", "the lane has no image to run NCCL in")
    runs = allreduce.commands(ctx.profile, ranks, ctx.plan.launches, ctx.gid_index, run_id=ctx.record.run_id)
    yield from allreduce.allreduce_ops(ranks, runs)
    if ctx.options.dry_run and any(x.result is None for x in runs):  # shown, not run
        return StepResult("ok", f"would run the NCCL all-reduce on {len(runs)} rank(s)")
    findings, seen = judge.judge(runs, judge.expects_rdma(ranks))
    ctx.record.data["nccl"] = {"ranks": seen, "findings": [f.as_dict() for f in findings]}
    if failed(findings):
        return StepResult("fail", "NCCL's all-reduce failed or fell back to sockets: nothing was started", findings)
    return StepResult("ok", f"NCCL all-reduce on {len(runs)} rank(s)", findings)
