"""Run a command and get its own peak RSS and block I/O (for tests and bench/engram_copy.py).

Linux keeps a process's peak RSS across fork/vfork + exec, so a child spawned straight from a big
process (pytest, a benchmark holding buffers) reports the parent's size. A small launcher process
spawns the command instead and reports `wait4`'s rusage of that grandchild as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

_LAUNCHER = """
import json, os, sys, time
out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
start = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], dict(os.environ), file_actions=[(os.POSIX_SPAWN_DUP2, out, 1)])
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - start
print(json.dumps({"exit": os.waitstatus_to_exitcode(status), "wall_s": wall, "maxrss_kib": ru.ru_maxrss,
                  "inblock": ru.ru_inblock, "oublock": ru.ru_oublock, "utime": ru.ru_utime, "stime": ru.ru_stime}))
"""


@dataclass
class Measured:
    exit: int
    wall_s: float  # spawn to exit, timed by the launcher (its own start-up not included)
    maxrss_kib: int
    inblock: int  # 512-byte blocks read from storage (not the page cache)
    oublock: int
    utime: float
    stime: float
    stdout: str


def run_measured(argv: list[str], *, env: dict[str, str] | None = None, stdout_path: str,
                 timeout_s: float = 3600) -> Measured:
    """Run argv (stdout to stdout_path) from a small launcher; its own peak RSS and I/O counters."""
    p = subprocess.run([sys.executable, "-I", "-c", _LAUNCHER, stdout_path, *argv], capture_output=True, text=True,
                       env=env if env is not None else dict(os.environ), timeout=timeout_s, check=False)
    if p.returncode != 0 or not p.stdout.strip():
        raise RuntimeError(f"launcher failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    data = json.loads(p.stdout.strip().splitlines()[-1])
    with open(stdout_path, encoding="utf-8", errors="replace") as f:
        data["stdout"] = f.read()
    return Measured(**data)
