"""`sparkfleet build --profile P`: build the lane's engine on every rank from its published recipe, and pin
what was built (builds/<engine>-<key>.json) so `up` and `restore` serve only that."""

from __future__ import annotations

import argparse
import contextlib

from sparkfleet.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_dry_run,
    add_inventory,
    add_json,
    add_root,
    executor,
    fleet_inventory,
    out,
    print_findings,
    print_json,
    spec,
)
from sparkfleet.engines.base import at
from sparkfleet.engines.registry import engine_for
from sparkfleet.placement import place
from sparkfleet.root import state_dir
from sparkfleet.runner.lock import FleetLock
from sparkfleet.schema.errors import UserError

ORDER = 31


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="build a lane's engine on every rank from source and pin the result",
                       description="Run the lane's published build on every rank at once (TensorFold, seed 002:\n"
                       "git clone -b BRANCH URL, git checkout COMMIT, git am DIR/*.patch,\n"
                       "zig build install native -D...),\n"
                       "in a staging dir beside tensorfold.build.dir. Only when every rank built the same bytes\n"
                       "is each stage moved into place and the pin written (<state dir>/builds/<engine>-<key>.json);\n"
                       "`up` and `restore` then refuse a rank whose built engine differs from it. A failed build\n"
                       "names the rank and the step, removes every stage and leaves the previous build and pin.",
                       epilog="examples:\n  sparkfleet build --profile tf1017 --dry-run\n"
                       "  sparkfleet build --profile tf1017 -i lab",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(p)
    add_inventory(p)
    add_json(p)
    p.add_argument("--profile", "-p", required=True, help="the lane whose engine to build on every rank")
    add_dry_run(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparkfleet import enginebuild

    sp = spec(args)
    loaded = sp.profile(args.profile)
    b = engine_for(loaded.profile.engine).engine_build(loaded.profile)
    if b is None:
        where = at(loaded, "engine") or args.profile
        raise UserError(f"{where}: profile {args.profile!r} has no build to run (engine {loaded.profile.engine}: "
                        "the engine comes in the lane's image unless the profile sets tensorfold.build)")
    inventory = fleet_inventory(sp, args.inventory)
    nodes = [r.node for r in place(loaded, inventory)]
    ex = executor(args, nodes)
    # one run at a time per fleet, as up/down/restore: a build moves the engine dir of every rank
    lock = contextlib.nullcontext() if args.dry_run else FleetLock(
        state_dir() / "locks" / f"{inventory.name}.lock", f"sparkfleet build --profile {args.profile}")
    try:
        with lock:
            outcome = ex.drive(enginebuild.build_ops(nodes, b))
    finally:
        ex.transport.close()
    if outcome is None:  # --dry-run: every command was shown, none ran
        return EXIT_OK
    if args.json:
        print_json({"profile": args.profile, "engine": b.engine, "dir": b.dir, "built": outcome.pin is not None,
                    "pin": str(outcome.pin) if outcome.pin else None, "seconds": round(outcome.seconds, 2),
                    "nodes": {n: {"ok": r.ok, "step": r.step or None, "digest": r.digest, "tail": r.tail,
                                  "seconds": round(r.seconds, 2)} for n, r in sorted(outcome.ranks.items())},
                    "findings": [f.as_dict() for f in outcome.findings]})
    else:
        print_findings(outcome.findings)
        if outcome.pin is not None:
            out.print(f"pinned: {outcome.pin} ({len(outcome.ranks)} rank(s), {outcome.seconds:.1f} s)", markup=False)
        else:
            out.print("nothing was installed and no pin written: every rank keeps its previous build", markup=False)
    return EXIT_OK if outcome.pin is not None else EXIT_FAIL
