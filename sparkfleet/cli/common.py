"""What every subcommand shares: the ops directory, JSON output, tables, exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

from sparkfleet.findings import Finding
from sparkfleet.root import find_root
from sparkfleet.spec.load import Spec

# Exit codes: 0 ok, 1 a check/gate/run failed, 2 bad input (spec, options) or a refused lane.
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def add_root(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", metavar="DIR", help="ops directory (default: $SPARKFLEET_ROOT or this checkout)")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def add_inventory(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inventory", "-i", default="lab", metavar="NAME|FILE",
                   help="inventory name under inventories/ or a YAML file (default: lab)")


def spec(args: argparse.Namespace) -> Spec:
    return Spec(find_root(getattr(args, "root", None)))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def print_findings(findings: list[Finding], console: Console = out) -> None:
    """One finding per line plus its remedy: readable in a terminal, a log or a mail."""
    for f in findings:
        where = " ".join(x for x in (f.node, f.where) if x)
        console.print(f"[{STYLE[f.status]}]{f.status.upper():<4}[/] {f.check}"
                      + (f" ({where})" if where else "") + f": {f.message}", highlight=False)
        if f.remedy:
            console.print(f"     -> {f.remedy}", markup=False, highlight=False)
