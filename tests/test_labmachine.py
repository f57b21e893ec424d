"""tests/labmachine.py, on which `make test` runs the lab's two streams at once (issue 40): the command gets a
network, mount and PID namespace and a cgroup of its own, and leaves nothing when it ends."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import labmachine
from tests.conftest import REPO

needs_root = pytest.mark.skipif(labmachine.why_not() is not None, reason=str(labmachine.why_not()))

INSIDE = r"""
import os, pathlib, socket, subprocess, sys, time
print("links", subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.count("\n"))
print("netns", sorted(os.listdir("/run/netns")))
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()) == sorted({1, os.getpid(), os.getppid()}) or
      sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("bound", sys.argv[1])
print("cgroup", [line.split(":", 2)[2] for line in open("/proc/self/cgroup") if line.split(":", 2)[1] == "pids"])
subprocess.Popen(["sleep", "300"], start_new_session=True)  # left behind: the namespace's end must kill it
sys.exit(7)
"""


@needs_root
def test_a_command_gets_a_machine_of_its_own_and_leaves_nothing(tmp_path: Path) -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]  # held here: inside, the same port on loopback must be free
    (tmp_path / "inside.py").write_text(INSIDE)
    before = {d: sorted(c for c in d.iterdir() if c.is_dir()) for d in labmachine.own_cgroups()}
    sleepers = subprocess.run(["pgrep", "-f", "^sleep 300$"], capture_output=True, text=True).stdout.split()
    p = subprocess.run([sys.executable, str(REPO / "tests" / "labmachine.py"), "t", "--", sys.executable,
                        str(tmp_path / "inside.py"), str(port)], capture_output=True, text=True, timeout=60)
    held.close()
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    assert p.returncode == 7, p.stdout + p.stderr  # the command's own status
    assert lines["links"] == "1"  # loopback alone
    assert lines["netns"] == "[]"
    assert lines["pids"] == "True", lines["pids"]  # the init, the command: nothing of this machine's
    assert lines["bound"] == str(port)
    assert lines["cgroup"].startswith("['/") and "/sflab-t-" in lines["cgroup"], lines["cgroup"]
    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "-f", "^sleep 300$"], capture_output=True, text=True).stdout.split() != sleepers:
        assert time.monotonic() < deadline, "the sleep left inside outlived its namespace"
        time.sleep(0.1)
    assert before and {d: sorted(c for c in d.iterdir() if c.is_dir()) for d in before} == before  # its cgroups went


def test_the_second_streams_modules_are_lab_modules_that_exist() -> None:
    listed = [line for line in (REPO / "tests" / "lab_stream_b.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    assert listed and len(set(listed)) == len(listed)
    for path in listed:
        text = (REPO / path).read_text()
        assert "pytest.mark.unit" not in text, f"{path} is a unit module: it runs beside the lab, not in a stream"
    assert "tests/lab_stream_b.txt" in (REPO / "Makefile").read_text()
