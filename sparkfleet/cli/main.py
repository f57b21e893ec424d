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

# command -> the module under sparkfleet/cli that registers it, in the order `--help` lists them
COMMANDS: dict[str, str] = {
    "profiles": "profiles", "show": "profiles", "plan": "plan", "diff": "diff",
    "up": "lifecycle", "down": "lifecycle", "play": "lifecycle", "restore": "lifecycle", "watch": "watch",
    "status": "observe", "logs": "observe", "runs": "observe", "facts": "facts", "check": "check",
    "patches": "patches", "build": "build", "pin": "pin", "gates": "gates", "engram-local": "engram",
    "exporter": "exporter", "dashboards": "exporter", "bench": "bench", "bracket": "bench", "support-bundle": "bundle",
    "trust": "trust", "sim": "sim", "config": "config", "completion": "completion",
}
# command -> its one-line help as its module registers it (tests/test_cli_fit.py checks): `sparkfleet` and
# `sparkfleet --help` print the command list from here, importing no command module
HELP: dict[str, str] = {
    "profiles": "list the lanes (engine, group, port, servable)",
    "show": "print a profile with its bases merged",
    "plan": "show what `up` would run where; touches nothing",
    "diff": "what differs between two of: profile, restore point, run (per rank)",
    "up": "bring a lane up: stop-all, preflight, patches, workers then head, ready",
    "down": "stop a lane (head first), remove rail-2 aliases, verify it is gone",
    "play": "run your own playbook for a lane",
    "restore": "relaunch a recorded known-good lane as it ran, every pin verified",
    "watch": "keep a lane serving: probe by generation, restart the group within a budget",
    "status": "per node: lane, rank, container state, uptime; the endpoint's health",
    "logs": "a lane's logs, every rank merged with a node prefix",
    "runs": "list run records; `runs show ID` prints one",
    "facts": "gather node facts: memory, GPU, earlyoom, containers, RDMA, storage",
    "check": "preflight a lane's nodes: a table of findings with remedies",
    "patches": "build, verify and push patch sets",
    "build": "build a lane's engine on every rank from source and pin the result",
    "pin": "pin a lane's image to the registry digest every rank holds (image.digest)",
    "gates": "answer gates against a lane's endpoint: models, count100, needle, image, tools, soak...",
    "engram-local": "node-local, verified sparse copies of each rank's Engram rows",
    "exporter": "Prometheus metrics for the fleet (nodes, GPUs, earlyoom, lanes, checks)",
    "dashboards": "write Grafana dashboards, provisioning and a Prometheus scrape config",
    "bench": "benchmark a lane: prompt set v1 at C1..C16, cold prefill, DSpark acceptance",
    "bracket": "CTL -> CAND -> CTL in one window against pre-registered bars; never promotes",
    "support-bundle": "one tar.gz of a run for a maintainer: record, logs, facts, profile, plan, versions "
                      "(secrets redacted)",
    "trust": "pin nodes' SSH host keys (sparkfleet checks them strictly)",
    "sim": "a simulated copy of the lab on this machine (SIMULATION), for rehearsal and tests",
    "config": "show the defaults in effect and where each came from",
    "completion": "print bash or zsh tab completion (commands, profiles, nodes, restore points)",
}

