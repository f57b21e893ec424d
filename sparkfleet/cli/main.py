"""Entry point: `sparkfleet <command>`; user mistakes print one line and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import sparkfleet.cli
from sparkfleet import __version__
from sparkfleet.cli.common import EXIT_USAGE, err
from sparkfleet.spec.errors import SpecError, UserError


def command_modules() -> list:
    """Every module in sparkfleet/cli that defines register(); ORDER (default 50) sorts --help."""
    mods = []
    for info in pkgutil.iter_modules(sparkfleet.cli.__path__):
        module = importlib.import_module(f"sparkfleet.cli.{info.name}")
        if hasattr(module, "register"):
            mods.append(module)
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 50), m.__name__))

EPILOG = """examples:
  sparkfleet profiles                 # the lanes, with engine, group, port and servable
  sparkfleet show dcp2                # the merged profile
  sparkfleet plan --profile dcp2      # what would run where, in which order; touches nothing
"""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exits 2 too; keep it one line
        self.print_usage(sys.stderr)
        err.print(f"sparkfleet: error: {message}")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sparkfleet", description="Orchestrate LLM serving lanes on a DGX Spark fleet "
                    "and a DGX Station GB300.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sparkfleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for module in command_modules():
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SpecError as exc:
        err.print(f"sparkfleet: {exc}", markup=False)
        return EXIT_USAGE
    except UserError as exc:
        err.print(f"sparkfleet: {exc}", markup=False)
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.print("sparkfleet: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
