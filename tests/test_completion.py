"""bash and zsh completion, generated from the parser, run in the real shells."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.cli.main import COMMANDS, main
from tests.sshlab import in_ci

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
BIN = str(Path(sys.executable).parent)

CASES = [
    (["sparkfleet", "pl"], ["plan", "play"]),
    (["sparkfleet", "plan", "--profile", "dc"], ["dcp1", "dcp2", "dcp4"]),
    (["sparkfleet", "plan", "-p", "dcp2", "--ov"], []),
    (["sparkfleet", "check", "-p", "dcp2", "-o", "x=1", "--wi"], ["--wide"]),
    (["sparkfleet", "trust", "reddie", "as"], ["asusi"]),
    (["sparkfleet", "-i", "lab", "facts", "--node", "bl"], ["bluey"]),
    (["sparkfleet", "sim", "fault", "sp"], ["spark4"]),
    (["sparkfleet", "sim", "h"], ["heal"]),
    (["sparkfleet", "--color", "ne"], ["never"]),
    (["sparkfleet", "restore", ""], ["boot10-good"]),
    (["sparkfleet", "support-bundle", "--run", "2026"], ["20261201-093000-a1b2c3"]),
    (["sparkfleet", "completion", ""], ["bash", "zsh"]),
    (["sparkfleet", "plan", "--profile", "pro"], ["production-1.0-dcp2set", "production-1.0-tonyd2wild",
                                                   "production-1.1"]),  # not the abstract base production-1.2
    (["sparkfleet", "up", "-p", "dcp2", "--no-"], ["--no-probe", "--no-fabric-probe"]),
    (["sparkfleet", "down", "-p", "dcp2", "--no-"], []),  # down starts nothing: no clock probe to skip
    (["sparkfleet", "config", "--col"], ["--color"]),  # a global flag after the verb
]


@pytest.fixture
def env(tmp_path: Path) -> dict:
    state = tmp_path / "state"
    (state / "restore").mkdir(parents=True)
    (state / "restore" / "boot10-good.json").write_text(json.dumps({"name": "boot10-good", "profile": "boot10"}))
    (state / "runs").mkdir()
    (state / "runs" / "20261201-093000-a1b2c3.json").write_text("{}")
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "SPARKFLEET_STATE": str(state),
            "SPARKFLEET_ROOT": str(REPO), "SPARKFLEET_CONFIG": str(tmp_path / "none.yaml")}


def _script(shell: str, capsys) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def _complete(shell: str, script: Path, words: list[str], env: dict) -> list[str]:
    quoted = " ".join("'" + w + "'" for w in words)
    if shell == "bash":
        prog = (f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _sparkfleet; "
                'printf "%s\\n" "${COMPREPLY[@]}"')
    else:
        prog = (f"source {script}; t() {{ local -a cands; local files; _sparkfleet_complete $(($# - 1)) \"$@\"; "
                f"print -rl -- \"${{cands[@]}}\"; }}; t {quoted}")
    proc = subprocess.run([shell, "-c", prog], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_in_the_real_shell(shell: str, env: dict, capsys, tmp_path: Path) -> None:
    if shutil.which(shell) is None:
        if in_ci():
            pytest.fail(f"{shell} is not installed (.ci/run installs it)")
        pytest.skip(f"{shell} not installed")
    script = tmp_path / f"sparkfleet.{shell}"
    script.write_text(_script(shell, capsys))
    got = {tuple(words): _complete(shell, script, words, env) for words, _ in CASES}
    assert got == {tuple(words): want for words, want in CASES}
    # -o/--set and the other options of a command come from its parser
    assert sorted(_complete(shell, script, ["sparkfleet", "up", "--s"], env)) == [
        "--save-as", "--set", "--soak-minutes", "--stall-after", "--stop-on-gate-failure"]  # --keep-on-gate-failure: --k


def test_every_command_is_in_the_script(capsys) -> None:
    import argparse

    from sparkfleet.cli.main import build_parser

    script = _script("bash", capsys)
    top = next(line for line in script.splitlines() if line.strip().startswith("subs="))
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(top.split("=", 1)[1].strip("'").split()) == sorted(sub.choices)
    assert {"plan", "trust", "support-bundle", "completion"} <= set(sub.choices) <= set(COMMANDS)
    assert main(["completion", "--values", "commands"]) == 0
    assert capsys.readouterr().out.split() == sorted(sub.choices)


def test_values_for_an_unknown_inventory_print_nothing(capsys, env, monkeypatch) -> None:
    monkeypatch.setenv("SPARKFLEET_ROOT", str(REPO))
    assert main(["completion", "--values", "nodes", "--inventory", "nosuch"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""  # silent: a tab press must not print a traceback
