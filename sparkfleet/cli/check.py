"""`sparkfleet check --profile P`: preflight every node of a lane and print a table of findings."""

from __future__ import annotations

import argparse
from typing import Any

from sparkfleet.checks import run_checks
from sparkfleet.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_UNKNOWN,
    EXIT_USAGE,
    STYLE,
    add_dry_run,
    add_inventory,
    add_json,
    add_overrides,
    add_root,
    add_wide,
    dry_reads,
    err,
    executor,
    fleet_inventory,
    out,
    overrides,
    print_findings,
    print_json,
    spec,
)
from sparkfleet.cli.tables import WHOLE_UP_TO
from sparkfleet.findings import Finding, failed, unread
from sparkfleet.fleet.ops import drop_caches
from sparkfleet.plan import Plan, make_plan
from sparkfleet.schema.errors import UserError
from sparkfleet.schema.inventory import Inventory, Node
from sparkfleet.schema.profile import Profile

ORDER = 25

EPILOG = """examples:
  sparkfleet check --profile dcp2                   # every rank's node: memory, earlyoom, clock, RDMA, storage,
                                                    # image, bind mounts, port/GPU conflicts
  sparkfleet check --profile dcp1 --drop-caches     # drop the page cache first (the 100 GiB floor is after it)
  sparkfleet check --profile dcp2 --probe           # also load each GB10 GPU and judge its clock under load
  sparkfleet check --profile dcp2 --probe-command 'python3 my_load.py'
  sparkfleet check --profile dcp2 --fabric          # also measure every pair of ranks over the fabric
  sparkfleet check --profile dcp2 --nccl --dry-run  # the all-reduce each rank would run in the lane's image
  sparkfleet check --profile dcp2 --json | jq '.findings[] | select(.status == "fail")'"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="preflight a lane's nodes: a table of findings with remedies",
                       description="Gather facts from every node of the lane (one round trip each, in parallel) "
                       "and run the preflight checks over them: MemAvailable floors, earlyoom and the lane's "
                       "memory margin, GPU clock latch and slow state, RoCE GID index, model/Engram/cache "
                       "storage, the image and its digest, bind-mount sources, and whatever holds the lane's "
                       "port or GPU. Nothing is started or stopped (except --drop-caches and the --probe load).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(p)
    add_inventory(p)
    add_json(p)
    add_wide(p, f", and every finding (past {WHOLE_UP_TO} ranks the ok ones are counted, not shown)")
    add_overrides(p)
    p.add_argument("--profile", "-p", required=True, help="the lane to check")
    p.add_argument("--drop-caches", action="store_true",
                   help="drop the page cache on every node first (as the node's ssh user: needs root)")
    p.add_argument("--probe", action="store_true",
                   help="run a GPU load on each node whose class has clock-latch thresholds (GB10) and judge "
                   "the SM clock under it; default load: the matmul in the lane's image (the sim's load on "
                   "simulated nodes)")
    p.add_argument("--probe-command", metavar="CMD", help="the load to run instead (implies --probe)")
    p.add_argument("--fabric", action="store_true",
                   help="measure every pair of the lane's ranks over their fabric IPs: round trip at 48 KB and "
                   "400 KB, bandwidth each way; a link far off the others' median fails")
    p.add_argument("--fabric-bytes", type=int, metavar="N", help="bytes sent each way per link (default: 64 MiB)")
    p.add_argument("--nccl", action="store_true",
                   help="run an NCCL all-reduce across the ranks in the lane's image with the lane's NCCL env and "
                   "each node's HCA and GID; fail when a rank of an RDMA lane falls back to NET/Socket")
    add_dry_run(p, "contact no node: say what would be gathered and (with --nccl) print each rank's command")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S", help="facts timeout per node (default: 30)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.fabric_bytes is not None and args.fabric_bytes < 1:
        raise UserError(f"--fabric-bytes must be a positive number of bytes, not {args.fabric_bytes}")
    dry, reads = bool(args.dry_run), dry_reads(args)
    sp = spec(args)
    loaded = sp.profile(args.profile, overrides(args))
    if loaded.profile.abstract:
        raise UserError(f"{args.profile} is a base for other lanes (abstract: true), not a lane; "
                        "see `sparkfleet profiles`")
    profile = loaded.profile
    inventory = fleet_inventory(sp, args.inventory)
    plan = make_plan(loaded, inventory, sp.playbook("up"), sp.root)
    if plan.refused:
        if args.json:
            print_json({"profile": plan.profile, "inventory": plan.inventory, "ok": False, "refused": True,
                        "lane": [f.as_dict() for f in plan.findings]})
        else:
            print_findings([f for f in plan.findings if f.status == "fail"], err)
            err.print(f"sparkfleet: lane {plan.profile!r} is refused before any node is contacted; "
                      "fix the findings above", markup=False)
        return EXIT_USAGE
    # imported when used: the facts' modules cost every verb's start-up
    from sparkfleet.fleet.gather import facts_requests, gather_ops

    nodes = [r.node for r in plan.ranks]
    would: list[dict[str, Any]] = []  # every command --dry-run shows (the executor's, not run)
    requests = facts_requests(inventory, plan, profile, root=sp.root)
    # the one executor of the facts, --probe, --fabric and --nccl: under --dry-run it shows their commands
    # (collected in `would` for the report) and runs none, through a transport that opens no connection
    ex = executor(args, nodes, emit=lambda event, **line: would.append(line))
    if dry and not reads:  # --dry-run: no node is contacted at all
        ex.drive(gather_ops(nodes, requests, timeout_s=args.timeout))  # the facts helper's run, shown
        fabric = run_fabric(ex, plan, inventory, args) if args.fabric else None
        nccl = run_nccl(ex, plan, profile, {}, args) if args.nccl else None
        return dry_report(plan, nodes, fabric, nccl, would, args)
    transport = ex.transport
    try:
        dropped = drop_caches(transport, nodes) if args.drop_caches and not dry else {}
        # through the executor: under --dry-run=facts a node without the helper runs it inline, nothing is shipped
        facts = ex.drive(gather_ops(nodes, requests, timeout_s=args.timeout))
        probes: dict[str, dict[str, Any]] = {}
        if args.probe or args.probe_command:
            probes = run_probes(ex, nodes, facts, profile, inventory, args.probe_command)
        fabric = run_fabric(ex, plan, inventory, args) if args.fabric else None
        nccl = run_nccl(ex, plan, profile, facts, args) if args.nccl else None
        from sparkfleet.engram.fleet import lane_findings

        # each rank's Engram copy by the one rule, as `up` judges it (unreachable nodes: the facts say so);
        # reading the manifests only reads, so --dry-run=facts reads them too
        engram = lane_findings(
            transport, profile, inventory, [r for r in plan.ranks if r.node.name in facts], sp.root / "templates")
    finally:
        transport.close()
    findings = run_checks(plan, inventory, facts, profile=profile, probes=probes, caches_dropped=dropped) + engram
    if fabric is not None or nccl is not None:
        from sparkfleet.checks import ordered

        findings = ordered(plan, findings + (fabric[1] if fabric else []) + (nccl[1] if nccl else []))
    simulated = {n: bool(getattr(f, "simulated", False)) for n, f in facts.items()}
    if args.json:
        doc = report(plan, inventory, findings, facts, simulated, dropped, probes)
        if fabric is not None:
            doc["fabric_probe"] = fabric[0]
        if nccl is not None:
            doc["nccl"] = nccl[0]
        if would:
            doc["would"] = would
        print_json(doc)
    else:
        print_would(would, nccl)
        print_table(plan, findings, simulated, wide=args.wide)
        lane = [f for f in plan.findings if f.status != "ok"]
        if lane:
            out.print()
            out.print("[bold]lane[/] (from the profile, see `sparkfleet plan`):")
            print_findings(lane)
    return EXIT_FAIL if failed(findings) else EXIT_UNKNOWN if unread(findings) else EXIT_OK


def run_probes(ex: Any, nodes: list[Node], facts: dict[str, Any], profile: Profile,
               inventory: Inventory, override: str | None) -> dict[str, dict[str, Any]]:
    """The clock probe on every answering node whose class has latch thresholds, all at once, through the
    executor (under --dry-run: each node's load shown, none run, nothing judged)."""
    from sparkfleet.checks import clock
    from sparkfleet.fleet import ops
    from sparkfleet.fleet.nodefacts import NodeFacts

    probes = {n.name: ops.ClockProbe(clock.load_for(n, facts[n.name], profile, override)) for n in nodes
              if isinstance(facts.get(n.name), NodeFacts) and clock.judged(inventory.hardware(n))}
    if not probes:
        return {}
    results = ex.run(ops.on("load each rank's GPU and sample its clock", probes, ops.ClockProbe.timeout_s))
    return {name: probes[name].parse(r) for name, r in (results or {}).items()}


def run_fabric(ex: Any, plan: Plan, inventory: Inventory, args: argparse.Namespace
               ) -> tuple[dict[str, Any], list[Finding]]:
    """The measured fabric probe between every pair of the lane's ranks, and its findings (under --dry-run:
    its commands, shown by the executor, and no finding)."""
    from sparkfleet.checks.fabric_probe import suspects, verdict
    from sparkfleet.fleet import fabric_measure as fp

    if len(plan.ranks) < 2:
        return {"links": []}, [Finding("fabric-probe", "ok", "one rank: nothing crosses the fabric (not probed)",
                                       node=plan.ranks[0].node.name)]
    if not args.json and not args.dry_run:
        err.print(f"probing {len(plan.ranks) * (len(plan.ranks) - 1) // 2} fabric link(s) ...", markup=False)
    def ratio(x: fp.Link) -> float | None:
        return inventory.hardware(inventory.nodes[x.a]).fabric_probe_ratio

    run = ex.drive(fp.probe_ops(plan.ranks, bulk_bytes=args.fabric_bytes or fp.BULK_BYTES,
                                confirm=suspects(ratio)))
    if run is None:  # --dry-run: shown, not run
        return {"links": [x.name for rnd in fp.plan_links(fp.endpoints(plan.ranks)[0]) for x in rnd],
                "dry_run": True}, []
    return run.as_dict(), verdict(run, ratio)


def print_would(would: list[dict[str, Any]], nccl: tuple[dict[str, Any], list[Finding]] | None) -> None:
    """What --dry-run would have run, node by node, in order; the all-reduce as each rank's command."""
    for line in would:
        if nccl is not None and line["what"] == nccl_op_name():
            continue
        did = f"write {line['write']}" if "write" in line else line["command"]
        stdin = f" <<< {line['stdin']}" if "stdin" in line else ""
        out.print(f"would: {line['node']}: {line['what']}: {did}{stdin}", markup=False, soft_wrap=True)
    if nccl is not None and any(x["what"] == nccl_op_name() for x in would):
        out.print("[bold]nccl[/] (--dry-run: not run) each rank's command:")
        for c in nccl[0]["commands"]:
            out.print(f"rank {c['rank']} on {c['node']}:\n  {c['command']}", markup=False, soft_wrap=True)


def nccl_op_name() -> str:
    from sparkfleet.fleet.ops import allreduce

    return allreduce.WHAT


def dry_report(plan: Plan, nodes: list, fabric: tuple[dict[str, Any], list[Finding]] | None,
               nccl: tuple[dict[str, Any], list[Finding]] | None, would: list[dict[str, Any]],
               args: argparse.Namespace) -> int:
    """check --dry-run: what would be asked of which node, and the --fabric/--nccl commands; nothing was
    contacted."""
    names = [n.name for n in nodes]
    if args.json:
        print_json({"profile": plan.profile, "inventory": plan.inventory, "dry_run": True, "contacted": [],
                    "would_gather_facts": names, **({"fabric_probe": fabric[0]} if fabric else {}),
                    **({"nccl": nccl[0]} if nccl else {}), **({"would": would} if would else {})})
        return EXIT_OK
    out.print(f"check --dry-run: no node was contacted; would gather facts on {', '.join(names)} (as shown) and "
              "judge them (--dry-run=facts gathers them, read-only)", markup=False, soft_wrap=True)
    print_would(would, nccl)
    return EXIT_OK


def run_nccl(ex: Any, plan: Plan, profile: Profile, facts: dict[str, Any], args: argparse.Namespace
             ) -> tuple[dict[str, Any], list[Finding]]:
    """The NCCL all-reduce across the ranks (under --dry-run: its commands, shown by the executor)."""
    from sparkfleet.checks import nccl as judge
    from sparkfleet.fleet.gather import resolve_gid_indexes
    from sparkfleet.fleet.ops import allreduce

    if profile.image is None:
        raise UserError(f"lane {profile.name!r} has no image: --nccl runs the all-reduce in the lane's image")
    nodes = [r.node for r in plan.ranks]
    runs = allreduce.commands(profile, plan.ranks, plan.launches, resolve_gid_indexes(nodes, facts))
    doc: dict[str, Any] = {"commands": [{"rank": x.rank, "node": x.node, "command": x.command} for x in runs]}
    if not args.json and not args.dry_run:
        err.print(f"running the NCCL all-reduce on {len(runs)} rank(s) ...", markup=False)
    ex.drive(allreduce.allreduce_ops(plan.ranks, runs))
    if any(x.result is None for x in runs):  # --dry-run: shown, not run
        return doc, []
    findings, ranks = judge.judge(runs, judge.expects_rdma(plan.ranks))
    doc["ranks"] = ranks
    return doc, findings


def report(plan: Plan, inventory: Inventory, findings: list[Finding], facts: dict[str, Any],
           simulated: dict[str, bool], dropped: dict[str, bool | str], probes: dict[str, dict[str, Any]]) -> dict:
    """The JSON document `check --json` prints."""
    from sparkfleet.checks import clock, probe
    from sparkfleet.fleet.nodefacts import NodeFacts

    counts = {s: sum(1 for f in findings if f.status == s) for s in ("ok", "warn", "fail", "unknown")}
    doc: dict[str, Any] = {
        "profile": plan.profile, "inventory": plan.inventory, "ok": not failed(findings) and not unread(findings),
        "summary": counts,
        "nodes": [{"node": r.node.name, "rank": r.rank, "role": r.role,
                   "reachable": isinstance(facts.get(r.node.name), NodeFacts),
                   "simulated": simulated.get(r.node.name, False),
                   "caches_dropped": dropped.get(r.node.name, False)} for r in plan.ranks],
        "findings": [f.as_dict() for f in findings],
        "lane": [f.as_dict() for f in plan.findings],
    }
    if probes:
        doc["probes"] = {name: probe.verdict(run, **clock.thresholds(inventory.hardware(inventory.nodes[name])))
                         for name, run in probes.items()}
    return doc


def print_table(plan: Plan, findings: list[Finding], simulated: dict[str, bool], wide: bool = False) -> None:
    """The findings as a table that fits the terminal, else one block per finding (cli/tables.py)."""
    from rich.text import Text

    from sparkfleet.cli.tables import Column, render, say

    sim = any(simulated.values())

    say(f"check {plan.profile} on inventory {plan.inventory}: "
        + ", ".join(f"rank {r.rank} {r.node.name}" for r in plan.ranks) + (" [sim: a simulated lab]" if sim else ""))
    # node, check and status are kept whole so rows can be grepped by node and check
    cols = [Column("node"), Column("check"), Column("status")]
    cols += [Column(name, wrap=True) for name in ("finding", "observed", "expected", "remedy")]
    # past a few ranks the ok rows go (a fleet's checks are thousands of rows): what is not ok, and the count
    whole = wide or len(plan.ranks) <= WHOLE_UP_TO
    shown = findings if whole else [f for f in findings if f.status != "ok"]
    rows = []
    for f in shown:
        node = (f.node or "") + (" [sim]" if simulated.get(f.node or "") else "")
        rows.append([node, f.check, Text(f.status.upper(), style=STYLE[f.status]), f.message,
                     f.observed or "", f.expected or "", f.remedy or ""])
    render(cols, rows, wide=wide)
    counts = {s: sum(1 for f in findings if f.status == s) for s in ("ok", "warn", "fail", "unknown")}
    verdict = ("[bold red]FAIL[/]" if counts["fail"] else "[bold yellow]UNKNOWN[/]" if unread(findings)
               else "[green]ok[/]")
    if not whole:
        out.print(f"({counts['ok']} ok finding(s) of {len(plan.ranks)} ranks not shown: --wide or --json shows every "
                  f"finding; {WHOLE_UP_TO} ranks or fewer show them by default)", markup=False, highlight=False)
    out.print(f"{verdict}: {counts['fail']} fail, {counts['warn']} warn, {counts['unknown']} unknown (not judged), "
              f"{counts['ok']} ok")
