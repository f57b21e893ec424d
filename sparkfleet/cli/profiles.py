"""`sparkfleet profiles` lists the lanes; `sparkfleet show PROFILE` prints one merged profile."""

from __future__ import annotations

import argparse

from sparkfleet.cli.common import EXIT_OK, add_json, add_root, add_wide, out, print_json, spec
from sparkfleet.opsdir import Spec
from sparkfleet.schema.errors import SpecError
from sparkfleet.schema.load import Loaded

ORDER = 5


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profiles", help="list the lanes (engine, group, port, servable)",
                       description="List every profile under profiles/.",
                       epilog="example:\n  sparkfleet profiles --json",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(p)
    add_json(p)
    add_wide(p)
    p.add_argument("--all", action="store_true", help="include abstract bases")
    p.set_defaults(func=run_list)

    s = sub.add_parser("show", help="print a profile with its bases merged",
                       description="Print one profile after `extends` merging, as YAML (or JSON).",
                       epilog="example:\n  sparkfleet show dcp2", formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(s)
    add_json(s)
    s.add_argument("profile")
    s.set_defaults(func=run_show)


def run_list(args: argparse.Namespace) -> int:
    sp = spec(args)
    rows = []
    for name in sp.profile_names():
        loaded = sp.profile(name)
        p = loaded.profile
        if p.abstract and not args.all:
            continue
        why = None if p.abstract else refusal(sp, loaded)
        rows.append({"name": name, "engine": p.engine, "group": p.group, "port": p.port,
                     "servable": not p.abstract and why is None, "abstract": p.abstract, "extends": p.extends,
                     "description": p.description} | ({"refused": why} if why else {}))
    if args.json:
        print_json(rows)
        return EXIT_OK
    from rich.text import Text

    from sparkfleet.cli.tables import Column, render

    cols = [Column(c) for c in ("profile", "engine", "group", "port", "servable", "extends")]
    cols.append(Column("description", wrap=True))
    table = []
    for r in rows:
        servable = Text("base") if r["abstract"] else (Text("yes") if r["servable"] else
                                                        Text(f"no: {r['refused']}", style="red"))
        table.append([r["name"], r["engine"], r["group"] or "", str(r["port"] or ""), servable,
                      r["extends"] or "", r["description"] or ""])
    render(cols, table, wide=args.wide)
    return EXIT_OK


def refusal(sp: Spec, loaded: Loaded) -> str | None:
    """Why `up` would refuse the lane before it starts anything, or None: a failing lane rule (what `plan`
    refuses, `servable: false` included) or its patch set (the checks `up`'s patches step runs, from
    patches/manifest.py), on the default inventory. Said short, for a table cell."""
    from sparkfleet.patches.manifest import refusals
    from sparkfleet.plan import make_plan

    try:
        plan = make_plan(loaded, sp.inventory(None), sp.playbook("up"), sp.root)
    except SpecError as exc:
        return str(exc)
    if loaded.profile.image is None:  # checks/image.py fails every rank of such a lane: nothing to run
        return "the lane names no image (set image.ref)"
    failing = [f for f in plan.findings if f.status == "fail"]
    if failing:
        return loaded.profile.unservable_reason if failing[0].check == "servable" else failing[0].message
    patches = refusals(sp.root, loaded.profile.patches)
    if patches:  # a set with no manifest or one the seeds do not list says so short; a file that differs, whole
        f = patches[0]
        return f"patch set {loaded.profile.patches!r} {f.observed}" if f.check == "patches" else f.message
    from sparkfleet.enginebuild import load_pin
    from sparkfleet.engines.registry import engine_for

    build = engine_for(loaded.profile.engine).engine_build(loaded.profile)
    if build is not None and load_pin(build) is None:  # up's engine_build step refuses it
        return f"its engine is not built here (sparkfleet build --profile {loaded.profile.name})"
    return None


def run_show(args: argparse.Namespace) -> int:
    loaded = spec(args).profile(args.profile)
    if loaded.profile is None:
        raise SpecError("not found", args.profile)
    data = loaded.profile.model_dump(mode="json", exclude_defaults=False)
    if args.json:
        print_json({"profile": data, "files": loaded.chain})
        return EXIT_OK
    import yaml

    out.print(f"# {args.profile}: merged from {' <- '.join(loaded.chain)}", markup=False)
    out.print(yaml.safe_dump(data, sort_keys=False, width=100).rstrip(), markup=False)
    return EXIT_OK
