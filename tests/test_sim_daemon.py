"""The lab's daemons are stopped by pid, and only when the pid is still that daemon (sim/daemon.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from sparkfleet.sim.daemon import alive_as, stop

IGNORES_TERM = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"


def test_a_daemon_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    p = subprocess.Popen([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "1\n"  # its SIGTERM handler is set
        name = open(f"/proc/{p.pid}/comm").read().strip()
        t = time.monotonic()
        stop(p.pid, name, grace_s=0.5)
        assert p.wait(timeout=5) == -9 and time.monotonic() - t >= 0.5
        assert not alive_as(p.pid, name)
    finally:
        p.kill()
        p.wait()


def test_a_pid_that_is_not_the_daemon_is_left_alone() -> None:
    p = subprocess.Popen(["sleep", "60"])
    try:
        stop(p.pid, "slurmctld", grace_s=0.5)  # a reused pid: another program now
        assert p.poll() is None and alive_as(p.pid, "sleep")
        stop(p.pid, "sleep", grace_s=5)
        assert p.wait(timeout=5) == -15  # it ends on SIGTERM: no SIGKILL needed
    finally:
        p.kill()
        p.wait()
