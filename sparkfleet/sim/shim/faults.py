"""`sim-fault`: engine faults acting on a node's running ranks.

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from .docker import _docker_ready, _remove, reap, stop_engine
from .engine import RANK_FAULTS, RANK_SIGNALS, _lane
from .render import render
from .state import LABEL_PREFIX, STATE, ShimError, load, locked, save

# The node-lost fault (sim/faults.py): the power goes, so every lane rank stops dead where it is (SIGSTOP: no
# process exits, no connection closes, docker's state still says running); back: the node powered up again
# without them (SIGKILL of the stopped ranks; docker then finds them exited).
POWER = {"node-lost": signal.SIGSTOP, "node-back": signal.SIGKILL}


def sim_fault(argv: list[str], root: Path) -> int:
    """`sim-fault KIND` (run inside the node by `sparkfleet sim fault`): act on the running lane containers;
    prints how many it acted on."""
    if argv[:1] == ["--watch-vanish"] and len(argv) == 2:
        return watch_vanish(root, argv[1])
    if len(argv) != 1 or argv[0] not in (*RANK_FAULTS, *POWER):
        raise ShimError(f"usage: sim-fault {'|'.join((*RANK_FAULTS, *POWER))} | --watch-vanish SINCE", 2)
    if load(root, "node.json").get("dockerd"):
        return real_daemon_fault(argv[0])
    with locked(root):
        docker = _docker_ready(root)
        reap(docker)
        running = [c for c in docker["containers"] if _lane(c) and c["State"]["Running"]]
        for c in running:
            if argv[0] == "rank-vanish":
                stop_engine(c, 0.0, signal.SIGKILL)
                _remove(root, docker, c)
            elif c.get("SimProcess"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(c["SimProcess"]["pid"]), {**RANK_SIGNALS, **POWER}[argv[0]])
        save(root, "docker.json", docker)
        render(root)
    print(len(running))
    return 0


def real_daemon_fault(kind: str) -> int:
    """The same faults through the node's real dockerd: a vanished rank is `docker rm -f`; a hang or crash is
    the engine's signal, delivered by `docker kill --signal` to the container's first process (the engine)."""
    import subprocess

    ps = subprocess.run(["docker", "ps", "-q", "--no-trunc", "--filter", f"label={LABEL_PREFIX}profile"],
                        capture_output=True, text=True, timeout=30)
    if ps.returncode != 0:
        raise ShimError(ps.stderr.strip() or f"docker ps exited {ps.returncode}", 1)
    ids = ps.stdout.split()
    if ids:
        sig = {"rank-hang": "USR1", "serve-crash": "USR2", "node-lost": "STOP", "node-back": "KILL"}.get(kind)
        argv = ["docker", "rm", "-f", *ids] if sig is None else ["docker", "kill", "--signal", sig, *ids]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise ShimError(r.stderr.strip() or f"{' '.join(argv[:2])} exited {r.returncode}", 1)
    print(len(ids))
    return 0


VANISH_WATCH_PID = "rank-vanish.watch.pid"  # in the node's sim state: the watcher heal stops


def watch_vanish(root: Path, since: str) -> int:
    """rank-vanish waiting for the next launch on a node with its own dockerd (a container cannot remove
    itself): follow the daemon's own start events (`docker events`, from `since`, so none is missed while
    it connects) and `docker rm -f` each lane container as soon as it has started, marking the fault acted;
    once only unless the fault is sticky, and never after it is healed. Stopped by SIGTERM (heal)."""
    import subprocess
    import sys

    from .state import write_bytes

    events = subprocess.Popen(["docker", "events", "--since", since, "--filter", "type=container", "--filter",
                               "event=start", "--filter", f"label={LABEL_PREFIX}profile", "--format", "{{.ID}}"],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)

    def stop(*_: object) -> None:
        events.terminate()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    write_bytes(root / STATE / VANISH_WATCH_PID, f"{os.getpid()}\n".encode())
    assert events.stdout is not None
    for line in events.stdout:
        with locked(root):
            faults = load(root, "faults.json")
            fault = faults["faults"].get("rank-vanish")
            if fault is None:
                break  # healed
            subprocess.run(["docker", "rm", "-f", line.strip()], capture_output=True, timeout=60)
            fault["acted"] = True
            save(root, "faults.json", faults)
        if not fault.get("sticky"):
            break
    events.terminate()
    (root / STATE / VANISH_WATCH_PID).unlink(missing_ok=True)
    return 0
