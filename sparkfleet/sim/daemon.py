"""A lab daemon of this machine (slurmctld, munged, the registry), by its pid: is it still the daemon, and
stop it (SIGTERM, a grace, then SIGKILL). Pids are reused, so each act first checks the pid's name."""

from __future__ import annotations

import contextlib
import os
import signal
import time


def alive_as(pid: int, name: str | None = None) -> bool:
    """pid is alive (not a zombie) and, given a name, its command name is `name` (/proc/PID/stat: at most 15
    characters)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    return (name is None or stat.split("(", 1)[1].split(")", 1)[0] == name) and \
        stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop(pid: int | None, name: str, grace_s: float) -> None:
    """SIGTERM the daemon, wait up to grace_s for it to go (reaping it where it is our child), then SIGKILL.
    Nothing is sent to a pid that is not `name` (never started, already gone, or reused)."""
    if not pid or not alive_as(pid, name):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and alive_as(pid, name):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    if alive_as(pid, name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
