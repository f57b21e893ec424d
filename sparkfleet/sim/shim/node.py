"""The node's own processes: its init and the earlyoom it runs.

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .state import STATE, load, write_bytes


def earlyoom_argv(root: Path) -> list[str]:
    node = load(root, "node.json")
    return ["/usr/local/bin/earlyoom", *node["earlyoom"]["default_args"].split()]


def start_earlyoom(root: Path) -> None:
    """Start the node's earlyoom (the sim's stand-in: same name and argv, it watches nothing)."""
    import subprocess

    subprocess.Popen(earlyoom_argv(root), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)


def earlyoom_pids() -> list[int]:
    """The node's earlyoom processes (inside a node, /proc is the node's own)."""
    out = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and Path(f"/proc/{p}/comm").read_text().strip() == "earlyoom":
                out.append(int(p))
        except OSError:
            continue
    return out


def earlyoom(argv: list[str], root: Path) -> int:
    """earlyoom's stand-in: its startup line, then it waits (the sim's memory pressure is only reported)."""
    print(f"earlyoom v1.7 [sim] sparkfleet simulation, args {' '.join(argv)}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


def sim_node_init(argv: list[str], root: Path) -> int:
    """The node's init: earlyoom (unless the earlyoom-off fault is on), in ssh mode the node's sshd,
    then it waits; SIGTERM ends the node (and the pid namespace with it)."""
    import subprocess

    children: list[subprocess.Popen] = []
    faults = load(root, "faults.json")["faults"]
    if "earlyoom-off" not in faults:
        start_earlyoom(root)
        deadline = time.monotonic() + 5.0
        while not earlyoom_pids() and time.monotonic() < deadline:
            time.sleep(0.01)  # the node is up once its earlyoom runs
    if argv[:1] == ["--sshd"]:
        children.append(subprocess.Popen(argv[1:], stdin=subprocess.DEVNULL))

    def stop(signum: int, frame: Any) -> None:
        for c in children:
            with contextlib.suppress(ProcessLookupError):
                c.terminate()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    write_bytes(root / STATE / "init.ready", f"{os.getpid()}\n".encode())
    while True:
        try:
            os.wait()
        except ChildProcessError:
            signal.pause()
