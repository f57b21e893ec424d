"""`up`, `down`, `play`, `restore`: run a playbook for a lane, with a live display or JSON events."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sparkfleet.cli.common import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    add_accept_unknown,
    add_dry_run,
    add_inventory,
    add_overrides,
    add_progress,
    add_root,
    dry_reads,
    err,
    fleet_inventory,
    out,
    overrides,
    print_json,
    seconds,
    spec,
)
from sparkfleet.cli.progress import Progress, verbosity
from sparkfleet.fleet.nodeside.clock_probe import LOAD_SECONDS, PROBE_MAX_S
from sparkfleet.runner.context import RunOptions
from sparkfleet.runner.events import JsonEvents
from sparkfleet.schema.errors import UserError

if TYPE_CHECKING:
    from sparkfleet.runner.record import Record

ORDER = 12
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a command killed by it


def _common(p: argparse.ArgumentParser) -> None:
    add_root(p)
    add_inventory(p)
    p.add_argument("--json", action="store_true", help="JSON events, one per line, for scripts")
    add_dry_run(p)
    p.add_argument("--poll", type=seconds, default=1.0, metavar="SECONDS",
                   help="poll interval while waiting (default 1)")
    p.add_argument("--boot-budget", type=seconds, metavar="SECONDS", help="override the profile's boot budget")
    p.add_argument("--stall-after", type=seconds, metavar="SECONDS",
                   help="a boot that logs nothing this long is judged by its CPU use, and stopped if idle "
                        "(default: the profile's expect.stall_s, else 600)")
    p.add_argument("--endpoint", metavar="URL", help="the head's API base URL if not http://HEAD:PORT")
    add_progress(p)




def _probe(p: argparse.ArgumentParser) -> None:
    """The clock probe's options: only the playbooks that launch (up, restore) run the probe."""
    p.add_argument("--no-probe", action="store_true",
                   help="skip the GPU clock probe before launch (the record says so; refused with probe: required)")
    p.add_argument("--probe-seconds", type=float, metavar="SECONDS",
                   help=f"how long the clock probe's load runs on each rank (default {LOAD_SECONDS:g})")


