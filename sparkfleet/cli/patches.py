"""`sparkfleet patches build|verify|push`: patch sets pinned by sha256, checked on every rank."""

from __future__ import annotations

import argparse
from pathlib import Path

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
from sparkfleet.findings import failed
from sparkfleet.patches import manifest as pm
from sparkfleet.placement import place
from sparkfleet.schema.errors import UserError

ORDER = 30


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("patches", help="build, verify and push patch sets",
                       description="Patch sets are files bind-mounted over an engine image, each pinned by "
                       "sha256 in patches/NAME/manifest.yaml.",
                       epilog="examples:\n"
                       "  sparkfleet patches build ./patch --name boot10 --mounts ./patch/mounts.txt\n"
                       "  sparkfleet patches verify --profile exl3tp3\n  sparkfleet patches push --profile exl3tp3",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ps = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = ps.add_parser("build", help="copy a directory of patch files into patches/NAME with a manifest")
    add_root(b)
    add_json(b)
    b.add_argument("dir", type=Path)
    b.add_argument("--name", required=True)
    b.add_argument("--mounts", type=Path, help="the seeds' mounts.txt: SOURCE:TARGET[:ro] per line")
    b.add_argument("--target-prefix", help="target = PREFIX/<relative path> for every file")
    b.set_defaults(func=run_build)
    for action, helptext in (("verify", "check every rank's copy without copying"),
                             ("push", "copy only the files whose hash differs, then verify")):
        a = ps.add_parser(action, help=helptext)
        add_root(a)
        add_inventory(a)
        add_json(a)
        a.add_argument("--profile", "-p", required=True)
        add_dry_run(a)
        a.set_defaults(func=run_sync, push=action == "push")


def run_build(args: argparse.Namespace) -> int:
    sp = spec(args)
    dest, manifest = pm.build(args.dir, sp.root, args.name, args.mounts, args.target_prefix)
    if args.json:
        print_json({"set": args.name, "path": str(dest), "files": [f.model_dump() for f in manifest.files]})
    else:
        out.print(f"patch set {args.name!r}: {len(manifest.files)} file(s) -> {dest}", markup=False)
        for f in manifest.files:
            out.print(f"  {f.sha256[:12]}  {f.source} -> {f.target}", markup=False)
    return EXIT_OK


def run_sync(args: argparse.Namespace) -> int:
    from sparkfleet.fleet.ops import patches as patch_ops

    sp = spec(args)
    loaded = sp.profile(args.profile)
    inventory = fleet_inventory(sp, args.inventory)
    if not loaded.profile.patches:
        raise UserError(f"profile {args.profile!r} uses no patch set (patches: is unset)")
    manifest = pm.load(sp.root, loaded.profile.patches)
    if not manifest.complete:
        raise UserError(f"patches/{manifest.name}/{pm.MANIFEST}: the set is not known in full ({manifest.seed_gap}); "
                        f"build it first: sparkfleet patches build DIR --name {manifest.name} --mounts mounts.txt")
    local = pm.verify_local(sp.root, manifest)
    if failed(local):
        print_findings(local)
        return EXIT_FAIL
    nodes = [r.node for r in place(loaded, inventory)]
    ex = executor(args, nodes)
    try:
        states = ex.drive(patch_ops.push_ops(nodes, manifest, sp.root) if args.push else
                          patch_ops.inspect_ops(nodes, manifest))
    finally:
        ex.transport.close()
    if states is None:  # --dry-run: the commands were shown, none ran
        return EXIT_OK
    findings = patch_ops.findings(states, manifest)
    if args.json:
        print_json({"set": manifest.name, "nodes": {k: vars(v) | {"ok": v.ok} for k, v in states.items()},
                    "findings": [f.as_dict() for f in findings]})
    else:
        print_findings(findings)
    return EXIT_FAIL if failed(findings) else EXIT_OK
