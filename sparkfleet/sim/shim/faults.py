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
from .state import ShimError, locked, save

# The node-lost fault (sim/faults.py): the power goes, so every lane rank stops dead where it is (SIGSTOP: no
# process exits, no connection closes, docker's state still says running); back: the node powered up again
# without them (SIGKILL of the stopped ranks; docker then finds them exited).
POWER = {"node-lost": signal.SIGSTOP, "node-back": signal.SIGKILL}


def sim_fault(argv: list[str], root: Path) -> int:
    """`sim-fault KIND` (run inside the node by `sparkfleet sim fault`): act on the running lane containers;
    prints how many it acted on."""
    if len(argv) != 1 or argv[0] not in (*RANK_FAULTS, *POWER):
        raise ShimError(f"usage: sim-fault {'|'.join((*RANK_FAULTS, *POWER))}", 2)
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
