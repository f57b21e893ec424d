"""The simulated lab's stand-ins for `nvidia-smi`, `docker`, `ibdev2netdev`, `ip`, `sysctl`, `sim-gpu-load`,
`sim-fault`, `earlyoom` and the node's init: one module per stand-in (state, render, gpu, rdma, net, node,
engine, docker, faults; `tools` dispatches on the name a stub runs as).

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.

Stdlib only, and what a stand-in alone uses (subprocess, fractions, ...) is imported inside the function
that uses it: every `nvidia-smi`, `docker` or `ip` a node runs starts this package afresh, and pays
for what its module imports at the top.
A node gets this package as one zip (sim/sandbox.py install_shims: `sparkfleet_sim_shim.zip`,
each module precompiled for the node's Python) and a three-line stub per tool name at /usr/local/bin.
Inside a node its root R is `/` and the node's state is R/var/lib/sparkfleet-sim (STATE); it re-renders
the files the node shows (`render`) after anything that changes them. The sim controller (`sparkfleet.sim`)
imports this package and calls the same functions with R = the node's tree on this machine, so the shims
and the controller never disagree. Output shapes follow docs/sim-layout.md. An engine's stand-in is one
row of engine.STANDINS.
"""

from __future__ import annotations

from .docker import container_record
from .engine import RANK_FAULTS, engine_argv, engine_standin_argv
from .node import earlyoom_argv
from .render import BOUND_FILES, bound_source, gid_entries, render, uptime_state
from .state import STATE, ShimError, load, locked, node_path, save, write_bytes
from .tools import TOOLS, main

__all__ = ["BOUND_FILES", "RANK_FAULTS", "STATE", "TOOLS", "ShimError", "bound_source", "container_record",
           "earlyoom_argv", "engine_argv", "engine_standin_argv", "gid_entries", "load", "locked", "main",
           "node_path", "render", "save", "uptime_state", "write_bytes"]
