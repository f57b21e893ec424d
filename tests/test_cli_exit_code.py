"""The process's exit code after a Ctrl-C the CLI handled is 130, not a death by SIGINT (-2).

CPython 3.11 marks a KeyboardInterrupt that leaves code run from a string (exec(str): what dataclasses and
namedtuple run while a module is imported) as unhandled, even when a caller catches it later, and a process
started as `python -m` (Modules/main.c Py_RunMain) then dies by SIGINT at exit. A Ctrl-C landing in one of
the CLI's lazy imports did that to a real `python -m sparkfleet.cli.main restore` (CI stop 35: record
written, cleanup done, exit -2). The child here is the real entry point (`run()`), started with -m, around
a command that catches the interrupt as main() does; the SIGINT is a real one, sent while the command runs
code from a string.

An operator who presses Ctrl-C again while the first is handled (CI stop 36: every 5 ms through `up`'s
exit) neither cuts the result short nor gets a traceback: later presses are ignored by the entry point,
and up/restore/watch report their result while a second one is held off.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_run import default_sigint
from tests.conftest import REPO

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

ENTRY = """
import sys
import time
import sparkfleet.cli.main as cli

def main():
    try:
        {body}
    except KeyboardInterrupt:  # handled, as main() handles it: the run is cleaned up, the code decided
        {handler}
        sys.stderr.write("sparkfleet: interrupted\\n")
        return 130
    return 0

cli.main = main
if __name__ == "__main__":
    sys.exit(cli.run())
"""


def entry(tmp_path: Path, body: str, handler: str = "pass") -> subprocess.Popen:
    """The real entry point (`run()`, started with -m as the tests start the CLI) around a main() that runs
    `body` and, on Ctrl-C, `handler`, then says it was interrupted and returns 130."""
    (tmp_path / "entry.py").write_text(ENTRY.format(body=body, handler=handler))
    return subprocess.Popen([sys.executable, "-m", "entry"], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_sigint)


def reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_ctrl_c_handled_inside_code_run_from_a_string_exits_130(tmp_path: Path) -> None:
    # as an import would: a module body, here run from a string, when the Ctrl-C comes
    proc = entry(tmp_path, "exec(\"import time\\nprint('running', flush=True)\\ntime.sleep(30)\")")
    try:
        assert proc.stdout.readline() == "running\n"  # the child is inside the exec'd code
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=20)  # the child sleeps 30 s: a SIGINT that did not land fails here
    finally:
        reap(proc)
    assert (code, proc.stderr.read()) == (130, "sparkfleet: interrupted\n")


def test_ctrl_c_pressed_again_as_a_run_reports_its_result_cannot_cut_the_result_short(ops_root: Path, tmp_path: Path,
                                                                                      monkeypatch, capsys) -> None:
    """A Ctrl-C that comes as the run ends (the operator still pressing it after the first one stopped every
    rank, CI stop 36) lands while the command reports its result: the result is still printed and the exit
    code is the run's. Here a real SIGINT reaches this process as `up --dry-run --json` closes its events, the
    moment before it prints the result (the run itself had nothing to stop)."""
    import json

    from sparkfleet.cli.main import main
    from sparkfleet.runner.events import JsonEvents
    from tests.test_dry_run import recording_inventory

    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    recording_inventory(ops_root, tmp_path / "received.log", answer=False)
    sent: list[int] = []

    def close(self) -> None:  # the operator's Ctrl-C, once, as the events close
        if not sent:
            sent.append(signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(JsonEvents, "close", close)
    code = main(["up", "--profile", "dcp2", "--root", str(ops_root), "-i", "rec", "--dry-run", "--json"])
    seen = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert sent == [signal.SIGINT]
    assert (code, [(e["outcome"], e["reason"]) for e in seen if e["event"] == "result"]) == (0, [("ok", "")])


def test_ctrl_c_pressed_again_as_watch_reports_its_end_cannot_cut_the_result_short(ops_root: Path, tmp_path: Path,
                                                                                  monkeypatch, capsys) -> None:
    """`watch --json`: a first real SIGINT as it starts ends it (the lane left as it is, exit 0); a second
    one, as it closes its events the moment before it prints the result, does not cut the result short."""
    import json

    from sparkfleet.cli.main import main
    from sparkfleet.runner.events import JsonEvents
    from tests.test_dry_run import recording_inventory

    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    recording_inventory(ops_root, tmp_path / "received.log", answer=False)
    sent: list[str] = []
    emit = JsonEvents.emit

    def pressed(self, event: str, **data) -> None:  # the operator's first Ctrl-C, as watch says it started
        emit(self, event, **data)
        if event == "watch.start":
            sent.append(event)
            os.kill(os.getpid(), signal.SIGINT)

    def close(self) -> None:  # and the second, as the events close
        if sent == ["watch.start"]:
            sent.append("close")
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(JsonEvents, "emit", pressed)
    monkeypatch.setattr(JsonEvents, "close", close)
    code = main(["watch", "--profile", "dcp2", "--root", str(ops_root), "-i", "rec", "--json"])
    seen = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert sent == ["watch.start", "close"]
    why = "SIGINT: watch ended; the lane is left as it is"
    assert (code, [(e["outcome"], e["reason"], e["code"]) for e in seen if e["event"] == "result"]) == (
        0, [("ended", why, 0)])


def test_ctrl_c_pressed_again_while_the_first_is_handled_is_ignored(tmp_path: Path) -> None:
    """The real entry point: the first SIGINT interrupts the command; the ones an operator keeps sending
    while the command handles it (here inside its except clause, CI stop 36's window) change nothing: exit
    130, the command's own message, no traceback."""
    import time

    proc = entry(tmp_path, "print('running', flush=True); time.sleep(30)",
                 "print('stopping', flush=True); time.sleep(1)")  # while it handles the first, more come
    try:
        assert proc.stdout.readline() == "running\n"
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.stdout.readline() == "stopping\n"  # inside the except clause, for a second
        for _ in range(20):  # the operator keeps pressing it
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.02)
        code = proc.wait(timeout=20)
    finally:
        reap(proc)
    assert (code, proc.stderr.read()) == (130, "sparkfleet: interrupted\n")


def test_a_run_that_crashes_reports_no_result(ops_root: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """A step that raises (a bug, not a Ctrl-C) still gives its locks back and writes nothing that claims
    an outcome: no result line before the traceback."""
    import json

    import pytest

    from sparkfleet.cli.main import main
    from sparkfleet.runner import run as runner
    from tests.test_dry_run import recording_inventory

    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    recording_inventory(ops_root, tmp_path / "received.log", answer=False)

    def crash(ctx) -> None:
        raise RuntimeError("a bug in a step")

    monkeypatch.setattr(runner, "_steps", crash)
    with pytest.raises(RuntimeError, match="a bug in a step"):
        main(["up", "--profile", "dcp2", "--root", str(ops_root), "-i", "rec", "--dry-run", "--json"])
    seen = [json.loads(x)["event"] for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert "run" in seen and "result" not in seen
