"""`sparkfleet watch`: keep a lane serving in the foreground, restarting the whole group within a budget."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sparkfleet.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    add_accept_unknown,
    add_inventory,
    add_progress,
    add_root,
    err,
    fleet_inventory,
    out,
    print_findings,
    seconds,
    spec,
)
from sparkfleet.cli.progress import Progress, verbosity
from sparkfleet.fleet.nodeside.clock_probe import LOAD_SECONDS
from sparkfleet.schema.errors import UserError

if TYPE_CHECKING:
    from sparkfleet.watch.supervisor import Outcome

ORDER = 13

EPILOG = """\
examples:
  sparkfleet watch --profile dcp2                     # probe every 30 s, 3 restarts per 30 min
  sparkfleet watch --profile dcp2 --interval 10 --failures 3 --json
  sparkfleet watch --restore boot10                   # restarts relaunch the restore point
  sparkfleet watch --profile dcp2 --dry-run           # say what it would do at each failure
  sparkfleet watch --profile dcp2 --unit | sudo tee /etc/systemd/system/sparkfleet-watch-dcp2.service

exit codes: 0 stood down (an operator ran up/down/restore of the lane) or ended by SIGTERM/Ctrl-C;
1 the lane was left stopped (restart budget spent, or a restart's preflight failed); 2 bad input;
130/143 a group stop or restart interrupted by a second Ctrl-C/SIGTERM (every rank of that launch stopped).
SIGTERM/Ctrl-C between actions ends watch at once and leaves the lane as it is; during a group
stop or restart watch finishes it first (a second signal interrupts it, stopping that launch).
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("watch", help="keep a lane serving: probe by generation, restart the group within a budget",
                       description="Probe the lane every interval (a tiny checked answer, /health, every rank's "
                       "container and MemAvailable); after K failed probes, or at once when a rank exited or "
                       "vanished, restart the whole group through the up (or restore) playbook; within a "
                       "restart budget, else leave the lane stopped and exit 1.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(p)
    add_inventory(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--profile", "-p", help="the lane to keep serving")
    which.add_argument("--restore", metavar="NAME", help="a restore point: restarts relaunch it (restore playbook)")
    p.add_argument("--interval", type=float, default=30.0, metavar="SECONDS", help="probe period (default 30)")
    p.add_argument("--failures", type=int, default=2, metavar="K",
                   help="consecutive failed probes that make a failure (default 2)")
    p.add_argument("--max-restarts", type=int, default=3, metavar="N", help="restarts per window (default 3)")
    p.add_argument("--window", type=float, default=1800.0, metavar="SECONDS", help="budget window (default 1800)")
    p.add_argument("--backoff", type=float, metavar="SECONDS",
                   help="wait before the 2nd restart in a window, doubling after (default: the interval)")
    p.add_argument("--probe-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="how long the probe's request may take (default 10; at most the interval)")
    p.add_argument("--memory-grace", type=float, metavar="SECONDS",
                   help="how long MemAvailable may stay under its line before the lane is stopped "
                   "(default: two intervals)")
    p.add_argument("--gates", default="models,count100", metavar="LIST",
                   help="gates a restart must pass (default models,count100)")
    p.add_argument("--boot-budget", type=seconds, metavar="SECONDS", help="override the profile's boot budget")
    p.add_argument("--clock-probe-seconds", type=float, metavar="SECONDS", dest="probe_seconds",
                   help=f"how long each restart's GPU clock probe load runs on each rank (as up --probe-seconds; "
                   f"default {LOAD_SECONDS:g})")
    p.add_argument("--poll", type=seconds, default=1.0, metavar="SECONDS",
                   help="poll interval while a restart waits (default 1)")
    p.add_argument("--no-fabric-probe", dest="fabric_probe", action="store_false",
                   help="restarts skip the measured fabric probe between the ranks (as up --no-fabric-probe)")
    add_accept_unknown(p, "each restart")
    p.add_argument("--endpoint", metavar="URL", help="the head's API base URL if not http://HEAD:PORT")
    p.add_argument("--json", action="store_true", help="JSON events, one per line, for scripts")
    p.add_argument("--dry-run", action="store_true", help="probe, and report what it would do at each failure")
    p.add_argument("--unit", action="store_true", help="print a systemd unit that runs this watch, and exit")
    p.add_argument("--user", metavar="NAME", help="with --unit: the unit's User= (default: you, the invoking user)")
    add_progress(p)
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace):
    from sparkfleet.watch.policy import Settings

    return Settings(interval_s=args.interval, failures=args.failures, max_restarts=args.max_restarts,
                    window_s=args.window, backoff_s=args.interval if args.backoff is None else args.backoff,
                    probe_timeout_s=args.probe_timeout,
                    memory_grace_s=2 * args.interval if args.memory_grace is None else args.memory_grace)


def _resolve(args: argparse.Namespace, sp) -> tuple[str, str, dict | None]:
    """(profile, playbook, restore point) — an unknown restore point is bad input."""
    from sparkfleet.root import state_dir
    from sparkfleet.runner.restore import list_points, load_point

    if args.restore is None:
        return args.profile, "up", None
    point = load_point(state_dir(), args.restore)
    if point is None:
        known = ", ".join(p["name"] for p in list_points(state_dir())) or "none recorded"
        raise UserError(f"no restore point named {args.restore!r} in {state_dir() / 'restore'} (known: {known}); "
                        "record one with `sparkfleet up --profile NAME --save-as NAME`")
    if args.inventory is None and point.inventory:
        args.inventory = point.inventory
    return point.profile, "restore", point.options_view()  # what RunOptions.restore_point carries


def run(args: argparse.Namespace) -> int:
    from sparkfleet.cli.lifecycle import probe_seconds
    from sparkfleet.gates.run import GateSetupError, api_key_for, parse_only
    from sparkfleet.plan import make_plan
    from sparkfleet.root import state_dir
    from sparkfleet.runner.events import JsonEvents

    settings = _settings(args)
    problems = settings.problems()
    if problems:
        raise UserError("watch: " + "; ".join(problems))
    clock_probe_s = probe_seconds(args, "--clock-probe-seconds")
    sp = spec(args)
    profile, playbook, point = _resolve(args, sp)
    from sparkfleet.schema.overrides import from_mapping

    # a restore point brings back the -o overrides it served with, as `restore` does
    loaded = sp.profile(profile, from_mapping(point.get("overrides")) if point else [])
    if loaded.profile.abstract:
        raise UserError(f"{profile} is a base for other lanes (abstract: true), not a lane")
    inventory = fleet_inventory(sp, args.inventory)
    plan = make_plan(loaded, inventory, sp.playbook(playbook), sp.root)
    if plan.refused:
        print_findings([f for f in plan.findings if f.status == "fail"], err)
        err.print(f"sparkfleet: watch: lane {profile!r} is refused by its rules; nothing was started", markup=False)
        return EXIT_USAGE
    try:
        parse_only(args.gates)
        key = api_key_for(loaded.profile)
    except GateSetupError as exc:
        raise UserError(f"watch: {exc}") from None
    if args.unit:
        return _unit(args, sp, loaded.profile)
    if args.user:
        raise UserError("watch: --user is the unit's User=: it goes with --unit")
    _refuse_second_watch(state_dir(), profile)
    from sparkfleet.watch.supervisor import Watcher

    events = JsonEvents() if args.json else WatchHumanEvents(verbosity(args))
    watcher = Watcher(sp, loaded, inventory, settings, events, state_dir(), playbook=playbook, restore_point=point,
                      gates=args.gates, dry_run=args.dry_run, api_key=key, endpoint_url=args.endpoint,
                      boot_budget_s=args.boot_budget, probe_seconds=clock_probe_s, poll_s=args.poll,
                      fabric_probe=args.fabric_probe, accept_unknown=args.accept_unknown,
                      command=" ".join(["sparkfleet", "watch", *(sys.argv[2:] if sys.argv[1:2] == ["watch"] else
                                                                  ["--profile", profile])]))

    def report(outcome: Outcome) -> None:
        events.close()
        if args.json:
            events.emit("result", outcome=outcome.state, reason=outcome.why, code=outcome.code)
        elif outcome.code not in (EXIT_OK,):
            err.print(f"sparkfleet: watch {profile}: {outcome.state}: {outcome.why}", markup=False)

    try:  # the result is reported inside the watch, while its handler still holds a second Ctrl-C
        outcome = watcher.run(report=report)
    finally:
        events.close()
    return outcome.code


def _refuse_second_watch(state: Path, profile: str) -> None:
    """One watch per lane per state dir: two would restart the lane around each other."""
    import json
    import socket

    from sparkfleet.watch import status as st

    path = st.path_for(state, profile)
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if d.get("state") in ("stopped", "stood-down", "ended") or d.get("host") != socket.gethostname():
        return
    try:
        os.kill(int(d.get("pid", 0)), 0)
    except (ProcessLookupError, ValueError):
        return
    except PermissionError:
        pass
    raise UserError(f"another watch of {profile} runs (pid {d.get('pid')}, state {d.get('state')}, {path}); "
                    "stop it first")


def _unit(args: argparse.Namespace, sp, profile) -> int:
    """A unit that runs this very watch wherever systemd starts it: every path absolute (the inventory
    wherever it came from: -i, $SPARKFLEET_INVENTORY, the config file or a restore point), run as the
    invoking user (or --user) in the ops root, with the state dir and SSH config this shell uses."""
    from sparkfleet.root import state_dir
    from sparkfleet.runner.context import RunOptions
    from sparkfleet.userconfig import setting
    from sparkfleet.watch import unit

    me = Path(sys.argv[0])
    exe = str(me.absolute()) if me.name == "sparkfleet" and me.is_file() else shutil.which("sparkfleet")
    argv = [exe] if exe else [sys.executable, "-m", "sparkfleet.cli.main"]
    raw = sys.argv[1:] if sys.argv[1:2] == ["watch"] else ["watch", "--profile", profile.name]
    inventory = sp.inventory_path(setting("inventory", args.inventory).value or "lab")
    argv += [*unit.without(raw, {"--unit": 0, "--user": 1, "--root": 1, "--inventory": 1, "-i": 1}),
             "--inventory", str(Path(inventory).expanduser().absolute()), "--root", str(sp.root)]
    environment = {"SPARKFLEET_STATE": str(state_dir().absolute())}
    ssh = setting("ssh_config")
    if ssh.source != "default" and ssh.value:  # the default (~/.ssh/config) is the service user's own
        environment["SPARKFLEET_SSH_CONFIG"] = str(Path(ssh.value).expanduser().absolute())
    budget = args.boot_budget or profile.expect.boot_budget_s or 900
    text = unit.render(sp.root / "templates", profile.name, argv, environment, budget + RunOptions().stop_timeout_s,
                       sp.root / "docs" / "watch.md", profile.api_key_env, user=args.user or unit.invoking_user(),
                       working_directory=sp.root)
    sys.stdout.write(text)
    return EXIT_OK


class WatchHumanEvents(Progress):
    """Watch's own events as timestamped lines; the runner's (steps, findings) as `up` shows them.
    With -q only what changes the lane (failures, restarts given up or failed, stops, the end)."""

    LOUD = ("watch.failure", "watch.restart-failed", "watch.give-up", "watch.stopped", "watch.stand-down",
            "watch.end", "watch.serving", "watch.not-judged", "watch.judged-again")  # what it cannot judge too

    def __init__(self, verbosity: int = 0) -> None:
        super().__init__(out, verbosity)

    def emit(self, event: str, **data) -> None:
        if not event.startswith("watch."):
            super().emit(event, **data)
            return
        if self.verbosity < 0 and event not in self.LOUD:
            return
        self._stop_live()
        width = self.console.width if self.console.is_terminal else 80  # a log file gets 80 columns
        text = textwrap.fill(f"{time.strftime('%H:%M:%S')} {data.get('text', '')}", width=max(40, width),
                             subsequent_indent=" " * 9, break_on_hyphens=False)
        self.console.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)
