"""A command that never ran on a node is reported as that (not-run, with its remedy), never as a permission
the command met; a fleet lock whose take never ran is not "given back". Issue 31.

The lab test makes a node that really cannot be entered the way the issue met it: without root, nsenter
joins a user namespace that does not own the node's other namespaces ("reassociate to namespace 'ns/ipc'
failed: Operation not permitted"). It runs only without root (root enters any namespace); .ci/run runs the
`nonroot` tests a second time as an unprivileged user.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.fleet.local import NOT_RUN_FD, LocalTransport
from sparkfleet.fleet.ops import REMEDIES, classify
from sparkfleet.naming import node_lock_path
from sparkfleet.schema.inventory import Node
from sparkfleet.sim import node as simnode
from sparkfleet.sim import paths
from tests.test_transport_local import make_node

SPARKS = ("reddie", "asusi", "bluey", "spark4")
FAST = ["--gates", "models", "--poll", "0.2", "--no-probe"]


def wrapped(tmp_path: Path, body: str) -> Node:
    """A local node whose wrapper is a script of `body` (bash), as an inventory's `wrapper` names one."""
    script = tmp_path / "wrapper"
    script.write_text("#!/bin/bash\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return make_node("n1", script)


def test_what_a_wrapper_says_on_its_status_pipe_is_a_command_that_never_ran(tmp_path) -> None:
    node = wrapped(tmp_path, f'echo "cannot enter n1: no such namespace" >&"${NOT_RUN_FD}"; exit 1\n')
    with LocalTransport() as t:
        r = t.run([node], "touch /tmp/never")["n1"]
    assert (r.ok, r.error, r.exit_code) == (False, "not-run", 1)
    assert r.message == "n1: the command could not be run on the node: cannot enter n1: no such namespace"
    e = classify(r)
    assert (e.kind, e.message, e.remedy) == ("not-run", r.message, REMEDIES["not-run"])


def test_a_command_that_ran_and_failed_is_not_taken_for_one_that_never_ran(tmp_path) -> None:
    """The wrapper closes the pipe before the command starts: the command's own failure (here one that says
    'Operation not permitted') is the command's, reported as it always was."""
    node = wrapped(tmp_path, f'exec {{{NOT_RUN_FD}}}>&-; unset {NOT_RUN_FD}; exec "$@"\n')
    with LocalTransport() as t:
        r = t.run([node], "echo 'mkdir: cannot create directory /x: Operation not permitted' >&2; exit 1")["n1"]
    assert (r.error, r.exit_code) == ("exit", 1)
    e = classify(r)
    assert (e.kind, e.message) == ("permission", "permission denied: mkdir: cannot create directory /x: "
                                                 "Operation not permitted")


def _nested_userns_pid(sim, name: str, tag: str) -> int:
    """Start, inside the node, a process in a user namespace of its own (nested in the node's), and return
    its pid on this machine: it shares the node's mount namespace, so the enter script takes it for the node,
    but its user namespace owns none of the node's others."""
    simnode.run_in(paths.node_dir(name), ["/usr/bin/unshare", "--user", "/bin/sleep", tag], detach=True)
    want = ["/bin/sleep", tag]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                if p.stat().st_uid == os.getuid() and (p / "cmdline").read_bytes().split(b"\0")[:2] == [
                        w.encode() for w in want]:
                    return int(p.name)
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError(f"the nested process did not start on {name}")


@pytest.mark.nonroot
@pytest.mark.skipif(os.geteuid() == 0, reason="root enters any namespace; .ci/run runs this as an unprivileged user")
def test_a_node_that_cannot_be_entered_is_reported_as_that_not_as_a_lock_permission(sim, capsys) -> None:
    init = simnode.init_path(paths.node_dir("reddie"))
    original = init.read_text()
    nested = _nested_userns_pid(sim, "reddie", "31415")
    node_pid = json.loads(original)["pid"]
    assert os.readlink(f"/proc/{nested}/ns/user") != os.readlink(f"/proc/{node_pid}/ns/user")
    try:
        init.write_text(json.dumps({**json.loads(original), "pid": nested}) + "\n")
        code = main(["up", "--profile", "dcp2", "--inventory", "sim", *FAST])
        out, err = capsys.readouterr()
    finally:
        init.write_text(original)
        os.kill(nested, signal.SIGKILL)
    lock = node_lock_path()
    assert code == 2, out + err
    assert err == (f"sparkfleet: reddie: could not take the fleet lock {lock} (its command could not be run there): "
                   "reddie: the command could not be run on the node: nsenter: reassociate to namespace 'ns/ipc' "
                   f"failed: Operation not permitted; {REMEDIES['not-run']}\n")
    assert "give back" not in out + err and "permission denied" not in (out + err).lower()
    for name in SPARKS:  # the other nodes' locks were taken and given back; reddie's was never taken
        assert not (sim.root(name) / lock.lstrip("/")).exists(), name
    assert main(["status", "--inventory", "sim"]) == 0  # the node enters again as before
    capsys.readouterr()