def register(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    up = sub.add_parser("up", help="bring a lane up: stop-all, preflight, patches, workers then head, ready",
                        description="Run playbooks/up.yaml for a lane.", formatter_class=fmt,
                        epilog="examples:\n  sparkfleet up --profile dcp2\n  sparkfleet up --profile boot10 "
                        "--save-as boot10\n  sparkfleet up --profile dcp2 --dry-run\n  sparkfleet up --profile "
                        "dcp2 --accept-unknown   # go on past checks a node's unread facts left unknown")
    _common(up)
    _probe(up)
    add_accept_unknown(up)
    up.add_argument("--profile", "-p", required=True, help="the lane to bring up")
    add_overrides(up)
    up.add_argument("--save-as", metavar="NAME", help="record a restore point when the lane serves")
    on_fail = up.add_mutually_exclusive_group()
    on_fail.add_argument("--stop-on-gate-failure", dest="stop_on_gate_failure", action="store_true", default=True,
                         help="stop every rank when a gate fails (the default)")
    on_fail.add_argument("--keep-on-gate-failure", dest="stop_on_gate_failure", action="store_false",
                         help="leave the lane up for inspection when a gate fails (said in the output and record)")
    up.add_argument("--gates", metavar="LIST", help="only these gates (comma-separated; default: the profile's set)")
    up.add_argument("--soak-minutes", type=float, metavar="M", help="soak length (default: the profile's, else 2)")
    up.add_argument("--no-fabric-probe", dest="fabric_probe", action="store_false",
                    help="skip the measured fabric probe between the ranks (on by default for multi-node lanes)")
    up.add_argument("--drain-on-fail", action="store_true",
                    help="launcher: slurm: drain each node that fails preflight, the finding as Slurm's reason "
                    "(scontrol update State=DRAIN); default: drain nothing")
    add_limit(up, argparse.SUPPRESS)  # refused: a tensor-parallel lane cannot start on part of its nodes
    up.set_defaults(func=run_playbook, playbook="up")

    down = sub.add_parser("down", help="stop a lane (head first), remove rail-2 aliases, verify it is gone",
                          description="Run playbooks/down.yaml for a lane.", formatter_class=fmt,
                          epilog="examples:\n  sparkfleet down --profile dcp2\n  sparkfleet down --profile "
                          "gb300-configc --keep   # stop, keep the container")
    _common(down)
    down.add_argument("--profile", "-p", required=True, help="the lane to stop")
    down.add_argument("--keep", action="store_true", help="stop the containers but keep them")
    add_limit(down, "only these nodes of the lane (e.g. the one that was unreachable, once it is back)")
    down.set_defaults(func=run_playbook, playbook="down")

    play = sub.add_parser("play", help="run your own playbook for a lane", formatter_class=fmt,
                          description="Run any playbook file for a lane.",
                          epilog="example:\n  sparkfleet play my-relaunch.yaml --profile dcp2")
    _common(play)
    play.add_argument("playbook_file", metavar="PLAYBOOK", help="a playbook name under playbooks/ or a YAML file")
    play.add_argument("--profile", "-p", required=True, help="the lane to run it for")
    play.add_argument("--save-as", metavar="NAME", help="record a restore point when the lane serves")
    add_accept_unknown(play)
    play.set_defaults(func=run_playbook, playbook=None)

    rs = sub.add_parser("restore", help="relaunch a recorded known-good lane as it ran, every pin verified",
                        formatter_class=fmt, description=_wrap(
                            "Relaunch the launches a restore point recorded, verbatim "
                        "(run playbooks/restore.yaml around them). Before anything is stopped: say per rank what "
                        "today's profile, inventory and templates would change, and refuse (exit 1) when a pin "
                        "drifted (hostname, image id, patch files, Engram copy, resolved GID index) unless --force. "
                        "Without a recorded point, a profile of that name is restored from its own pins."),
                        epilog="examples:\n  sparkfleet restore boot10\n  sparkfleet restore boot10 --force\n"
                        "  sparkfleet restore --list\n  sparkfleet diff boot10   # what changed since")
    _common(rs)
    _probe(rs)
    add_accept_unknown(rs)
    rs.add_argument("name", nargs="?", help="the restore point (or a profile, restored from its own pins)")
    rs.add_argument("--list", action="store_true", help="list restore points")
    rs.add_argument("--force", action="store_true", help="restore even when pins drifted")
    rs.add_argument("--gates", metavar="LIST", help="only these gates (comma-separated; default: the profile's set)")
    rs.add_argument("--soak-minutes", type=float, metavar="M", help="soak length (default: the profile's, else 2)")
    add_limit(rs, argparse.SUPPRESS)
    rs.set_defaults(func=run_restore)


def add_limit(p: argparse.ArgumentParser, text: str) -> None:
    p.add_argument("--limit", metavar="NODE[,NODE]", help=text)


def limit_nodes(args: argparse.Namespace, lane: str, nodes: list[str]) -> tuple[str, ...]:
    """--limit NODE[,NODE] checked against the lane's nodes (a node outside it is refused, named)."""
    text = getattr(args, "limit", None)
    if not text:
        return ()
    if args.command in ("up", "restore"):
        raise UserError(f"--limit is refused on {args.command}: a tensor-parallel lane cannot start on part of "
                        "its nodes (use it with down, status or logs)")
    names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    outside = [x for x in names if x not in nodes]
    if outside or not names:
        raise UserError(f"--limit {text}: {', '.join(outside) or '(no node)'} is not a node of lane {lane} "
                        f"(its nodes: {', '.join(nodes)})")
    return names


def _wrap(text: str) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, 78))


def _options(args: argparse.Namespace, **extra) -> RunOptions:
    gate_args = {}
    if getattr(args, "gates", None):
        gate_args["only"] = args.gates
    if getattr(args, "soak_minutes", None) is not None:
        gate_args["soak_minutes"] = args.soak_minutes
    return RunOptions(gate_args=gate_args, dry_run=bool(args.dry_run), dry_reads=dry_reads(args),
                      verbose=bool(getattr(args, "verbose", False)),
                      save_as=getattr(args, "save_as", None),
                      keep=getattr(args, "keep", False),
                      stop_on_gate_failure=getattr(args, "stop_on_gate_failure", True),
                      boot_budget_s=args.boot_budget, stall_s=args.stall_after, poll_s=args.poll,
                      endpoint=args.endpoint, fabric_probe=getattr(args, "fabric_probe", True),
                      drain_on_fail=getattr(args, "drain_on_fail", False),
                      no_probe=getattr(args, "no_probe", False),
                      accept_unknown=getattr(args, "accept_unknown", False),
                      probe_seconds=probe_seconds(args), **extra)


def probe_seconds(args: argparse.Namespace, flag: str = "--probe-seconds") -> float | None:
    """--probe-seconds (watch: `flag` --clock-probe-seconds), checked: the probe kills a load that runs PROBE_MAX_S."""
    s = getattr(args, "probe_seconds", None)
    if s is not None and not 0 < s < PROBE_MAX_S:
        raise UserError(f"{flag} {s:g}: expected seconds above 0 and below {PROBE_MAX_S:g} "
                        "(the probe kills a load that runs that long)")
    return s


