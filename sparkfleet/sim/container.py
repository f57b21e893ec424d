"""Inside a lab image's container (a real container of the node's real dockerd): the programs the image
holds stand in for the engine's, as the docker shim's containers do.

THIS IS PART OF THE SIMULATED LAB. The lab's image (sim/image.py) has `vllm`, `llama-server`,
`rpc-server`, `ggml-rpc-server` and `python3` on its PATH, each a two-line script that runs this module
with its own name. The container is real (its mounts, environment, network, labels and exit codes are
dockerd's); only the program in it stands in: the same rows of shim.engine.STANDINS pick it from the
container's command line, environment and mounts, which here are read from the container itself (argv,
environ, /proc/self/mountinfo) rather than from the shim's records. The node's sim state is bound in at
its node path by the sim's runtime (shim/runtime.py), so faults, GPU state and node facts are the node's.
Paths are the container's own: the container's root is the sandbox root R, and every mount is its own.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sparkfleet.sim import llama
from sparkfleet.sim.image import VERSION_FILE
from sparkfleet.sim.shim import engine_standin_argv, load
from sparkfleet.sim.shim.docker import gpu_load, gpu_load_seconds
from sparkfleet.sim.shim.engine import ENGINE_VERSION_LABEL, RANK_SIGNALS, rank_faults_due

ROOT = Path("/")
SYSTEM_PYTHON = "/usr/bin/python3"
SUBCOMMANDS = {"vllm": "serve"}  # a tool whose first word is a subcommand, held in the image's entrypoint


def mount_points() -> list[str]:
    """The container's mount points (its binds among them), from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4].replace("\\040", " ")
            if point != "/" and not point.startswith(("/proc", "/dev", "/sys")):
                out.append(point)
    return out


def _vanishing() -> bool:
    """The node's rank-vanish fault is armed for this launch (sticky, or not yet acted on)."""
    fault = load(ROOT, "faults.json")["faults"].get("rank-vanish")
    return fault is not None and bool(fault.get("sticky") or not fault.get("acted"))


def container_id() -> str:
    """The container's id: the last part of its cgroup path (dockerd's cgroupfs driver names it so)."""
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            leaf = line.rstrip("\n").rsplit("/", 1)[-1]
            if len(leaf) == 64 and all(c in "0123456789abcdef" for c in leaf):
                return leaf
    return os.uname().nodename


def record(tool: str, args: list[str]) -> dict:
    """The container as the stand-ins read one (the shim's record's fields), from inside it. A mount is
    its own node path: the container's root stands for the node's (ROOT)."""
    sub = SUBCOMMANDS.get(tool)
    entrypoint, cmd = ([tool, sub], args[1:]) if sub and args[:1] == [sub] else ([tool], args)
    labels = {}
    version = ROOT / VERSION_FILE
    if version.is_file():  # the engine version the image holds (sim/image.py), as the shim has it in a label
        labels[ENGINE_VERSION_LABEL] = version.read_text().strip()
    return {"Id": container_id(),
            "Config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": [f"{k}={v}" for k, v in os.environ.items()],
                       "Labels": labels},
            "HostConfig": {"Binds": [f"{p}:{p}" for p in mount_points()]}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    tool, args = os.path.basename(argv[0]), argv[1:]
    if tool == "python3":
        seconds = gpu_load_seconds([tool], args)
        if seconds is not None:  # the clock probe's torch load: the node's GPU reads busy meanwhile
            return gpu_load(ROOT, seconds)
        os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, *args])
    c = record(tool, args)
    if _vanishing():
        # rank-vanish armed on this node: the sim's watcher (shim/faults.py watch_vanish) removes this container
        # as soon as dockerd says it started; until then the rank serves nothing, as the shim's vanished rank
        # never runs at all (else a fast rpc-server could accept before the removal, and the launch pass)
        while True:
            time.sleep(3600)
    if tool in llama.TOOLS:  # llama.cpp's own server or RPC server, in this process (sim/llama.py)
        try:
            return llama.serve_record(ROOT, c)
        except llama.Refused as exc:
            sys.stderr.write(f"{exc}\n")
            return 1
    cfg = load(ROOT, "engine.json")
    faults = load(ROOT, "faults.json")["faults"]
    engine = engine_standin_argv(ROOT, c, cfg, faults)
    if engine is None:
        sys.stderr.write(f"{tool}: [sim] nothing in the lab stands in for this command line\n")
        return 2
    if "sparkfleet.simengine" in engine:
        # the engine's own faults only: a rank-vanish is docker's to do (rm -f), on a running rank (sim-fault)
        engine += [a for k in rank_faults_due(ROOT, tuple(RANK_SIGNALS)) for a in ("--fault", k)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHOME"}
    if engine[0] == cfg["python"]:  # a stand-in of sparkfleet's own; vLLM itself (shim.engine) needs none of it
        env["PYTHONPATH"] = cfg["package_root"]
    env["PYTHONUNBUFFERED"] = "1"
    os.execve(engine[0], engine, env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
