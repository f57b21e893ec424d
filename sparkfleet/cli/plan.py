"""`sparkfleet plan --profile P`: what would run where, in which order, with the exact argv and env."""

from __future__ import annotations

import argparse

from sparkfleet.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    add_inventory,
    add_json,
    add_overrides,
    add_root,
    err,
    out,
    overrides,
    print_findings,
    print_json,
    spec,
)
from sparkfleet.plan import make_plan
from sparkfleet.slurm.ops import refusals_now

ORDER = 10


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="show what `up` would run where; touches nothing",
                       description="Render the playbook's steps for a lane: every launch's node, rank, "
                       "argv and env, workers before the head. Nothing is contacted.",
                       epilog="examples:\n  sparkfleet plan --profile dcp2\n"
                       "  sparkfleet plan --profile dcp2 -o flags.--gpu-memory-utilization=0.78 "
                       "-o env.NCCL_DEBUG=INFO\n"

                       "  sparkfleet plan --profile tf1017 --json | jq '.steps[] | select(.step==\"launch\")'",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(p)
    add_inventory(p)
    add_json(p)
    add_overrides(p)
    p.add_argument("--profile", "-p", required=True, help="lane to plan")
    p.add_argument("--playbook", default="up", help="playbook name or file (default: up)")
    p.add_argument("--against", metavar="NAME", help="also show, per rank, what differs from a restore point or run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sp = spec(args)
    loaded = sp.profile(args.profile, overrides(args))
    inventory = sp.inventory(args.inventory)
    playbook = sp.playbook(args.playbook)
    if loaded.profile.abstract:
        err.print(f"sparkfleet: {args.profile} is a base for other lanes (abstract: true), not a lane; "
                  f"see `sparkfleet profiles`")
        return EXIT_USAGE
    against = None
    if args.against:
        from sparkfleet.cli.diff import Side, compare, recorded_gids, side

        other = side(args, args.against if ":" in args.against else f"point:{args.against}"
                     if _is_point(args.against) else f"run:{args.against}")
        plan = make_plan(loaded, inventory, playbook, sp.root, gid_index=recorded_gids(other.launches))
        against = compare(other, Side("profile", args.profile, args.profile, [x.as_dict() for x in plan.launches]))
    else:
        plan = make_plan(loaded, inventory, playbook, sp.root)
    plan.findings += refusals_now(inventory, [r.node.name for r in plan.ranks])  # launcher: slurm (issue 30)
    if args.json:
        print_json(plan.as_dict() | ({"against": against} if against is not None else {}))
        return EXIT_USAGE if plan.refused else EXIT_OK
    if plan.refused:
        print_findings([f for f in plan.findings if f.status == "fail"], err)
        err.print(f"sparkfleet: lane {plan.profile!r} is refused; fix the findings above")
        return EXIT_USAGE
    out.print(f"[bold]plan[/] {plan.profile} ({plan.playbook} on inventory {plan.inventory}): "
              + ", ".join(f"rank {r.rank} {r.node.name}" for r in plan.ranks))
    for o in loaded.overrides:
        out.print(f"    override {o.key} = {o.shown!r} (from -o)", markup=False)
    for i, step in enumerate(plan.steps, 1):
        if step["step"] != "launch":
            out.print(f"{i:>2}. {step['step']:<12} {step['what']}", markup=False)
            continue
        together = " (in parallel)" if step["parallel"] else ""
        out.print(f"{i:>2}. launch       rank {step['rank']} on {step['node']} ({step['role']}, "
                  f"wave {step['wave']}{together})", markup=False)
        for path, content in step.get("files", {}).items():
            out.print(f"      write {path}:", markup=False)
            out.print("\n".join("        " + line for line in content.splitlines()), markup=False)
        out.print("\n".join("      " + line for line in step["script"].rstrip().splitlines()), markup=False)
        if against is not None:
            _inline(against, step["rank"])
    if against is not None and against["unrelated"]:
        out.print(f"against {args.against}: a different lane ({against['a']['profile']}): everything differs",
                  markup=False)
    if plan.findings:
        out.print()
        print_findings(plan.findings)
    return EXIT_OK


def _is_point(name: str) -> bool:
    from sparkfleet.root import state_dir
    from sparkfleet.runner.restore import points_dir

    return (points_dir(state_dir()) / f"{name}.json").is_file()


def _inline(against: dict, rank: int) -> None:
    """Under a launch: what differs from the recorded one (A = recorded, B = this plan)."""
    rd = next((r for r in against["ranks"] if r["rank"] == rank), None)
    name = against["a"]["name"]
    if rd is None:
        out.print(f"      = same as {name}", markup=False)
        return
    from sparkfleet.diff import show_value

    for c in rd["changes"]:
        out.print(f"      ~ vs {name}: {c['kind']} {c['key']}: {show_value(c['a'])} -> {show_value(c['b'])}",
                  markup=False)