# What each command's exit status means; build_parser ends every command's help with it (a command whose
# epilog already says `exit codes:` keeps its own wording). 130 is every command's: main() turns Ctrl-C into it.
_BAD = "2 bad input (one line naming file, line and field)"
_REFUSED = "2 bad input or a refused lane (one line naming file, line and field)"
_LOCK = "75 busy: another run holds the fleet lock (named with its holder)"
_INT = "130 interrupted (Ctrl-C)"
EXIT_CODES: dict[str, str] = {
    "profiles": f"0 ok; {_BAD}; {_INT}",
    "show": f"0 ok; {_BAD}; {_INT}",
    "plan": f"0 the lane plans (warnings included); {_REFUSED}; {_INT}",
    "diff": f"0 no difference; 1 they differ; {_BAD}; {_INT}",
    "up": f"0 the lane serves; 1 a check, step or gate failed (a failed gate stops the lane unless "
          f"--keep-on-gate-failure); {_REFUSED}; {_LOCK}; {_INT}, 143 SIGTERM: what it started is stopped",
    "down": f"0 the lane is gone; 1 a step failed, or a node could not be reached (the others are stopped); "
            f"{_REFUSED}; {_LOCK}; {_INT}",
    "play": f"0 every step passed; 1 a step failed; {_REFUSED}; {_LOCK}; {_INT}",
    "restore": f"0 the lane serves; 1 a pin drifted (nothing stopped), or a check, step or gate failed; "
               f"{_REFUSED}; {_LOCK}; {_INT}",
    "status": f"0 every node answered; 1 a node did not answer (its reason is shown); {_BAD}; {_INT}",
    "logs": f"0 ok (and Ctrl-C while following); {_BAD}",
    "runs": f"0 ok; {_BAD}; {_INT}",
    "facts": f"0 every node answered; 1 a node failed (its cause is shown); {_BAD}; {_INT}",
    "check": f"0 nothing failed; 1 a check failed or a node did not answer; {_REFUSED}; 3 nothing failed, but a "
             f"check could not read its part on a node (`up` refuses that without --accept-unknown); {_INT}",
    "patches": f"0 ok; 1 a file is missing or its sha256 differs; {_BAD}; {_INT}",
    "build": f"0 built and pinned on every rank; 1 a rank's build failed or the ranks built different bytes "
             f"(nothing installed, nothing pinned); {_BAD}; {_LOCK}; {_INT}",
    "pin": f"0 pinned (or already pinned; --dry-run: shown); 1 refused: a rank lacks the image or did not answer, "
           f"the ranks hold different builds or no common registry digest (nothing written); {_BAD}; {_INT}",
    "gates": f"0 every gate passed; 1 a gate failed; {_BAD}; {_INT}",
    "engram-local": f"0 ok; 1 a copy is missing, incomplete or does not verify; {_BAD}; {_INT}",
    "exporter": f"0 ok (--once printed, or the server ended); {_BAD}; {_INT}",
    "dashboards": f"0 written; {_BAD}; {_INT}",
    "bench": f"0 the bench ran; 1 a request or the lane failed; {_BAD}; {_INT}",
    "bracket": f"0 the candidate met every bar; 1 it did not, or a run failed; {_BAD}; {_INT}",
    "support-bundle": f"0 written (what could not be collected is in its manifest); {_BAD}; {_INT}",
    "trust": f"0 every named node ends up pinned; 1 otherwise; {_BAD}; {_INT}",
    "sim": f"0 ok; {_BAD}; {_INT}",
    "config": f"0 ok; {_BAD}",
    "completion": f"0 ok; 1 --values could not read its list (it prints nothing); {_BAD}",
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

`sparkfleet COMMAND --help` is that command's manual: its options, examples and exit codes.
exit codes: 0 ok; 1 a check, gate or run failed; 2 bad input or a refused lane (one line naming file, line
and field, never a traceback); 75 busy: the fleet lock is in the way; 130 interrupted (Ctrl-C)
"""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exits 2 too; keep it one line
        self.print_usage(sys.stderr)
        sys.stderr.write(f"sparkfleet: error: {message}\n")
        sys.exit(EXIT_USAGE)


def _top() -> tuple[Parser, argparse._SubParsersAction]:
    parser = Parser(prog="sparkfleet", description="Orchestrate LLM serving lanes on a DGX Spark fleet "
                    "and a DGX Station GB300.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sparkfleet {__version__}")
    _add_color(parser, "auto")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    return parser, sub


def _add_color(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--color", choices=COLOR, default=default,
                        help="colour in output: auto (only on a terminal, the default), always, never")


def _finish(parser: argparse.ArgumentParser, codes: str | None) -> None:
    """A command's parser (and its subcommands'): --color accepted after the verb too, exit codes last."""
    if not any("--color" in a.option_strings for a in parser._actions):
        _add_color(parser, argparse.SUPPRESS)  # SUPPRESS: left out, the top-level default stands
    epilog = parser.epilog or ""
    if codes and "exit codes:" not in epilog:
        parser.epilog = (epilog.rstrip() + "\n\n" if epilog else "") + f"exit codes: {codes}"
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _finish(child, codes)


def build_parser(only: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `only` (module names), just those modules' commands are registered."""
    parser, sub = _top()
    for module in command_modules(only):
        module.register(sub)
    for name, child in sub.choices.items():
        _finish(child, EXIT_CODES.get(name))
    return parser


