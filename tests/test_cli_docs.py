"""Help that is the manual: what README.md and docs/*.md tell an operator to type parses, and the help says it.

Every command line the docs show (an indented or fenced code line, or an inline code span, that starts
with `sparkfleet `) goes through sparkfleet's own parser: a documented flag, verb or choice that does
not exist fails here. A synopsis (`[--out FILE]`, `A|B`, `...`) cannot be parsed as typed, so each of
its options must exist on its verb instead.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.cli import main as cli_main
from sparkfleet.cli.main import build_parser, main

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
START = re.compile(r"^(?:\$ |source <\(|(?:[A-Z_]+=\S+ )*)(sparkfleet (?:--color \w+ )?[a-z-]+\b.*)$")
SYNOPSIS = re.compile(r"\[|\.\.\.|\||(?<![\w-])[A-Z][A-Z_]+\b")  # [optional], ..., a|b, PLACEHOLDER
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_|]*$")


# code lines that start with `sparkfleet` but are what it printed, not what to type
PRINTED = {"sparkfleet bench client overhead (SIMULATED engine"}


def documented() -> list[tuple[str, str, bool]]:
    """(where, text, whole) for every `sparkfleet ...` the docs show; whole: a code line (a command as typed),
    else an inline code span (may name a verb without its required arguments)."""
    found = []
    for path in DOCS:
        fenced = False
        for n, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{n}"
            if line.startswith("```"):
                fenced = not fenced
                continue
            texts = []
            if fenced or line.startswith("    "):
                texts.append((line.strip(), True))
            else:
                texts += [(m.group(1), False) for m in re.finditer(r"`(sparkfleet [^`]+)`", line)]
            for text, whole in texts:
                m = START.match(text)
                if m and not any(m.group(1).startswith(p) for p in PRINTED):
                    found.append((where, m.group(1), whole))
    return found


def _words(text: str) -> list[str]:
    """The argv of one shell line: up to a pipe, a redirection, `)` or a comment."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = []
    for w in lexer:
        if w and set(w) <= set("|&;<>()"):
            break
        words.append(w)
    return words[1:]  # without `sparkfleet`


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _verb(parser: argparse.ArgumentParser, words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The (sub)parser the words name, and the words after it."""
    path = []
    for w in words:
        subs = _subparsers(parser)
        if w in subs:
            parser, path = subs[w], [*path, w]
        elif not w.startswith("-"):
            break
    return parser, path


PARSER = build_parser()
LINES = documented()


def test_the_docs_show_commands() -> None:
    assert len(LINES) > 90, len(LINES)  # the extraction found them (README's "What you type" alone has 25)


@pytest.mark.parametrize(("where", "text", "whole"), LINES, ids=[w for w, _, _ in LINES])
def test_documented_command_line_parses(where: str, text: str, whole: bool) -> None:
    typed = text.split(" #", 1)[0].split(" | ", 1)[0].split(" > ", 1)[0]
    if not whole or SYNOPSIS.search(typed.replace("sparkfleet", "", 1)):
        words = re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", typed)
        parser, path = _verb(PARSER, [w for w in re.split(r"[\s\[\]]+", typed)[1:] if w])
        assert path or set(words) <= {"--color", "--version", "--help", "-h"}, f"{where}: {text!r}: names no command"
        options = {o for a in parser._actions for o in a.option_strings}
        missing = [w for w in words if w not in options]
        assert not missing, f"{where}: {text!r}: `sparkfleet {' '.join(path)}` has no {', '.join(missing)}"
        return
    argv = _words(text)
    try:
        PARSER.parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"{where}: {text!r} does not parse (exit {exc.code})") from None


# -- the help itself -------------------------------------------------------------------------------------

def _verbs() -> dict[str, argparse.ArgumentParser]:
    return _subparsers(PARSER)


@pytest.mark.parametrize("verb", sorted(cli_main.COMMANDS))
def test_every_verb_help_ends_with_an_example_and_its_exit_codes(verb: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([verb, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    tail = text[text.index("\nexample"):]  # `example:` or `examples:`, after the options
    assert re.search(rf"^  (?:.*\| )?sparkfleet {re.escape(verb)}\b", tail, re.M), tail
    codes = tail[tail.index("exit codes: "):]
    assert "0 " in codes and "2 bad input" in codes
    assert text.rstrip().endswith(codes.rstrip())  # the exit codes are last


def test_every_option_has_help() -> None:
    silent = []
    for verb, parser in _verbs().items():
        for a in parser._actions:
            if a.help is None and not isinstance(a, argparse._SubParsersAction):
                silent.append(f"{verb} {'/'.join(a.option_strings) or a.dest}")
    assert silent == ["show profile"]  # cli/profiles.py is another piece of work's


@pytest.mark.parametrize("verb", sorted(cli_main.COMMANDS))
def test_json_on_every_verb_that_prints_a_result(verb: str) -> None:
    parser = _verbs()[verb]
    parsers = [parser, *_subparsers(parser).values()]
    have = [any("--json" in a.option_strings for a in p._actions) for p in parsers]
    # completion prints a shell script or one name a line; exporter serves (or with --once prints) the
    # Prometheus exposition: both are already a format for programs
    assert any(have) == (verb not in ("completion", "exporter")), verb


def test_sparkfleet_alone_prints_the_help_and_exits_0() -> None:
    proc = subprocess.run([sys.executable, "-m", "sparkfleet.cli.main"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("usage: sparkfleet ") and "exit codes: 0 ok" in proc.stdout
    for verb, text in cli_main.HELP.items():  # each command on its line, with the start of its help
        assert re.search(rf"^    {re.escape(verb)}\s+{re.escape(text.split()[0])} ", proc.stdout, re.M), verb


def test_the_help_index_is_what_the_modules_register() -> None:
    registered = {}
    for module in cli_main.command_modules():
        sub = argparse.ArgumentParser().add_subparsers()
        module.register(sub)
        registered.update({a.dest: a.help for a in sub._choices_actions})
    assert cli_main.HELP == registered
    assert list(cli_main.HELP) == [c for c in cli_main.COMMANDS if c in cli_main.HELP]


def test_help_imports_no_command_module() -> None:
    code = ("import sys; from sparkfleet.cli.main import main; main(['--help']); "
            "print(sorted(m for m in sys.modules if m.startswith('sparkfleet.cli.') and m != 'sparkfleet.cli.main'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("argv", [["config", "--color", "never", "--json"], ["--color", "never", "config", "--json"],
                                  ["config", "--json", "--color=always"]])
def test_global_flags_before_or_after_the_verb(argv: list[str], capsys, monkeypatch) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR"):  # set first, so monkeypatch restores what main() sets
        monkeypatch.setenv(name, "1")
        monkeypatch.delenv(name)
    assert main(argv) == 0
    assert '"settings"' in capsys.readouterr().out
    import os

    assert ("NO_COLOR" in os.environ) == ("never" in argv), os.environ.get("FORCE_COLOR")


@pytest.mark.parametrize(("argv", "message"), [
    (["up", "-p", "dcp2", "--poll", "-1"], "argument --poll: expected seconds above 0, got -1"),
    (["up", "-p", "dcp2", "--poll", "0"], "argument --poll: expected seconds above 0, got 0"),
    (["watch", "-p", "dcp2", "--poll", "nan"], "argument --poll: expected seconds above 0, got nan"),
    (["restore", "boot10", "--boot-budget", "-5"], "argument --boot-budget: expected seconds above 0, got -5"),
    (["down", "-p", "dcp2", "--no-probe"], "unrecognized arguments: --no-probe"),
    (["play", "x.yaml", "-p", "dcp2", "--probe-seconds", "2"], "unrecognized arguments: --probe-seconds 2"),
])
def test_bad_option_values_are_refused(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"sparkfleet: error: {message}"