def _execute(args: argparse.Namespace, profile: str, playbook: str, options: RunOptions,
             over: list | None = None) -> int:
    from sparkfleet.runner.run import Terminated, execute

    sp = spec(args)
    loaded = sp.profile(profile, overrides(args) if over is None else over)
    if loaded.profile.abstract:
        raise UserError(f"{profile} is a base for other lanes (abstract: true), not a lane")
    if options.no_probe and loaded.profile.probe == "required":
        from sparkfleet.schema.yamlsrc import locate

        file, line = locate(loaded.marks, ("probe",))
        where = f"{file}:{line}: " if file else ""
        raise UserError(f"{where}probe: required (profile {profile}): --no-probe is refused; the clock latch "
                        "(FM-09) must be judged under load before this lane starts")
    inventory = fleet_inventory(sp, args.inventory)
    if options.drain_on_fail and inventory.launcher != "slurm":
        raise UserError(f"--drain-on-fail drains nodes in Slurm: inventory {inventory.name!r} has launcher: "
                        f"{inventory.launcher} (nothing was done)")
    if getattr(args, "limit", None):
        from sparkfleet.placement import place

        options.limit = limit_nodes(args, profile, [r.node.name for r in place(loaded, inventory)])
    pb = sp.playbook(playbook)
    events = JsonEvents() if args.json else Progress(out, verbosity(args))

    def report(record: Record) -> None:
        events.close()
        if args.json:
            events.emit("result", outcome=record.outcome, reason=record.reason, run_id=record.run_id)
        elif record.outcome != "ok":
            err.print(f"sparkfleet: {pb.name} {profile}: {record.outcome}: {record.reason}", markup=False)
        elif args.quiet:  # -q: the findings above, and this
            out.print(f"{pb.name} {profile}: ok (run {record.run_id})", markup=False)

    try:  # the result is reported inside the run, while a second Ctrl-C is held off
        record = execute(sp, loaded, inventory, pb, options, events, " ".join(["sparkfleet", args.command, profile]),
                         report=report)
    except Terminated:  # before the run had anything to clean up (taking the locks)
        return EXIT_TERMINATED
    finally:
        events.close()
    if record.outcome == "interrupted" and record.data.get("interrupted_by") == "SIGTERM":
        return EXIT_TERMINATED
    return {"ok": EXIT_OK, "refused": EXIT_USAGE, "interrupted": EXIT_INTERRUPTED}.get(record.outcome, EXIT_FAIL)


def run_playbook(args: argparse.Namespace) -> int:
    return _execute(args, args.profile, args.playbook or args.playbook_file, _options(args))


def run_restore(args: argparse.Namespace) -> int:
    from sparkfleet.root import state_dir
    from sparkfleet.runner.restore import list_points, load_point, point_names, unknown_nodes

    if args.list:
        points = list_points(state_dir())
        if args.json:
            print_json(points)
        else:
            for p in points:
                out.print(f"{p['name']:<20} {p['profile'] or '?':<16} {p['recorded_at']}  kv {p['kv_tokens']}  "
                          f"run {p['run_id']}", markup=False)
            if not points:
                out.print("no restore points (record one with `up --save-as NAME`)")
        return EXIT_OK
    if not args.name:
        raise UserError("restore needs a NAME (or --list)")
    point = load_point(state_dir(), args.name)
    sp = spec(args)
    if point is None:
        if args.name not in sp.profile_names():
            known = point_names(state_dir())
            raise UserError(f"no restore point and no profile named {args.name!r}; restore points: "
                            + (", ".join(known) if known else "none (record one with `up --save-as NAME`)"))
        fleet_inventory(sp, args.inventory)  # refused before anything is said or done
        if not args.json:
            out.print(f"no recorded restore point {args.name!r}: restoring profile {args.name!r} from its own pins "
                      "(image digest, patch manifest)", markup=False)
        return _execute(args, args.name, "restore", _options(args, force=args.force), [])
    if args.inventory is None and point.inventory:
        args.inventory = point.inventory
    missing = unknown_nodes(point, sp.inventory(args.inventory).nodes)
    if missing:
        raise UserError(f"restore point {args.name!r} ran on node(s) {', '.join(missing)}, which inventory "
                        f"{args.inventory or 'lab'!r} does not have; nothing was done")
    if point.profile not in sp.profile_names():
        raise UserError(f"restore point {args.name!r} is of profile {point.profile!r}, which is not in "
                        f"{sp.root / 'profiles'}; nothing was done")
    from sparkfleet.schema.overrides import from_mapping

    over = from_mapping(point.overrides)  # restore brings back the -o it served with
    return _execute(args, point.profile, "restore", _options(args, restore_point=point.options_view(),
                                                                 force=args.force), over)
