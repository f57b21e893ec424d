"""`nvidia-smi` and `sim-gpu-load`: the GPUs a GB10/GB300 node would have, from its state and faults.

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .state import STATE, ShimError, load, locked, save

# field -> (header name, unit). `clocks.sm` and the old `clocks_throttle_reasons.*` are aliases (REFERENCE §4).
QUERY_FIELDS: dict[str, tuple[str, str | None]] = {
    "index": ("index", None), "name": ("name", None), "uuid": ("uuid", None), "pstate": ("pstate", None),
    "count": ("count", None), "driver_version": ("driver_version", None),
    "clocks.sm": ("clocks.current.sm", "MHz"), "clocks.current.sm": ("clocks.current.sm", "MHz"),
    "clocks.max.sm": ("clocks.max.sm", "MHz"), "clocks.max.graphics": ("clocks.max.graphics", "MHz"),
    "clocks_event_reasons.active": ("clocks_event_reasons.active", None),
    "clocks_throttle_reasons.active": ("clocks_event_reasons.active", None),
    "clocks_event_reasons.gpu_idle": ("clocks_event_reasons.gpu_idle", None),
    "clocks_throttle_reasons.gpu_idle": ("clocks_event_reasons.gpu_idle", None),
    "power.draw": ("power.draw", "W"), "power.limit": ("power.limit", "W"),
    "memory.total": ("memory.total", "MiB"), "memory.used": ("memory.used", "MiB"),
    "memory.free": ("memory.free", "MiB"), "utilization.gpu": ("utilization.gpu", "%"),
    "temperature.gpu": ("temperature.gpu", None),
}


NA = "[N/A]"


def driver_version(gpu: dict, faults: dict) -> str:
    """The driver nvidia-smi reports: the node's, or the driver-drift fault's."""
    return str(faults["driver-drift"]["driver"]) if "driver-drift" in faults else gpu["driver"]


def gpu_readings(root: Path, now: float | None = None) -> list[dict[str, Any]]:
    """What each GPU reads now: idle clocks with reason GpuIdle, or (under sim-gpu-load) load clocks."""
    gpu = load(root, "gpu.json")
    faults = load(root, "faults.json")["faults"]
    busy = gpu.get("busy_until", 0) > (time.time() if now is None else now)
    out = []
    for g in gpu["gpus"]:
        sm = g["load_sm_mhz"] if busy else g["idle_sm_mhz"]
        if busy and "clock-latch" in faults:
            sm = int(faults["clock-latch"]["mhz"])  # latched: low clock, and no reason says why (FM-09)
        power = g["idle_power_w"]
        if busy:
            power = g["idle_power_w"] + (g["load_power_w"] - g["idle_power_w"]) * sm / g["max_sm_mhz"]
        total, used = g["memory_total_mib"], g["memory_used_mib"]
        out.append({
            "index": g["index"], "name": g["name"], "uuid": g["uuid"], "pstate": g["pstate"],
            "count": len(gpu["gpus"]), "driver_version": driver_version(gpu, faults),
            "clocks.current.sm": sm, "clocks.max.sm": g["max_sm_mhz"], "clocks.max.graphics": g["max_sm_mhz"],
            "clocks_event_reasons.active": f"0x{0 if busy else 1:016x}",
            "clocks_event_reasons.gpu_idle": "Not Active" if busy else "Active",
            "power.draw": f"{power:.2f}", "power.limit": NA,
            "memory.total": NA if total is None else total, "memory.used": NA if used is None else used,
            "memory.free": NA if total is None else total - used,
            "utilization.gpu": 100 if busy else 0, "temperature.gpu": 71 if busy else 38,
        })
    return out


def nvidia_smi(argv: list[str], root: Path) -> int:
    query: str | None = None
    fmt: str | None = None
    list_gpus = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, _, value = arg.partition("=")
        if key in ("--query-gpu", "--format", "-i", "--id") and not value:
            if i + 1 >= len(argv):
                raise ShimError(f"Option {key} requires a value.\n\nPlease run 'nvidia-smi -h' for help.", 2)
            value = argv[i + 1]
            i += 1
        if key == "--query-gpu":
            query = value
        elif key == "--format":
            fmt = value
        elif key in ("-i", "--id"):
            pass  # one GPU per node: every id selects it
        elif arg in ("-L", "--list-gpus"):
            list_gpus = True
        else:
            # clock locks, power limits, persistence and resets are not simulated (and never run by sparkfleet)
            raise ShimError(f"[sim] nvidia-smi: {arg!r} is not supported by the sparkfleet simulation "
                            "(supported: --query-gpu=... --format=csv[,noheader][,nounits], -L)", 2)
        i += 1
    gpus = gpu_readings(root)
    if list_gpus:
        for g in gpus:
            print(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        return 0
    if query is None:
        print(banner(root, gpus))
        return 0
    opts = (fmt or "").split(",")
    if "csv" not in opts:
        raise ShimError('"--format" must be specified with "--query-gpu": --format=csv[,noheader][,nounits]', 2)
    fields = [f.strip() for f in query.split(",") if f.strip()]
    for f in fields:
        if f not in QUERY_FIELDS:
            raise ShimError(f'Field "{f}" is not a valid field to query.', 2)
    if "noheader" not in opts:
        print(", ".join(QUERY_FIELDS[f][0] + (f" [{QUERY_FIELDS[f][1]}]" if QUERY_FIELDS[f][1] else "")
                        for f in fields))
    for g in gpus:
        cells = []
        for f in fields:
            header, unit = QUERY_FIELDS[f]
            value = str(g[header])
            if unit and "nounits" not in opts and value != NA:
                value += f" {unit}"
            cells.append(value)
        print(", ".join(cells))
    return 0


def banner(root: Path, gpus: list[dict]) -> str:
    node = load(root, "node.json")
    gpu = dict(load(root, "gpu.json"))
    gpu["driver"] = driver_version(gpu, load(root, "faults.json")["faults"])
    width = 89
    lines = [
        f"[sim] SPARKFLEET SIMULATION - node {node['node']}: no real GPU; readings come from "
        f"{root / STATE / 'gpu.json'}",
        "+" + "-" * (width - 2) + "+",
        "| " + f"NVIDIA-SMI {gpu['driver']} (sparkfleet sim)   Driver Version: {gpu['driver']}   "
        f"CUDA Version: {gpu['cuda']}".ljust(width - 4) + " |",
        "+" + "-" * (width - 2) + "+",
        "| " + "GPU  Name                 Pstate   SM MHz / max   Power     Memory-Usage".ljust(width - 4) + " |",
        "|" + "=" * (width - 2) + "|",
    ]
    for g in gpus:
        mem = "Not Supported" if g["memory.total"] == NA else f"{g['memory.used']}MiB / {g['memory.total']}MiB"
        row = (f"{g['index']:>3}  {g['name']:<20} {g['pstate']:<8} {g['clocks.current.sm']:>6} / "
               f"{g['clocks.max.sm']:<6} {g['power.draw']:>7}W  {mem}")
        lines.append("| " + row.ljust(width - 4) + " |")
    lines.append("+" + "-" * (width - 2) + "+")
    return "\n".join(lines)


def _mark_busy(root: Path, until: float, only_if: float | None = None) -> None:
    with locked(root):
        gpu = load(root, "gpu.json")
        if only_if is None or gpu.get("busy_until") == only_if:
            gpu["busy_until"] = until
            save(root, "gpu.json", gpu)


def step_times(root: Path, seconds: float) -> dict[str, Any]:
    """Simulated step timings, in the probe's `{"step_ms": ...}` shape: the slow-state fault makes the steps
    after an idle pause slower than back-to-back ones (FM-10); a latched clock makes every step slower."""
    gpu = load(root, "gpu.json")
    faults = load(root, "faults.json")["faults"]
    g = gpu["gpus"][0]
    step = gpu["step_ms"]
    if "clock-latch" in faults:
        step = step * g["max_sm_mhz"] / int(faults["clock-latch"]["mhz"])
    after = gpu["slow_after_idle_ms"] if "slow-state" in faults else step
    count = max(1, min(50, int(seconds * 1000 / step)))
    return {"after_idle": [round(after, 3)] * 5, "back_to_back": [round(step, 3)] * count, "pause_s": 0.0}


def sim_gpu_load(argv: list[str], root: Path) -> int:
    """`sim-gpu-load [--no-wait] SECONDS`: the GPU reads as busy (load clocks) for SECONDS.

    Like a real load it runs for SECONDS (so a probe samples clocks while it runs) and then prints its step
    timings as one JSON line; --no-wait only marks the GPU busy and returns; 0 makes the GPU idle at once.
    """
    wait = "--no-wait" not in argv
    args = [a for a in argv if a != "--no-wait"]
    if len(args) != 1:
        raise ShimError("usage: sim-gpu-load [--no-wait] SECONDS   (0 ends the simulated load)", 2)
    try:
        seconds = float(args[0])
    except ValueError:
        raise ShimError(f"sim-gpu-load: {args[0]!r} is not a number of seconds", 2) from None
    if not 0 <= seconds < 86400:
        raise ShimError("sim-gpu-load: SECONDS must be between 0 and 86400", 2)
    node = load(root, "node.json")["node"]
    until = round(time.time() + seconds, 3) if seconds else 0
    _mark_busy(root, until)
    if not seconds:
        print(f"[sim] {node}: GPU idle")
        return 0
    if not wait:
        print(f"[sim] {node}: GPU under simulated load for {seconds:g} s")
        return 0
    sys.stderr.write(f"[sim] {node}: GPU under simulated load for {seconds:g} s\n")

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        time.sleep(seconds)
    except (SystemExit, KeyboardInterrupt):
        _mark_busy(root, 0, only_if=until)  # a killed load stops loading the GPU
        raise
    print(json.dumps({"step_ms": step_times(root, seconds)}))
    return 0
