"""The node's stand-in for NVIDIA's container runtime (`nvidia` in dockerd's runtimes, the default, as on a
DGX) and for its prestart hook: what a lane container gets from the GPU stack, without a GPU.

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.

`sim-nvidia-runtime` is an OCI runtime wrapper, as nvidia-container-runtime is (NVIDIA/nvidia-container-toolkit
cmd/nvidia-container-runtime: it edits the bundle's config.json on `create`, then execs runc with the same
arguments). Where NVIDIA's injects the driver's libraries and tools into the container (nvidia-container-cli
`configure`: read-only binds of the host's driver files), this one binds read-only what the sim's engine
stand-ins run on (the node's /usr, with its nvidia-smi, and the Python of the sim engine) and read-write the
node's sim state (the "GPU" the stand-ins read and mark busy). It also lowers each rlimit the launch asks for
to what this machine can grant: here the capability bounding set lacks CAP_SYS_RESOURCE even for root, so
runc would fail `--ulimit memlock=-1` ("error setting rlimit type 8: operation not permitted"). `docker
inspect` still shows what the lane asked for: only the runtime's copy of the spec is changed. A `docker exec`
process gets the container's rlimits, so its `runc exec --process` spec is lowered the same way.

`nvidia-container-runtime-hook` must be on dockerd's PATH for `--gpus` to mean anything (moby
daemon/nvidia_linux.go registers its "nvidia" device driver only when it finds that binary, and adds it as a
prestart hook `nvidia-container-runtime-hook prestart`). The real hook reads the container's state on stdin
and runs nvidia-container-cli; this one reads it and succeeds: the runtime above did the injecting.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

from .render import bound_source
from .state import STATE, load

RUNC = "/usr/sbin/runc"
# runc's global options that take a value (runc main.go: --root, --log, --log-format, --criu, --rootless)
RUNC_VALUE_OPTS = {"--root", "--log", "--log-format", "--criu", "--rootless"}
SYSTEM_DIRS = ("/usr",)  # the image holds /bin, /lib, /sbin as links into /usr (merged /usr, as Debian 12)
RLIMITS = {"RLIMIT_MEMLOCK": resource.RLIMIT_MEMLOCK, "RLIMIT_STACK": resource.RLIMIT_STACK,
           "RLIMIT_NOFILE": resource.RLIMIT_NOFILE, "RLIMIT_NPROC": resource.RLIMIT_NPROC,
           "RLIMIT_CORE": resource.RLIMIT_CORE, "RLIMIT_AS": resource.RLIMIT_AS}
PROC_FILES = ("/proc/meminfo", "/proc/uptime")  # the node's own, of render.BOUND_FILES
INFINITY = 2**64 - 1  # the OCI spec's "unlimited" (Go's uint64 max)


def _bundle(argv: list[str]) -> tuple[str | None, Path]:
    """(subcommand, bundle dir) of a runc command line."""
    i, sub = 0, None
    while i < len(argv):
        a = argv[i]
        if sub is None:
            if a in RUNC_VALUE_OPTS:
                i += 2
                continue
            if not a.startswith("-"):
                sub = a
        elif a in ("--bundle", "-b") and i + 1 < len(argv):
            return sub, Path(argv[i + 1])
        elif a.startswith("--bundle="):
            return sub, Path(a.split("=", 1)[1])
        i += 1
    return sub, Path.cwd()


def clamp_rlimits(rlimits: list[dict]) -> list[dict]:
    """Each requested rlimit lowered to this process's hard limit where the request is above it."""
    out = []
    for r in rlimits:
        res = RLIMITS.get(r.get("type", ""))
        if res is None:
            out.append(r)
            continue
        _soft, hard = resource.getrlimit(res)
        cap = INFINITY if hard == resource.RLIM_INFINITY else hard
        out.append({**r, "hard": min(int(r["hard"]), cap), "soft": min(int(r["soft"]), cap)})
    return out


def _ro(src: str, dst: str) -> dict:
    return {"destination": dst, "type": "bind", "source": src, "options": ["rbind", "ro", "nosuid"]}


def inject(spec: dict, root: Path) -> dict:
    """The bundle's OCI spec as the sim's GPU stack hands it to runc (see the module's docstring)."""
    cfg = load(root, "engine.json")
    proc = spec.setdefault("process", {})
    proc["rlimits"] = clamp_rlimits(proc.get("rlimits") or [])
    have = {m.get("destination") for m in spec.get("mounts") or []}
    mounts = [_ro(d, d) for d in SYSTEM_DIRS if d not in have]
    for d in cfg.get("python_roots") or []:
        if d not in have and os.path.isdir(d):
            mounts.append(_ro(d, d))
    state = "/" + STATE
    mounts.append({"destination": state, "type": "bind", "source": str(root / STATE),
                   "options": ["rbind", "rw", "nosuid"]})
    # A container's /proc shows its host's memory and uptime: here the node's, which the sim renders into the
    # node's bound files (runc allows these /proc binds, as lxcfs uses them), not this machine's.
    for p in PROC_FILES:
        src = bound_source(root, p)
        if p not in have and src.is_file():
            mounts.append(_ro(str(src), p))
    spec["mounts"] = list(spec.get("mounts") or []) + mounts
    return spec


def _process_file(argv: list[str]) -> Path | None:
    """The process spec file of `runc exec --process FILE` (how containerd hands runc a `docker exec`)."""
    for i, a in enumerate(argv):
        if a in ("--process", "-p") and i + 1 < len(argv):
            return Path(argv[i + 1])
        if a.startswith("--process="):
            return Path(a.split("=", 1)[1])
    return None


def lower_exec(argv: list[str]) -> None:
    """`runc exec --process FILE ...` (a `docker exec`): the process's rlimits, the container's, lowered as
    on create (clamp_rlimits), in that file."""
    path = _process_file(argv)
    if path is not None and path.is_file():
        proc = json.loads(path.read_text())
        proc["rlimits"] = clamp_rlimits(proc.get("rlimits") or [])
        path.write_text(json.dumps(proc))


def sim_nvidia_runtime(argv: list[str], root: Path) -> int:
    sub, bundle = _bundle(argv)
    if sub in ("create", "run"):
        path = bundle / "config.json"
        spec = json.loads(path.read_text())
        path.write_text(json.dumps(inject(spec, root)))
    elif sub == "exec":
        lower_exec(argv)
    os.execv(RUNC, [RUNC, *argv])
    return 127  # not reached


def nvidia_container_runtime_hook(argv: list[str], root: Path) -> int:
    """`nvidia-container-runtime-hook prestart`: read the container state runc sends; nothing to configure."""
    if argv[:1] == ["prestart"]:
        json.loads(sys.stdin.read() or "{}")
    return 0
