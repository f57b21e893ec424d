"""What every subcommand shares: the ops directory, JSON output, tables, exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from sparkfleet.findings import Finding
    from sparkfleet.fleet.op import Executor
    from sparkfleet.opsdir import Spec
    from sparkfleet.schema.inventory import Inventory

# Exit codes: 0 ok, 1 a check/gate/run failed, 2 bad input (spec, options) or a refused lane,
# 75 busy: the fleet lock is in the way (another run holds it, or a stale one this user cannot remove;
# sysexits.h EX_TEMPFAIL), 130 interrupted by Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_BUSY, EXIT_INTERRUPTED = 0, 1, 2, 75, 130
# check: nothing failed, but a check could not read its part on a node (up refuses that without --accept-unknown);
# 3 as Nagios-style checks say UNKNOWN, so `sparkfleet check && sparkfleet up` does not go on to a refusal
EXIT_UNKNOWN = 3


from sparkfleet.cli.console import LazyConsole, err, out  # noqa: E402,F401 - every verb's consoles, from here


def add_root(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", metavar="DIR", help="ops directory (default: $SPARKFLEET_ROOT or this checkout)")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def add_inventory(p: argparse.ArgumentParser, default: str | None = None) -> None:
    """--inventory; left out it is None, and Spec.inventory() takes the user's default (`sparkfleet config`)."""
    shown = default or "$SPARKFLEET_INVENTORY, the config file, else lab"
    p.add_argument("--inventory", "-i", default=default, metavar="NAME|FILE",
                   help=f"inventory name under inventories/ or a YAML file (default: {shown})")


def _dry_mode(value: str) -> str:
    if value not in ("all", "facts"):
        raise argparse.ArgumentTypeError(f"expected no value or 'facts', got {value!r} (put --dry-run after "
                                         "positional arguments)")
    return value


def add_dry_run(p: argparse.ArgumentParser, what: str = "print every command it would run, per node, in order; "
                "run none and open no connection") -> None:
    """`--dry-run` (nothing reaches a node) and `--dry-run=facts` (read-only facts and queries run)."""
    p.add_argument("--dry-run", nargs="?", const="all", default=None, type=_dry_mode, metavar="facts",
                   help=what + " (--dry-run=facts: read-only facts and queries do run)")


def dry_reads(args: argparse.Namespace) -> bool:
    """--dry-run=facts: read-only commands run."""
    return getattr(args, "dry_run", None) == "facts"


def executor(args: argparse.Namespace, nodes: list, emit: Callable[..., None] | None = None) -> Executor:
    """The executor a verb outside the runner drives its node operations through (fleet/op.py's executor_for,
    under the verb's --dry-run): under --dry-run it opens no connection and prints each command (a JSON line
    each with --json), or hands each to `emit(event, **line)` when given; --dry-run=facts runs reads. The
    caller closes `ex.transport`."""
    from sparkfleet.fleet.op import executor_for, shown_as

    def printed(event: str, **line: Any) -> None:
        if getattr(args, "json", False):
            print(json.dumps({"event": event, **{k: v for k, v in line.items() if k != "content"}}))
        else:
            did = f"write {line['write']}" if "write" in line else line["command"]
            out.print(f"{event}: {line['node']}: {line['what']}: {did}", markup=False, soft_wrap=True)

    return executor_for(nodes, dry_run=bool(getattr(args, "dry_run", None)), reads=dry_reads(args),
                        show=shown_as(emit or printed))


def add_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a profile field after `extends` (repeatable; VALUE is YAML), e.g. "
                   "-o flags.--gpu-memory-utilization=0.78 -o env.NCCL_DEBUG=INFO -o expect.kv_tokens=1888800")


def overrides(args: argparse.Namespace) -> list:
    """The -o KEY=VALUE of a command, parsed (SpecError naming the -o when one is malformed)."""
    from sparkfleet.schema.overrides import parse

    return parse(getattr(args, "overrides", None))


def seconds(text: str) -> float:
    """An argparse type: a duration in seconds above 0 (`--poll -1` or `--poll 0` would spin or never wait)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text}")
    return value


def add_progress(p: argparse.ArgumentParser) -> None:
    """-v / -q of the commands that run steps (up, down, play, restore, watch)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--verbose", "-v", action="store_true",
                   help="also print the commands each step runs on each node")
    g.add_argument("--quiet", "-q", action="store_true", help="print only findings and the result")


def add_accept_unknown(p: argparse.ArgumentParser, who: str = "the run") -> None:
    """--accept-unknown of whatever runs a launching playbook (up, play, restore, watch's restarts, bracket's
    lanes): their check step stops on a check left unknown by a facts part a node could not read."""
    p.add_argument("--accept-unknown", action="store_true",
                   help=f"{who} goes on when a check could not judge because a node could not read part of its "
                   "facts (e.g. /proc/net/tcp, /etc/mtab); the record lists the unknowns accepted. Default: stop, "
                   "as on a failed check")


def add_wide(p: argparse.ArgumentParser, also: str = "") -> None:
    p.add_argument("--wide", "-w", action="store_true",
                   help="the full table on one line per row, whatever the terminal's width" + also)


def spec(args: argparse.Namespace) -> Spec:
    from sparkfleet.opsdir import Spec
    from sparkfleet.root import find_root

    return Spec(find_root(getattr(args, "root", None)))


EXAMPLE = "example inventory: set SPARKFLEET_INVENTORY or -i"


def fleet_inventory(sp: Spec, name: str | None) -> Inventory:
    """The inventory of a command that contacts nodes. Left to the built-in default (no -i, no
    $SPARKFLEET_INVENTORY, no config file) while that default is the shipped example (`example: true`,
    addresses nobody owns), it is refused before anything connects: plan may read it, nothing may dial it."""
    from sparkfleet.schema.errors import UserError
    from sparkfleet.userconfig import setting

    inventory = sp.inventory(name)
    if inventory.example and setting("inventory", name).source == "default":
        raise UserError(f"{EXAMPLE} (the default {sp.inventory_path('lab')} holds example addresses; "
                        "`sparkfleet config` shows where the default comes from)")
    return inventory


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "unknown": "magenta"}


def print_findings(findings: list[Finding], console: Console = out) -> None:
    """Each finding and its remedy, wrapped at whole words to the console's width with a hanging indent:
    readable in a terminal, a log or a mail."""
    from rich.text import Text

    from sparkfleet.cli.tables import wrap_words

    width = max(40, console.width)
    for f in findings:
        where = " ".join(x for x in (f.node, f.where) if x)
        head = f"{f.status.upper():<4} "
        body = f.check + (f" ({where})" if where else "") + f": {f.message}"
        for i, part in enumerate(wrap_words(body, width - len(head))):
            line = Text(head, style=STYLE[f.status]) if i == 0 else Text(" " * len(head))
            console.print(line + Text(part), highlight=False, soft_wrap=True)
        if f.remedy:
            for i, part in enumerate(wrap_words(f.remedy, width - 8)):
                console.print(("     -> " if i == 0 else "        ") + part, markup=False, highlight=False,
                              soft_wrap=True)
