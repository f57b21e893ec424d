"""The srun transport: compute nodes a Slurm cluster does not let us reach over SSH (slurm.ssh: false).

Each node command runs from this machine as one task on its node through `srun`, by the wrapper
sparkfleet/slurm/step.py (a step of the sparkfleet job holding the node, or a job of its own); with
the local transport's semantics: the caller's env only (and SLURM_CONF, PATH for srun itself), `put`
through the node's own `cat`, a command that never started there a "not-run" Result. Nothing can be
forwarded: a head bound to loopback is out of reach, said when asked.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from sparkfleet.fleet.local import LocalTransport
from sparkfleet.schema.inventory import Node


class ForwardRefused(RuntimeError):
    """A port forward was asked of a node reached through srun (there is no SSH connection to carry it)."""


class SrunTransport(LocalTransport):
    """LocalTransport whose every node is entered through `python -m sparkfleet.slurm.step`."""

    def wrapper(self, node: Node, timeout_s: float) -> list[str] | None:
        s = node.slurm
        assert s is not None, f"{node.name}: transport srun without the inventory's slurm: section"
        req = {"node": node.name, "timeout_s": timeout_s, "partition": s.partition, "account": s.account,
               "qos": s.qos, "reservation": s.reservation}
        return [sys.executable, "-m", "sparkfleet.slurm.step", json.dumps(req, separators=(",", ":"))]

    def node_env(self, node: Node) -> dict[str, str]:
        """srun's own needs: its PATH and the inventory's slurm.conf; srun carries them into the task too."""
        env = {"PATH": os.environ.get("PATH", os.defpath)}
        if node.slurm is not None and node.slurm.conf:
            env["SLURM_CONF"] = node.slurm.conf
        return env

    @contextmanager
    def forward(self, node: Node, remote_port: int, remote_host: str = "127.0.0.1") -> Iterator[int]:
        raise ForwardRefused(f"{node.name} is reached through srun (slurm.ssh: false): nothing can forward "
                             f"{remote_host}:{remote_port} there; bind the lane's head to an address this "
                             "machine reaches")
        yield remote_port  # pragma: no cover - a generator, for contextmanager