def index_parser() -> argparse.ArgumentParser | None:
    """The top-level parser from COMMANDS/HELP alone, for `sparkfleet` and `sparkfleet --help` (no command
    module imported); None when the index lacks a command's help (then the full parser says it)."""
    if set(COMMANDS) - set(HELP):
        return None
    parser, sub = _top()
    for name, text in HELP.items():
        if name in COMMANDS:
            sub.add_parser(name, help=text, add_help=False)
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
    """Apply --color before any console exists (rich reads FORCE_COLOR / NO_COLOR when it makes one);
    the last one on the line wins, before the verb or after it."""
    when = None
    for i, word in enumerate(argv):
        if word == "--":
            break
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        sys.stdout.write(f"sparkfleet {__version__}\n")
        return 0
    _color(argv)
    command = _command(argv)
    if command is None and all(w in ("-h", "--help", "--color", *COLOR) or w.startswith("--color=") for w in argv):
        parser = index_parser() or build_parser()
        parser.print_help()  # `sparkfleet` alone is a question, not a mistake: the help, exit 0
        return 0
    module = COMMANDS.get(command or "")
    if module is not None:
        import importlib.util

        if importlib.util.find_spec(f"sparkfleet.cli.{module}") is None:
            module = None
    parser = build_parser([module] if module else None)
    args = parser.parse_args(argv)

    from sparkfleet.schema.errors import Busy, SpecError, UserError

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


def run() -> int:
    """The process's entry (the `sparkfleet` script, `python -m sparkfleet.cli.main`): main(), then its exit
    code stands. The first Ctrl-C interrupts the command (KeyboardInterrupt, as Python's own handler raises
    it); every later one is ignored: the process is already stopping for the first (a run stops every rank
    it started, writes its record and reports its result, each step bounded), and an operator who keeps
    pressing it must not cut that short with a traceback in an except clause or a death by the signal in
    the interpreter's shutdown (CI stop 36: a Ctrl-C every 5 ms through `up`'s exit). SIGTERM keeps its
    default, so a shutdown that hangs can still be ended. main() itself stays free of process-wide settings:
    tests call it in-process.

    CPython (3.11: Python/pythonrun.c run_eval_code_obj, Modules/main.c Py_RunMain) also kills a `python -m`
    process by SIGINT at exit when a KeyboardInterrupt once left code run from a string (exec(str):
    dataclasses and namedtuple build their methods so, at import), even when our handler caught it later: a
    Ctrl-C that lands in a lazy import made a handled, recorded interrupt die by the signal (-2) instead of
    exiting 130 (CI stop 35). Each such evaluation clears that flag first, so one empty evaluation after
    main() clears it."""
    import signal

    # a flag, not SIG_IGN set by the handler: the runner puts back the handler it found when its cleanup
    # ends (runner/run.py _signals), which would arm Ctrl-C again
    pressed: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        if not pressed:  # the first Ctrl-C; the later ones find the process already stopping
            pressed.append(signum)
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exec("")  # clears CPython's "unhandled KeyboardInterrupt" flag (above): main() handled every one
    return code


if __name__ == "__main__":
    sys.exit(run())
