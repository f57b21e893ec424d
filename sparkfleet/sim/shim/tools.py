"""The entry point: the tool a stub runs as, dispatched by name.

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.
"""

from __future__ import annotations

import os
import sys

from .docker import docker
from .faults import sim_fault
from .gpu import nvidia_smi, sim_gpu_load
from .net import ip, sysctl
from .node import earlyoom, sim_node_init
from .rdma import ibdev2netdev
from .runtime import nvidia_container_runtime_hook, sim_nvidia_runtime
from .state import ShimError, sandbox_root

TOOLS = {"nvidia-smi": nvidia_smi, "docker": docker, "ibdev2netdev": ibdev2netdev, "sim-gpu-load": sim_gpu_load,
         "ip": ip, "sysctl": sysctl, "earlyoom": earlyoom, "sim-node-init": sim_node_init,
         "sim-fault": sim_fault, "sim-nvidia-runtime": sim_nvidia_runtime,
         "nvidia-container-runtime-hook": nvidia_container_runtime_hook}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    tool = os.path.basename(argv[0])
    if tool not in TOOLS:
        sys.stderr.write(f"sparkfleet sim shim: run me as one of {', '.join(TOOLS)} (got {tool!r})\n")
        return 2
    try:
        return TOOLS[tool](argv[1:], sandbox_root())
    except ShimError as exc:
        sys.stderr.write(str(exc) + "\n")
        return exc.code
    except BrokenPipeError:
        return 0
