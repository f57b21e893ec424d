"""`sparkfleet diff A [B]`: per rank, the flags, env, mounts, image and files that differ.

A and B are each a restore point, a run id or a profile (today's plan); `point:`, `run:` or `profile:`
in front of a name picks one where a name is several. With one argument, a profile's plan today is
compared with its last good run. Exit 0 when nothing differs, 1 when something does (like diff(1)).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from sparkfleet.cli.common import EXIT_FAIL, EXIT_OK, add_inventory, add_json, add_root, add_wide, out, print_json, spec
from sparkfleet.spec.errors import UserError

ORDER = 11
EPILOG = """examples:
  sparkfleet diff boot10                 # boot10's plan today against its last good run
  sparkfleet diff night dcp2             # restore point 'night' against the dcp2 profile today
  sparkfleet diff 20261201-094847-08ce9e night --json
  sparkfleet diff profile:dcp1 profile:dcp2
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="what differs between two of: profile, restore point, run (per rank)",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(p)
    add_inventory(p)
    add_json(p)
    add_wide(p)
    p.add_argument("a", metavar="A", help="profile, restore point or run id")
    p.add_argument("b", metavar="B", nargs="?", help="the same kinds; left out: A's last good run")
    p.set_defaults(func=run)


@dataclass
class Side:
    kind: str  # profile | point | run
    name: str
    profile: str
    launches: list[dict]

    def as_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "profile": self.profile}

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}" + (f" ({self.profile})" if self.profile != self.name else "")


def _recorded(args: argparse.Namespace, ref: str) -> Side | None:
    from sparkfleet.root import state_dir
    from sparkfleet.runner.record import load_run
    from sparkfleet.runner.restore import load_point

    kind, _, name = ref.partition(":") if ref.split(":", 1)[0] in ("point", "run", "profile") else ("", "", ref)
    if kind in ("", "point"):
        p = load_point(state_dir(), name)
        if p is not None:
            return Side("point", name, p.profile, [x.model_dump(mode="json") for x in p.launches])
    if kind in ("", "run"):
        rec = load_run(state_dir() / "runs", name)
        if rec is not None:
            return Side("run", name, rec.profile, [x.model_dump(mode="json") for x in rec.data.launches or []])
    if kind in ("point", "run"):
        raise UserError(f"no {'restore point' if kind == 'point' else 'run'} named {name!r}")
    return None


def _profile(args: argparse.Namespace, name: str, against: list[dict] | None) -> Side:
    from sparkfleet.plan import make_plan

    sp = spec(args)
    if name not in sp.profile_names():
        raise UserError(f"{name!r} is not a profile, a restore point or a run id (profiles: "
                        f"{', '.join(sp.profile_names())}; restore points: `sparkfleet restore --list`; "
                        "runs: `sparkfleet runs`)")
    loaded = sp.profile(name)
    if loaded.profile.abstract:
        raise UserError(f"{name} is a base for other lanes (abstract: true), not a lane")
    plan = make_plan(loaded, sp.inventory(args.inventory), sp.playbook("up"), sp.root, gid_index=recorded_gids(against))
    return Side("profile", name, name, [x.as_dict() for x in plan.launches])


def recorded_gids(launches: list[dict] | None) -> dict[str, int]:
    """GID indexes the other side resolved at launch: today's `auto` is shown as what it resolved to then."""
    out = {}
    for x in launches or []:
        gid = (x.get("inventory") or {}).get("gid_index")
        if isinstance(gid, int):
            out[x["node"]] = gid
    return out


def side(args: argparse.Namespace, ref: str, other: list[dict] | None = None) -> Side:
    got = _recorded(args, ref)
    if got is not None:
        return got
    return _profile(args, ref.removeprefix("profile:"), other)


def last_good(args: argparse.Namespace, profile: str) -> Side:
    from sparkfleet.root import state_dir
    from sparkfleet.runner.record import list_runs, load_run

    runs = [r for r in list_runs(state_dir() / "runs") if r.get("profile") == profile and r.get("outcome") == "ok"
            and r.get("playbook") in ("up", "restore")]
    for r in sorted(runs, key=lambda r: r.get("started") or 0, reverse=True):
        rec = load_run(state_dir() / "runs", str(r["run_id"]))
        if rec is not None and rec.data.launches:
            return Side("run", rec.run_id, rec.profile, [x.model_dump(mode="json") for x in rec.data.launches])
    raise UserError(f"no good run of {profile!r} is recorded (bring it up with `sparkfleet up --profile {profile}`), "
                    "or give two things to compare")


def compare(a: Side, b: Side) -> dict:
    from sparkfleet.diff import diff_launches

    ranks = diff_launches(a.launches, b.launches)
    return {"a": a.as_dict(), "b": b.as_dict(), "unrelated": a.profile != b.profile,
            "same": not ranks, "ranks": [r.as_dict() for r in ranks]}


def show(result: dict, a: Side, b: Side, wide: bool = False) -> None:
    from sparkfleet.cli.tables import Column, render
    from sparkfleet.diff import show_value

    if result["unrelated"]:
        out.print(f"{a.label} and {b.label} are different lanes: expect everything to differ", markup=False)
    if result["same"]:
        out.print(f"no difference in any rank's launch between {a.label} and {b.label}", markup=False)
        return
    rows = []
    for rd in result["ranks"]:
        node = rd["node_a"] if rd["node_a"] == rd["node_b"] else f"{rd['node_a']}->{rd['node_b']}"
        for c in rd["changes"]:
            rows.append([str(rd["rank"]), node, f"{c['kind']} {c['key']}", show_value(c["a"]), show_value(c["b"])])
    render([Column("rank"), Column("node"), Column("what", wrap=True), Column("a", wrap=True), Column("b", wrap=True)],
           rows, wide=wide, title=f"a = {a.label}, b = {b.label}")


def run(args: argparse.Namespace) -> int:
    if args.b is None:
        b = side(args, args.a)
        if b.kind != "profile":
            raise UserError("diff with one argument takes a profile (its plan today against its last good run)")
        a = last_good(args, b.profile)
        b = _profile(args, b.profile, a.launches)
    else:
        a = side(args, args.a)
        b = side(args, args.b, a.launches)
        if a.kind == "profile" and b.kind != "profile":
            a = _profile(args, a.name, b.launches)
    result = compare(a, b)
    if args.json:
        print_json(result)
    else:
        show(result, a, b, getattr(args, "wide", False))
    return EXIT_OK if result["same"] else EXIT_FAIL
