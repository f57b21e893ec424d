"""Entry point: `sparkfleet <command>`; user mistakes print one line and exit 2, never a traceback.

Start-up is kept short: `--version` imports nothing else, and a command's module (with what it
imports) is loaded only when that command runs. `COMMANDS` says which module registers which
command; a command missing from it still works (the full parser is built), only slower, and
tests/test_cli_fit.py checks that the index matches what the modules register.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from sparkfleet import __version__

# command -> the module under sparkfleet/cli that registers it
COMMANDS: dict[str, str] = {
    "profiles": "profiles", "show": "profiles", "plan": "plan",
    "up": "lifecycle", "down": "lifecycle", "play": "lifecycle", "restore": "lifecycle",
    "status": "observe", "logs": "observe", "runs": "observe", "facts": "facts", "check": "check",
    "patches": "patches", "gates": "gates", "engram-local": "engram", "exporter": "exporter",
    "dashboards": "exporter", "bench": "bench", "bracket": "bench", "trust": "trust", "sim": "sim",
    "config": "config", "support-bundle": "bundle", "completion": "completion",
    "diff": "diff", "watch": "watch",  # landing from the restore and watch work; absent modules fall back
}
EXIT_USAGE = 2
COLOR = ("auto", "always", "never")


def command_modules(names: list[str] | None = None) -> list:
    """The modules in sparkfleet/cli that define register() (only `names` when given); ORDER sorts --help."""
    import pkgutil

    import sparkfleet.cli

    if names is None:
        names = [info.name for info in pkgutil.iter_modules(sparkfleet.cli.__path__)]
    mods = []
    for name in names:
        module = importlib.import_module(f"sparkfleet.cli.{name}")
        if hasattr(module, "register"):
            mods.append(module)
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 50), m.__name__))


EPILOG = """examples:
  sparkfleet profiles                 # the lanes, with engine, group, port and servable
  sparkfleet show dcp2                # the merged profile
  sparkfleet plan --profile dcp2      # what would run where, in which order; touches nothing
  sparkfleet config                   # the default inventory, root, state dir, SSH config, and their sources
  source <(sparkfleet completion bash)   # tab completion (zsh: sparkfleet completion zsh)
"""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exits 2 too; keep it one line
        self.print_usage(sys.stderr)
        sys.stderr.write(f"sparkfleet: error: {message}\n")
        sys.exit(EXIT_USAGE)


def build_parser(only: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `only` (module names), just those modules' commands are registered."""
    parser = Parser(prog="sparkfleet", description="Orchestrate LLM serving lanes on a DGX Spark fleet "
                    "and a DGX Station GB300.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sparkfleet {__version__}")
    parser.add_argument("--color", choices=COLOR, default="auto",
                        help="colour in output: auto (only on a terminal, the default), always, never")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for module in command_modules(only):
        module.register(sub)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand named in argv (the first word that is not a global option)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word == "--color":
            skip = True
            continue
        if word.startswith("-"):
            continue
        return word
    return None


def _color(argv: list[str]) -> None:
    """Apply --color before any console exists (rich reads FORCE_COLOR / NO_COLOR when it makes one)."""
    for i, word in enumerate(argv):
        when = None
        if word == "--color" and i + 1 < len(argv):
            when = argv[i + 1]
        elif word.startswith("--color="):
            when = word.split("=", 1)[1]
        if when == "always":
            os.environ["FORCE_COLOR"] = "1"
            os.environ.pop("NO_COLOR", None)
        elif when == "never":
            os.environ["NO_COLOR"] = "1"
            os.environ.pop("FORCE_COLOR", None)
        if when is not None or word == _command(argv):
            return


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        sys.stdout.write(f"sparkfleet {__version__}\n")
        return 0
    _color(argv)
    command = _command(argv)
    module = COMMANDS.get(command or "")
    if module is not None:
        import importlib.util

        if importlib.util.find_spec(f"sparkfleet.cli.{module}") is None:
            module = None
    parser = build_parser([module] if module else None)
    args = parser.parse_args(argv)

    from sparkfleet.spec.errors import Busy, SpecError, UserError

    try:
        return int(args.func(args) or 0)
    except Busy as exc:
        from sparkfleet.cli.common import EXIT_BUSY

        sys.stdout.flush()
        sys.stderr.write(f"sparkfleet: {exc}\n")
        return EXIT_BUSY
    except (SpecError, UserError) as exc:
        sys.stdout.flush()
        sys.stderr.write(f"sparkfleet: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        from sparkfleet.cli.common import EXIT_INTERRUPTED

        sys.stderr.write("sparkfleet: interrupted\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
