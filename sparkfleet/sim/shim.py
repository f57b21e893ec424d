#!/usr/bin/python3
"""The simulated lab's stand-ins for `nvidia-smi`, `docker`, `ibdev2netdev`, `sim-gpu-load`, `earlyoom`
and the node's init.

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.

One stdlib-only file, bound into every node at /usr/local/bin under each tool's name; it dispatches on
the name it runs as. Inside a node its root R is `/` and the node's state is R/var/lib/sparkfleet-sim
(STATE); it re-renders the files the node shows (`render`: /proc/meminfo, /etc/mtab, /sys/class/...)
after anything that changes them. The sim controller (`sparkfleet.sim`) imports this module and calls
the same functions with R = the node's tree on this machine, so the shims and the controller never
disagree. Output shapes follow docs/sim-layout.md.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import ipaddress
import json
import os
import posixpath
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fractions import Fraction

STATE = "var/lib/sparkfleet-sim"  # the node's sim state, like /var/lib/docker for dockerd
LABEL_PREFIX = "sparkfleet."  # containers sparkfleet launched carry labels under this prefix
ENGINE_STOP_WAIT_S = 10.0  # docker stop's default grace before SIGKILL
ZERO_TIME = "0001-01-01T00:00:00Z"
DAEMON_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


class ShimError(Exception):
    """A failure the shim reports as the real tool would: a message on stderr and an exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


# -- the sandbox and its state ---------------------------------------------------------------


def sandbox_root() -> Path:
    """R, the node's root: `/` inside a simulated node (where the node's state sits at /var/lib/sparkfleet-sim).

    The controller side (sparkfleet.sim) calls the same functions with R = the node's directory on the host.
    """
    root = Path("/")
    if not (root / STATE / "node.json").is_file():
        raise ShimError("sparkfleet sim: this shim runs only inside a simulated node (no /" + STATE + ")", 127)
    return root


def load(root: Path, name: str) -> Any:
    return json.loads((root / STATE / name).read_text())


def dumps(data: Any) -> str:
    """The one serialisation of state files, so equal state is byte-identical state."""
    return json.dumps(data, indent=2) + "\n"


def write_bytes(path: Path, data: bytes, known_dirs: set[Path] | None = None) -> None:
    """Replace a file atomically (a concurrent reader sees the old or the new content, never half)."""
    if known_dirs is None or path.parent not in known_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        if known_dirs is not None:
            known_dirs.update([path.parent, *path.parent.parents])
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_in_place(path: Path, data: bytes) -> None:
    """Rewrite a file keeping its inode: files bind-mounted into the node (/proc/meminfo) must keep theirs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)  # one write; the same length as before for meminfo's fixed-width lines
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def save(root: Path, name: str, data: Any) -> None:
    write_bytes(root / STATE / name, dumps(data).encode())


@contextlib.contextmanager
def locked(root: Path):
    """Serialise state changes on one node (shims and the controller may run at the same time)."""
    with open(root / STATE / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def rfc3339(t: float) -> str:
    """Docker's timestamp format (nanoseconds, UTC, Z)."""
    d = _dt.datetime.fromtimestamp(t, tz=_dt.UTC)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond:06d}000Z"


def parse_time(s: str) -> float | None:
    if not s or s.startswith("0001-"):
        return None
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z$", s)
    if not m:
        return None
    base = _dt.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=_dt.UTC)
    return base.timestamp() + float("0." + (m.group(2) or "0"))


# -- rendering proc/ and sys/ from state --------------------------------------------------------


def _kb_line(key: str, kb: int) -> str:
    return f"{key + ':':<16}{kb:>8} kB"  # the kernel's show_val_kb layout


def render_meminfo(node: dict, faults: dict) -> str:
    mem = node["meminfo"]
    total, avail, swap = mem["total_kb"], mem["available_kb"], mem["swap_kb"]
    if "low-memory" in faults:
        avail = int(faults["low-memory"]["available_kb"])
    used = total - avail
    cached = min(mem["cached_kb"], avail)
    buffers = min(mem["buffers_kb"], avail - cached)
    rows = [
        ("MemTotal", total), ("MemFree", avail - cached - buffers), ("MemAvailable", avail),
        ("Buffers", buffers), ("Cached", cached), ("SwapCached", 0),
        ("Active", used // 2 + cached // 2), ("Inactive", used // 4 + cached // 2),
        ("SwapTotal", swap), ("SwapFree", swap), ("Dirty", 0), ("Writeback", 0),
        ("AnonPages", used * 8 // 10), ("Mapped", cached // 4), ("Shmem", 0),
        ("Slab", used // 10), ("SReclaimable", used // 20), ("SUnreclaim", used // 20),
        ("CommitLimit", total // 2 + swap), ("Committed_AS", used),
    ]
    return "".join(_kb_line(k, v) + "\n" for k, v in rows)


def mount_rows(node: dict, faults: dict) -> list[list[str]]:
    rows = [list(r) for r in node["mounts"]]
    if "cifs-model" in faults:
        # the model root comes from an SMB share instead of local NVMe / the head's NFS export (FM-44)
        target = node["storage"]["model_root"]
        rows = [r for r in rows if r[1] != target]
        rows.append([node["cifs"]["source"], target, "cifs", node["cifs"]["options"]])
    return rows


def gid_entries(port: dict, faults: dict) -> list[tuple[str, str]]:
    """(gid, type) per populated index. Healthy: link-local v1/v2 at 0/1, the IPv4 entry v1/v2 at 2/3."""
    lladdr = ipaddress.IPv6Address(port["link_local"]).exploded
    entries = [(lladdr, "IB/RoCE v1"), (lladdr, "RoCE v2")]
    if port.get("ipv4"):
        if "wrong-gid" in faults and port.get("ipv6_global"):
            # a global IPv6 address added before the IPv4 one takes 2/3; the RoCE v2 IPv4 entry lands at 5
            g6 = ipaddress.IPv6Address(port["ipv6_global"]).exploded
            entries += [(g6, "IB/RoCE v1"), (g6, "RoCE v2")]
        g4 = ipaddress.IPv6Address("::ffff:" + port["ipv4"]).exploded
        entries += [(g4, "IB/RoCE v1"), (g4, "RoCE v2")]
    return entries


# Files the node shows at these node paths come from the sim (bind-mounted over the real ones when the node
# starts, so they are rewritten in place, never replaced): node path -> file under R/STATE/node/.
BOUND_FILES = ("/proc/meminfo", "/proc/uptime", "/etc/hostname", "/etc/mtab", "/etc/default/earlyoom")


def bound_source(root: Path, node_path: str) -> Path:
    """Where the sim keeps the file it binds at `node_path` (one of BOUND_FILES)."""
    return root / STATE / "node" / node_path.lstrip("/")


def desired_tree(root: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(bound files: node path -> content, tree files under R/sys: relative path -> content), from state."""
    node = load(root, "node.json")
    faults = load(root, "faults.json")["faults"]
    bound = {
        "/etc/hostname": node["hostname"] + "\n",
        "/etc/default/earlyoom": ("# Default settings for earlyoom. This file is sourced by /bin/sh from\n"
                                  "# /etc/init.d/earlyoom or by systemd from /etc/systemd/system/earlyoom.service.\n"
                                  "\n# Options to pass to earlyoom\n"
                                  f"EARLYOOM_ARGS=\"{node['earlyoom']['default_args']}\"\n"),
        "/proc/meminfo": render_meminfo(node, faults),
        "/proc/uptime": node["uptime"] + "\n",
        # what getmntent(3) reads: the lab's filesystems (NFS, XFS, CIFS cannot be mounted here)
        "/etc/mtab": "".join(" ".join(r) + " 0 0\n" for r in mount_rows(node, faults)),
    }
    files: dict[str, str] = {}
    size = node["sim"]["gid_table_size"]
    for port in node["rdma"]:
        base = f"sys/class/infiniband/{port['hca']}/ports/{port['port']}"
        files[f"{base}/state"] = port["state"] + "\n"
        files[f"{base}/phys_state"] = ("5: LinkUp" if "ACTIVE" in port["state"] else "3: Disabled") + "\n"
        files[f"{base}/link_layer"] = "Ethernet\n"
        files[f"{base}/rate"] = port["rate"] + "\n"
        entries = gid_entries(port, faults)
        for i in range(size):
            if i < len(entries):
                gid, kind = entries[i]
                files[f"{base}/gids/{i}"] = gid + "\n"
                files[f"{base}/gid_attrs/types/{i}"] = kind + "\n"
                files[f"{base}/gid_attrs/ndevs/{i}"] = port["netdev"] + "\n"
            else:
                files[f"{base}/gids/{i}"] = "0000:0000:0000:0000:0000:0000:0000:0000\n"
        net = f"sys/class/net/{port['netdev']}"
        files[f"{net}/operstate"] = ("up" if "ACTIVE" in port["state"] else "down") + "\n"
        files[f"{net}/address"] = port["mac"] + "\n"
        files[f"{net}/mtu"] = f"{port_mtu(port, faults)}\n"
    return {k: v.encode() for k, v in bound.items()}, {k: v.encode() for k, v in files.items()}


def port_mtu(port: dict, faults: dict) -> int:
    """The netdev's MTU: the lab's, or the mtu-mismatch fault's on the fabric port."""
    if "mtu-mismatch" in faults and port.get("ipv4"):
        return int(faults["mtu-mismatch"]["mtu"])
    return int(port.get("mtu", 9000))


MANAGED_TREES = ("sys",)  # owned by render(): anything there that state does not call for goes


def render(root: Path) -> None:
    """Make the node's bound files and R/sys match the state files exactly (idempotent)."""
    bound, files = desired_tree(root)
    for node_path, data in bound.items():
        path = bound_source(root, node_path)
        try:
            if path.read_bytes() == data:
                continue
        except OSError:
            pass
        write_in_place(path, data)
    known_dirs: set[Path] = set()  # directories made or seen, so each is created once per render
    for rel, data in files.items():
        path = root / rel
        try:
            if path.read_bytes() == data:
                continue
        except OSError:
            pass
        write_bytes(path, data, known_dirs)
    wanted = set(files)
    wanted_dirs = {str(Path(w).parent) for w in wanted}
    wanted_dirs |= {str(p) for w in list(wanted_dirs) for p in Path(w).parents}
    for tree in MANAGED_TREES:
        top = root / tree
        if not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top, topdown=False):
            d = Path(dirpath)
            for name in filenames + [n for n in dirnames if (d / n).is_symlink()]:
                rel = str((d / name).relative_to(root))
                if rel not in wanted:
                    (d / name).unlink()
            rel_dir = str(d.relative_to(root))
            if rel_dir not in wanted_dirs and rel_dir != tree and not any(d.iterdir()):
                d.rmdir()


# -- nvidia-smi -------------------------------------------------------------------------------

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


# -- ibdev2netdev -----------------------------------------------------------------------------


def ibdev2netdev(argv: list[str], root: Path) -> int:
    node = load(root, "node.json")
    for port in node["rdma"]:
        up = "Up" if "ACTIVE" in port["state"] else "Down"
        print(f"{port['hca']} port {port['port']} ==> {port['netdev']} ({up})")
    return 0


# -- docker -----------------------------------------------------------------------------------

# `docker run` options that take a value; every other option is a boolean (docker/cli's run flags).
RUN_VALUE_FLAGS = {
    "-a", "--attach", "--add-host", "--annotation", "--blkio-weight", "--blkio-weight-device", "--cap-add",
    "--cap-drop", "--cgroup-parent", "--cgroupns", "--cidfile", "-c", "--cpu-shares", "--cpu-period",
    "--cpu-quota", "--cpu-rt-period", "--cpu-rt-runtime", "--cpus", "--cpuset-cpus", "--cpuset-mems",
    "--detach-keys", "--device", "--device-cgroup-rule", "--device-read-bps", "--device-read-iops",
    "--device-write-bps", "--device-write-iops", "--dns", "--dns-option", "--dns-search", "--domainname",
    "--entrypoint", "-e", "--env", "--env-file", "--expose", "--gpus", "--group-add", "--health-cmd",
    "--health-interval", "--health-retries", "--health-start-interval", "--health-start-period",
    "--health-timeout", "-h", "--hostname", "--ip", "--ip6", "--ipc", "--isolation", "--kernel-memory",
    "-l", "--label", "--label-file", "--link", "--link-local-ip", "--log-driver", "--log-opt",
    "--mac-address", "-m", "--memory", "--memory-reservation", "--memory-swap", "--memory-swappiness",
    "--mount", "--name", "--network", "--net", "--network-alias", "--net-alias", "--oom-score-adj", "--pid",
    "--pids-limit", "--platform", "-p", "--publish", "--pull", "--restart", "--runtime", "--security-opt",
    "--shm-size", "--stop-signal", "--stop-timeout", "--storage-opt", "--sysctl", "--tmpfs", "--ulimit",
    "-u", "--user", "--userns", "--uts", "-v", "--volume", "--volume-driver", "--volumes-from", "-w",
    "--workdir",
}
RUN_BOOL_FLAGS = {
    "-d", "--detach", "-i", "--interactive", "-t", "--tty", "--rm", "--privileged", "--init", "--read-only",
    "-P", "--publish-all", "--oom-kill-disable", "--no-healthcheck", "-q", "--quiet", "--sig-proxy",
    "--disable-content-trust", "--use-api-socket",
}


def _docker_ready(root: Path) -> dict:
    docker = load(root, "docker.json")
    if docker.get("daemon") != "up":
        raise ShimError(DAEMON_DOWN, 1)
    return docker


def _short(image_or_container_id: str) -> str:
    return image_or_container_id.split(":", 1)[-1][:12]


def _find_container(docker: dict, ref: str) -> dict | None:
    for c in docker["containers"]:
        if c["Name"] == "/" + ref.lstrip("/") or c["Id"] == ref:
            return c
    matches = [c for c in docker["containers"] if len(ref) >= 1 and c["Id"].startswith(ref)]
    return matches[0] if len(matches) == 1 else None


def _find_image(docker: dict, ref: str) -> dict | None:
    if "@" in ref:  # repo[:tag]@sha256:...: the digest decides
        repo, digest = ref.split("@", 1)
        repo = repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo
        for img in docker["images"]:
            if f"{repo}@{digest}" in img["RepoDigests"]:
                return img
        return None
    tagged = ref if ":" in ref.rsplit("/", 1)[-1] else ref + ":latest"
    for img in docker["images"]:
        if tagged in img["RepoTags"] or img["Id"] == ref or img["Id"] == "sha256:" + ref:
            return img
    bare = ref.removeprefix("sha256:")
    matches = [i for i in docker["images"] if len(bare) >= 4 and i["Id"].removeprefix("sha256:").startswith(bare)]
    return matches[0] if len(matches) == 1 else None


def human_duration(seconds: float) -> str:
    """Docker's units.HumanDuration, as `docker ps` shows ages."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    m = s // 60
    if m == 1:
        return "About a minute"
    if m < 60:
        return f"{m} minutes"
    h = round(s / 3600)
    if h == 1:
        return "About an hour"
    if h < 48:
        return f"{h} hours"
    if h < 24 * 7 * 2:
        return f"{h // 24} days"
    return f"{h // (24 * 7)} weeks"


def _status(c: dict, now: float) -> str:
    st = c["State"]
    if st["Running"]:
        return "Up " + human_duration(now - (parse_time(st["StartedAt"]) or now))
    if st["Status"] == "created":
        return "Created"
    ago = human_duration(now - (parse_time(st["FinishedAt"]) or now))
    return f"Exited ({st['ExitCode']}) {ago} ago"


def _ports(c: dict) -> str:
    out = []
    for cport, binds in sorted((c["NetworkSettings"].get("Ports") or {}).items()):
        for b in binds or []:
            host = "[::]" if b["HostIp"] == "::" else b["HostIp"]
            out.append(f"{host}:{b['HostPort']}->{cport}")
    return ", ".join(out)


def go_repr(value: Any) -> str:
    """How Go's text/template prints a value (maps sorted, as Go does)."""
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_repr(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_repr(v) for v in value) + "]"
    return str(value)


def _lookup(data: Any, path: str) -> Any:
    if path in ("", "."):
        return data
    for part in path.lstrip(".").split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def go_template(template: str, data: Any) -> str:
    """The subset of Go templates scripts use with docker: {{.A.B}}, {{json .A}}, {{index .A "k"}}."""
    def action(m: re.Match) -> str:
        expr = m.group(1).strip()
        parts = re.findall(r'"[^"]*"|\S+', expr)
        if len(parts) == 1 and parts[0].startswith("."):
            return go_repr(_lookup(data, parts[0]))
        if len(parts) == 2 and parts[0] == "json" and parts[1].startswith("."):
            return json.dumps(_lookup(data, parts[1]), separators=(",", ":"))
        if len(parts) == 3 and parts[0] == "index" and parts[2].startswith('"'):
            return go_repr((_lookup(data, parts[1]) or {}).get(parts[2].strip('"')))
        if len(parts) == 2 and parts[0] == ".Label" and parts[1].startswith('"'):
            labels = data.get("Labels") or ""
            if isinstance(labels, str):  # docker ps rows: the CLI's "k=v,k2=v2" string
                labels = dict(kv.partition("=")[::2] for kv in labels.split(",") if kv)
            return go_repr(labels.get(parts[1].strip('"'), ""))
        raise ShimError(f"template parsing error: [sim] unsupported action {{{{{expr}}}}}", 1)
    text = template.replace("\\t", "\t").replace("\\n", "\n")
    return re.sub(r"\{\{(.*?)\}\}", action, text)


def _ps_row(c: dict, now: float, no_trunc: bool) -> dict:
    labels = c["Config"].get("Labels") or {}
    argv = (c["Config"].get("Entrypoint") or []) + (c["Config"].get("Cmd") or [])
    command = " ".join(argv)
    if not no_trunc and len(command) > 20:
        command = command[:19] + "…"
    return {
        "ID": c["Id"] if no_trunc else c["Id"][:12], "Names": c["Name"].lstrip("/"), "Image": c["Config"]["Image"],
        "Command": f'"{command}"', "Status": _status(c, now), "State": c["State"]["Status"], "Ports": _ports(c),
        "Labels": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        "CreatedAt": created_at(parse_time(c["Created"]) or now),
        "RunningFor": human_duration(now - (parse_time(c["Created"]) or now)) + " ago",
        "Mounts": ",".join((b.split(":")[0].rstrip("/").rsplit("/", 1)[-1])[:20]
                           for b in c["HostConfig"].get("Binds") or []),
        "Networks": c["HostConfig"].get("NetworkMode") or "bridge", "LocalVolumes": "0", "Size": "0B",
    }


def created_at(t: float) -> str:
    """`docker ps`'s CreatedAt: Go's time.Time String() in the daemon's local zone (UTC on the sim's nodes)."""
    return _dt.datetime.fromtimestamp(t, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S +0000 UTC")


def _filters_match(c: dict, filters: list[str]) -> bool:
    labels = c["Config"].get("Labels") or {}
    for f in filters:
        key, _, value = f.partition("=")
        if key == "label":
            k, eq, v = value.partition("=")
            if k not in labels or (eq and labels[k] != v):
                return False
        elif key == "name":
            if not re.search(value, c["Name"].lstrip("/")):
                return False
        elif key == "status":
            if c["State"]["Status"] != value:
                return False
        elif key == "id":
            if not c["Id"].startswith(value):
                return False
        elif key == "ancestor":
            if c["Config"]["Image"] != value and c["Image"] != value:
                return False
        else:
            raise ShimError(f"Error response from daemon: invalid filter '{key}'", 1)
    return True


def _opts(argv: list[str], value_flags: set[str], bool_flags: set[str],
          interspersed: bool = True) -> tuple[dict[str, list[str]], list[str]]:
    """Split `argv` into options (flag -> values) and positionals, as docker's flag parser does; with
    interspersed=False (run) everything from the first positional on (IMAGE COMMAND...) is positional."""
    opts: dict[str, list[str]] = {}
    pos: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or (pos and not interspersed):
            pos += argv[i + 1:] if arg == "--" else argv[i:]
            break
        if arg.startswith("-") and arg != "-":
            key, eq, value = arg.partition("=")
            if key in value_flags:
                if not eq:
                    if i + 1 >= len(argv):
                        raise ShimError(f"flag needs an argument: {key}", 125)
                    value = argv[i + 1]
                    i += 1
                opts.setdefault(key, []).append(value)
            elif key in bool_flags:
                opts.setdefault(key, []).append(value or "true")
            elif not arg.startswith("--") and all(f"-{ch}" in bool_flags for ch in arg[1:]):
                for ch in arg[1:]:  # combined short booleans: -it, -dit
                    opts.setdefault(f"-{ch}", []).append("true")
            else:
                raise ShimError(f"unknown flag: {key}\nSee 'docker --help'.", 125)
        else:
            pos.append(arg)
        i += 1
    return opts, pos


def _get(opts: dict[str, list[str]], *names: str) -> list[str]:
    return [v for n in names for v in opts.get(n, [])]


def _flag(opts: dict[str, list[str]], *names: str) -> bool:
    vals = _get(opts, *names)
    return bool(vals) and vals[-1] not in ("false", "0")


def docker_ps(argv: list[str], root: Path) -> int:
    opts, pos = _opts(argv, {"-f", "--filter", "--format", "-n", "--last"},
                      {"-a", "--all", "-q", "--quiet", "--no-trunc", "-s", "--size", "-l", "--latest"})
    if pos:
        raise ShimError(f'"docker ps" accepts no arguments.\nSee \'docker ps --help\'.\n\nUsage:  docker ps '
                        f"[OPTIONS]\n\nList containers (got {pos[0]!r})", 1)
    docker = _refreshed(root)
    now = time.time()
    everyone = _flag(opts, "-a", "--all")
    rows = [c for c in reversed(docker["containers"])  # newest first, like docker
            if (everyone or c["State"]["Running"]) and _filters_match(c, _get(opts, "-f", "--filter"))]
    no_trunc = _flag(opts, "--no-trunc")
    if _flag(opts, "-q", "--quiet"):
        for c in rows:
            print(c["Id"] if no_trunc else c["Id"][:12])
        return 0
    fmt = _get(opts, "--format")
    if fmt:
        for c in rows:
            print(go_template(fmt[-1], _ps_row(c, now, no_trunc)))
        return 0
    table = [["CONTAINER ID", "IMAGE", "COMMAND", "CREATED", "STATUS", "PORTS", "NAMES"]]
    for c in rows:
        r = _ps_row(c, now, no_trunc)
        table.append([r["ID"], r["Image"], r["Command"], r["RunningFor"], r["Status"], r["Ports"], r["Names"]])
    _print_table(table)
    return 0


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


def docker_images(argv: list[str], root: Path) -> int:
    opts, pos = _opts(argv, {"-f", "--filter", "--format"}, {"-a", "--all", "-q", "--quiet", "--no-trunc",
                                                            "--digests"})
    docker = _docker_ready(root)
    images = list(docker["images"])
    if pos:
        images = [i for i in images if any(t.rsplit(":", 1)[0] == pos[0] or t == pos[0] for t in i["RepoTags"])]
    no_trunc = _flag(opts, "--no-trunc")
    if _flag(opts, "-q", "--quiet"):
        for img in images:
            print(img["Id"] if no_trunc else _short(img["Id"]))
        return 0
    fmt = _get(opts, "--format")
    table = [["REPOSITORY", "TAG", "IMAGE ID", "CREATED", "SIZE"]]
    for img in images:
        for tag in img["RepoTags"] or ["<none>:<none>"]:
            repo, _, t = tag.rpartition(":")
            row = {"Repository": repo, "Tag": t, "ID": img["Id"] if no_trunc else _short(img["Id"]),
                   "Digest": (img["RepoDigests"] or ["@<none>"])[0].split("@", 1)[1],
                   "CreatedAt": img["Created"], "Size": f"{img['Size'] / 1e9:.1f}GB"}
            if fmt:
                print(go_template(fmt[-1], row))
            else:
                age = human_duration(time.time() - (parse_time(img["Created"]) or time.time())) + " ago"
                table.append([repo, t, row["ID"], age, row["Size"]])
    if not fmt:
        _print_table(table)
    return 0


def docker_inspect(argv: list[str], root: Path, kind: str | None = None) -> int:
    opts, pos = _opts(argv, {"-f", "--format", "--type"}, {"-s", "--size"})
    if not pos:
        raise ShimError("\"docker inspect\" requires at least 1 argument.\nSee 'docker inspect --help'.", 1)
    docker = _refreshed(root)
    kind = kind or (_get(opts, "--type") or [None])[-1]
    found, code = [], 0
    for ref in pos:
        obj = None
        if kind in (None, "container"):
            obj = _find_container(docker, ref)
        if obj is None and kind in (None, "image"):
            obj = _find_image(docker, ref)
        if obj is None:
            what = {"container": "container", "image": "image"}.get(kind or "", "object")
            sys.stderr.write(f"Error: No such {what}: {ref}\n")
            code = 1
            continue
        found.append(obj)
    fmt = _get(opts, "-f", "--format")
    if fmt:
        for obj in found:
            print(go_template(fmt[-1], obj))
    else:
        print(json.dumps(found, indent=4))
    return code


def _parse_ports(specs: list[str]) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for spec in specs:
        proto = "tcp"
        if "/" in spec:
            spec, proto = spec.rsplit("/", 1)
        parts = spec.split(":")
        if len(parts) == 1:
            ip, host, cport = "", "", parts[0]
        elif len(parts) == 2:
            ip, host, cport = "", parts[0], parts[1]
        else:
            ip, host, cport = ":".join(parts[:-2]), parts[-2], parts[-1]
        if not cport.isdigit() or (host and not host.isdigit()):
            raise ShimError(f"docker: invalid containerPort: {spec}\nSee 'docker run --help'.", 125)
        out.setdefault(f"{cport}/{proto}", []).append({"HostIp": ip.strip("[]"), "HostPort": host})
    return out


def _gpus(spec: str | None) -> list[dict] | None:
    if spec is None:
        return None
    req = {"Driver": "", "Count": 0, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}
    if spec == "all":
        req["Count"] = -1
    elif spec.isdigit():
        req["Count"] = int(spec)
    elif spec.startswith("device="):
        req["DeviceIDs"] = spec.split("=", 1)[1].strip('"').split(",")
    else:
        raise ShimError(f"docker: invalid argument \"{spec}\" for \"--gpus\" flag\nSee 'docker run --help'.", 125)
    return [req]


def _kv_list(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        k, _, val = v.partition("=")
        out[k] = val
    return out


def docker_run(argv: list[str], root: Path) -> int:
    opts, pos = _opts(argv, RUN_VALUE_FLAGS, RUN_BOOL_FLAGS, interspersed=False)
    if not pos:
        raise ShimError("\"docker run\" requires at least 1 argument.\nSee 'docker run --help'.", 125)
    image_ref, cmd = pos[0], pos[1:]
    if not _flag(opts, "-d", "--detach") and gpu_load_seconds(_get(opts, "--entrypoint"), cmd) is not None:
        return run_gpu_load(root, image_ref, gpu_load_seconds(_get(opts, "--entrypoint"), cmd) or 0.0)
    with locked(root):
        docker = _docker_ready(root)
        node = load(root, "node.json")
        image = _find_image(docker, image_ref)
        if image is None:
            raise ShimError(f"Unable to find image '{image_ref}' locally\ndocker: Error response from daemon: "
                            f"[sim] no registry in the sparkfleet simulation; {image_ref} is not on node "
                            f"{node['node']} (`docker images` lists what is).\nSee 'docker run --help'.", 125)
        seq = int(docker.get("next_seq", 1))
        name = (_get(opts, "--name") or [f"sim_container_{seq}"])[-1]
        other = next((c for c in docker["containers"] if c["Name"] == "/" + name), None)
        if other is not None:
            raise ShimError(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already '
                            f'in use by container "{other["Id"]}". You have to remove (or rename) that container to '
                            "be able to reuse that name.\nSee 'docker run --help'.", 125)
        network = (_get(opts, "--network", "--net") or ["bridge"])[-1]
        ports = _parse_ports(_get(opts, "-p", "--publish"))
        if network == "host" and ports:
            sys.stderr.write("WARNING: Published ports are discarded when using host network mode\n")
            ports = {}
        binds = _get(opts, "-v", "--volume")
        for b in binds:
            src = b.split(":", 1)[0]
            if src.startswith("/") and not (root / src.lstrip("/")).exists():
                # like dockerd: a missing bind source becomes an empty directory (the FM-12 trap)
                (root / src.lstrip("/")).mkdir(parents=True)
        # `-e NAME` without a value takes it from the docker client's environment, as the real CLI does
        env = [e if "=" in e else f"{e}={os.environ.get(e, '')}" for e in _get(opts, "-e", "--env")
               if "=" in e or e in os.environ]
        labels = _kv_list(_get(opts, "-l", "--label"))
        now = time.time()
        cid = hashlib.sha256(f"sparkfleet-sim container {node['node']} {seq}".encode()).hexdigest()
        detach = _flag(opts, "-d", "--detach")
        entrypoint = _get(opts, "--entrypoint")
        running = detach  # a foreground container has nothing to run in the sim: it exits at once
        container = container_record(
            node, cid, name, image_ref, image["Id"], cmd, entrypoint=entrypoint, env=env, labels=labels,
            network=network, ports=ports, binds=binds, created=rfc3339(now), running=running,
            pid=container_pid(node, cid),
            host_config={
                "RestartPolicy": {"Name": (_get(opts, "--restart") or ["no"])[-1], "MaximumRetryCount": 0},
                "AutoRemove": _flag(opts, "--rm"), "IpcMode": (_get(opts, "--ipc") or ["private"])[-1],
                "Privileged": _flag(opts, "--privileged"), "CapAdd": _get(opts, "--cap-add") or None,
                "Devices": [{"PathOnHost": d.split(":")[0], "PathInContainer": (d.split(":") + [d])[1],
                             "CgroupPermissions": "rwm"} for d in _get(opts, "--device")],
                "DeviceRequests": _gpus((_get(opts, "--gpus") or [None])[-1]),
            })
        docker["next_seq"] = seq + 1
        due = rank_faults_due(root) if running and _lane(container) else []
        if running:
            (root / STATE / "logs").mkdir(exist_ok=True)
            start_engine(root, container, due)
        if "rank-vanish" in due:  # the sim's rank-vanish fault: the container is gone as soon as it started
            stop_engine(container, 0.0, signal.SIGKILL)
        elif running or not container["HostConfig"]["AutoRemove"]:  # --rm and exited at once: nothing is left
            docker["containers"].append(container)
            (root / STATE / "logs").mkdir(exist_ok=True)
            (root / STATE / "logs" / f"{cid}.log").touch()
        save(root, "docker.json", docker)
        render(root)
    if detach:
        print(cid)
    else:
        sys.stderr.write("[sim] docker run: foreground containers exit at once in the sparkfleet simulation "
                         "(no process runs)\n")
    return 0


def gpu_load_seconds(entrypoint: list[str], cmd: list[str]) -> float | None:
    """A foreground container running a torch matmul load (`python3 -c SCRIPT SECONDS ...`, the clock probe's
    load in the lane's image): its duration; None for anything else. The sim stands in for torch and the GPU."""
    argv = entrypoint[-1:] + cmd
    if len(argv) >= 4 and os.path.basename(argv[0]).startswith("python") and argv[1] == "-c" \
            and "import torch" in argv[2]:
        try:
            return float(argv[3])
        except ValueError:
            return None
    return None


def run_gpu_load(root: Path, image_ref: str, seconds: float) -> int:
    """`docker run --rm IMAGE python3 -c <torch load>`: the GPU reads busy for SECONDS, then the load's line."""
    docker = _docker_ready(root)
    if _find_image(docker, image_ref) is None:
        raise ShimError(f"docker: Error response from daemon: No such image: {image_ref}", 125)
    until = round(time.time() + seconds, 3)
    _mark_busy(root, until)
    try:
        time.sleep(seconds)
    finally:
        _mark_busy(root, 0, only_if=until)
    steps = step_times(root, seconds)
    print(json.dumps({"step_ms": {"after_idle": steps["after_idle"], "back_to_back": steps["back_to_back"],
                                  "idle_seen": True}}))
    return 0


# -- the sim engine behind a sparkfleet lane's container ----------------------------------------
# `docker run -d` of a container carrying sparkfleet's labels starts the sim engine as a real process
# (THIS IS A SIMULATION: no GPU, no weights), its output going to the container's log; stop/kill/rm
# end it, and ps/inspect/logs first notice a process that has exited (with its exit code).

SUPERVISOR = ("import signal, subprocess, sys\n"
              "for s in (signal.SIGUSR1, signal.SIGUSR2):\n"  # the rank faults' signals are for the engine only
              "    signal.signal(s, lambda *a: None)\n"
              "rc = subprocess.call(sys.argv[2:])\n"
              "open(sys.argv[1], 'w').write(str(rc))\n")


def _vllm_flags(cmd: list[str]) -> dict[str, list[str]]:
    """A vLLM command line as {flag: values} (values run until the next --flag)."""
    out: dict[str, list[str]] = {}
    key = None
    for tok in cmd:
        if tok.startswith("--"):
            key, _, val = tok.partition("=")
            out.setdefault(key, [])
            if val:
                out[key].append(val)
        elif key is not None:
            out[key].append(tok)
        else:
            out.setdefault("", []).append(tok)  # positionals before the first flag (the model path)
    return out


def engine_argv(root: Path, container: dict, cfg: dict, faults: dict) -> list[str] | None:
    """The sim engine command for a lane container, or None when it is not a vLLM lane we can stand in for."""
    labels = container["Config"]["Labels"] or {}
    profile = labels.get(LABEL_PREFIX + "profile")
    cmd = container["Config"]["Cmd"] or []
    if profile is not None and os.path.basename((container["Config"].get("Entrypoint") or [""])[0]) in (
            "llama-server", "rpc-server", "ggml-rpc-server"):  # llama.cpp's own (sparkfleet/sim/llama.py)
        return [cfg["python"], "-m", "sparkfleet.sim.llama", str(root), container["Id"]]
    if profile is not None and cmd[:2] != ["vllm", "serve"]:
        tf = tensorfold_config(root, container)
        if tf is not None:
            return tensorfold_argv(root, tf, cfg)
    if profile is None or "--port" not in cmd:
        return None
    f = _vllm_flags(cmd)
    if "--node-rank" in f and "--nnodes" not in f:  # not a complete multi-node rank: nothing to stand in for
        return None
    env = dict(e.partition("=")[::2] for e in container["Config"]["Env"] or [])
    binds = container["HostConfig"].get("Binds") or []
    rank = int((f.get("--node-rank") or ["0"])[0])
    world = int((f.get("--nnodes") or ["1"])[0])
    port = int(f["--port"][0])
    # A node with its own network (ssh mode as root) serves and meets its peers where the launch says; in
    # local mode every node shares this machine's network, so the ranks meet on loopback.
    own_net = bool(load(root, "node.json").get("netns"))
    master = (f.get("--master-addr") or ["127.0.0.1"])[0] if own_net else "127.0.0.1"
    host = (f.get("--host") or ["0.0.0.0"])[0] if own_net else "127.0.0.1"
    weights = weights_bytes(f, cfg)
    argv = [cfg["python"], "-m", "sparkfleet.simengine", "--rank", str(rank), "--world-size", str(world),
            "--master-addr", master, "--master-port", (f.get("--master-port") or [str(port + 20000)])[0],
            "--host", host, "--port", str(port), "--boot-seconds", str(cfg["boot_seconds"]),
            "--kv-tokens", str(kv_tokens(f, cfg, root)), "--kv-memory-bytes", str(int(kv_budget(f, cfg, root))),
            "--model-gib", f"{weights / 2**30:.4f}"]
    for name in f.get("--served-model-name") or ["model"]:
        argv += ["--served-name", name]
    if f.get("--max-model-len"):
        argv += ["--max-model-len", f["--max-model-len"][0]]
    model = (f.get("") or f.get("--model") or [None])[0]
    if model:
        argv += ["--model", model]
    if f.get("--moe-backend"):  # the backend the launch asked for, never what the profile expects to see
        name = f["--moe-backend"][0]
        argv += ["--moe-backend", cfg.get("moe_kernels", {}).get(name, name.upper())]
    if pin_hook_on(env, binds, cfg):  # the hook the launch carries re-homes every MoE layer (HLT-27)
        argv += ["--rehome-layers", str(cfg["moe_layers"])]
    if env.get("DSV41_ENGRAM_DISK") == "1":
        tp = int((f.get("--tensor-parallel-size") or f.get("-tp") or [str(world)])[0])
        model_dir = node_path(binds, model) if model else None
        table = engram_table(root, model_dir, cfg)
        share = rank % tp  # a rank reads its 1/TP share of each table (ENG-03)
        ranges = [(layer, rows * share // tp, rows * (share + 1) // tp) for layer, (rows, _fmt) in table.items()]
        argv += ["--engram-ranges", ",".join(f"{layer}:{start}:{end}" for layer, start, end in ranges)]
        local = env.get("DSV41_ENGRAM_DIR")
        copy = node_path(binds, local) if local else None
        revision = snapshot_revision(model or "")
        formats = {fmt for _rows, fmt in table.values() if fmt}
        if copy and copy_covers(root, copy, revision, formats.pop() if len(formats) == 1 else None, ranges):
            argv += ["--engram-node-local", "--engram-dir", local]
    if env.get("VLLM_API_KEY"):
        argv += ["--api-key-env", "VLLM_API_KEY"]
    for fault in sorted(faults):
        if fault in ENGINE_FAULT_NAMES:
            argv += ["--fault", fault]
    if (faults.get("slow-boot") or {}).get("factor") is not None:
        argv += ["--slow-boot-factor", str(faults["slow-boot"]["factor"])]
    return argv


def tensorfold_config(root: Path, container: dict) -> dict[str, str] | None:
    """A TensorFold rank's config.env (the file bound at <dir>/config.env), read in the node as the recipe's
    serve script sources it; None when the container has no such bind or the file is not there."""
    import shlex

    for b in container["HostConfig"].get("Binds") or []:
        src, _, rest = b.partition(":")
        if posixpath.basename(rest.split(":")[0]) != "config.env":
            continue
        path = root / src.lstrip("/")
        if not path.is_file():
            return None
        env: dict[str, str] = {}
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.lstrip().startswith("#") and key.strip().isidentifier():
                env[key.strip()] = " ".join(shlex.split(value)) if value else ""
        return env
    return None


def tensorfold_argv(root: Path, env: dict[str, str], cfg: dict) -> list[str]:
    """The sim engine in TensorFold mode from the rank's config.env: the API only on the head, on HOST."""
    rank, world, port = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("PORT", "8000"))
    own_net = bool(load(root, "node.json").get("netns"))
    master = env.get("MASTER_ADDR", "127.0.0.1") if own_net else "127.0.0.1"
    host = env.get("HOST", "127.0.0.1") if own_net else "127.0.0.1"
    argv = [cfg["python"], "-m", "sparkfleet.simengine", "--tensorfold", "--rank", str(rank), "--world-size",
            str(world), "--master-addr", master, "--master-port", env.get("MASTER_PORT") or str(port + 20000),
            "--host", host, "--port", str(port), "--boot-seconds", str(cfg["boot_seconds"])]
    for name in (env.get("SERVED_NAMES") or "model").split(","):
        argv += ["--served-name", name]
    if env.get("MODEL_DIR"):
        argv += ["--model", env["MODEL_DIR"]]
    if env.get("SERVE_ARGS"):
        argv += ["--serve-args", env["SERVE_ARGS"]]
    return argv


def gpu_memory_bytes(root: Path) -> int:
    """What vLLM sees as the GPU's memory: nvidia-smi's memory.total, or on unified memory (GB10, where it reads
    [N/A]) the node's MemTotal in its /proc/meminfo."""
    total = load(root, "gpu.json")["gpus"][0].get("memory_total_mib")
    if total is not None:
        return int(total) * 2**20
    meminfo = root / "proc" / "meminfo"
    text = (meminfo if meminfo.is_file() else bound_source(root, "/proc/meminfo")).read_text()
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ShimError("sparkfleet sim: the node's /proc/meminfo has no MemTotal", 1)


def weights_bytes(flags: dict[str, list[str]], cfg: dict) -> int:
    """The weights the rank holds on the GPU: the sim's checkpoint (values.ENGINE_MODEL_GIB) less what
    --cpu-offload-gb moves to the host."""
    from fractions import Fraction

    offload = Fraction((flags.get("--cpu-offload-gb") or ["0"])[0]) * 2**30
    return int(max(Fraction(0), Fraction(*cfg["model_gib"]) * 2**30 - offload))


def kv_budget(flags: dict[str, list[str]], cfg: dict, root: Path) -> Fraction:
    """The KV memory a rank profiles from its launch, in bytes (values.py says how both ways were
    calibrated): --kv-cache-memory-bytes when given, else --gpu-memory-utilization (vLLM's default when
    absent) x the GPU's memory less the weights and the rest. Below zero when the weights eat the budget."""
    from fractions import Fraction

    raw = (flags.get("--kv-cache-memory-bytes") or [None])[0]
    if raw is not None:
        return Fraction(int(raw))
    gmu = Fraction((flags.get("--gpu-memory-utilization") or [None])[0] or Fraction(*cfg["default_gmu"]))
    return gpu_memory_bytes(root) * gmu - weights_bytes(flags, cfg) - Fraction(*cfg["gmu_other_bytes"])


def kv_tokens(flags: dict[str, list[str]], cfg: dict, root: Path) -> int:
    """The KV cache in tokens: the budget less what vLLM keeps back, over a token's cost, times the DCP size."""
    from fractions import Fraction

    per_token = Fraction(*cfg["kv_bytes_per_token"])
    reserved = Fraction(*cfg["kv_reserved_bytes"])
    dcp = int((flags.get("--decode-context-parallel-size") or flags.get("-dcp") or ["1"])[0])
    tokens = int((kv_budget(flags, cfg, root) - reserved) * dcp / per_token)
    return tokens if tokens > 0 else min(tokens, -1)  # below 1: the engine says there is no room for KV


def pin_hook_on(env: dict[str, str], binds: list[str], cfg: dict) -> bool:
    """The GB300 pin-hot hook is in the launch: PIN_HOOK set and its sitecustomize.py bound over the image's
    (CATALOG LCH-G4). Nothing else in a launch can say the hook runs."""
    targets = [b.split(":")[1] for b in binds if b.count(":") >= 1]
    return bool(env.get(cfg["pin_hook_env"])) and any(posixpath.basename(t) == cfg["pin_hook_site"] for t in targets)


def node_path(binds: list[str], container_path: str) -> str | None:
    """Where a container path lives on the node, through the container's binds (the deepest one wins)."""
    best: tuple[str, str] | None = None
    for b in binds:
        src, _, rest = b.partition(":")
        dst = rest.split(":")[0]
        if container_path == dst or container_path.startswith(dst.rstrip("/") + "/"):
            if best is None or len(dst) > len(best[1]):
                best = (src, dst)
    if best is None:
        return None
    return best[0] + container_path[len(best[1]):]


def snapshot_revision(path: str) -> str | None:
    """The checkpoint revision of a `.../snapshots/<40 hex>` model path (how an HF cache names it)."""
    m = re.search(r"/snapshots/([0-9a-f]{40})(?:/|$)", path)
    return m.group(1) if m else None


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        return json.loads(fh.read(n)) if 0 < n < 100 * 2**20 else {}


def engram_table(root: Path, model_dir: str | None, cfg: dict) -> dict[int, tuple[int, str | None]]:
    """layer -> (rows, format) of each Engram table: read from the checkpoint's safetensors headers on the node
    when they hold the layer's table (the sim's tensor names: values.ENGRAM_TENSOR), else the sim's table size."""
    out: dict[int, tuple[int, str | None]] = {layer: (int(cfg["engram_table_rows"]), None)
                                              for layer in cfg["engram_layers"]}
    d = root / model_dir.lstrip("/") if model_dir else None
    if d is None or not d.is_dir():
        return out
    for shard in sorted(d.glob("*.safetensors")):
        try:
            header = _safetensors_header(shard)
        except (OSError, ValueError):
            continue
        for layer in cfg["engram_layers"]:
            t = header.get(cfg["engram_tensor"].format(layer=layer))
            if isinstance(t, dict) and len(t.get("shape") or []) == 2:
                fmt = {"F8_E4M3": "fp8", "U8": "nvfp4"}.get(t.get("dtype"))  # the values' dtype (ENG-25)
                out[layer] = (int(t["shape"][0]), fmt)
    return out


def copy_covers(root: Path, copy_dir: str, revision: str | None, fmt: str | None,
                ranges: list[tuple[int, int, int]]) -> bool:
    """Does the node-local copy serve these rows? Its manifest (the schema sparkfleet/engram writes) must be
    complete and verified, of this checkpoint and format, cover every layer's rows, and its bytes must be
    there: each rows tensor's span lies inside chunks whose sha256 the sim recomputes from the files."""
    d = root / copy_dir.lstrip("/")
    try:
        m = json.loads((d / "engram-manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(m, dict) or m.get("schema") != "sparkfleet.engram-manifest/1" \
            or m.get("complete") is not True or m.get("verified") is not True:
        return False
    if revision and (m.get("source") or {}).get("revision") != revision:
        return False
    if fmt and m.get("format") not in (fmt, None):
        return False
    chunks = (m.get("chunks") or {}).get("files") or {}
    if (m.get("chunks") or {}).get("algorithm") != "sha256":
        return False
    spans: list[tuple[str, int, int]] = []
    for layer, start, end in ranges:
        if m.get("mode") == "whole-shards":
            continue
        have = (m.get("layers") or {}).get(str(layer)) or {}
        if m.get("mode") != "rows" or not (have.get("start", end) <= start and end <= have.get("end", start)):
            return False
        tensors = [t for t in m.get("tensors") or [] if t.get("layer") == layer and t.get("kind") == "rows"]
        if not tensors:
            return False
        for t in tensors:
            rb, r0 = int(t["row_bytes"]), int(t["rows"][0])
            if not (r0 <= start and end <= int(t["rows"][1])):
                return False
            spans.append((t["file"], int(t["tensor_offset"]) + start * rb, (end - start) * rb))
    for name, items in chunks.items():  # every chunk the manifest names must read back as it says
        try:
            with open(d / name, "rb") as fh:
                for offset, length, digest in items:
                    fh.seek(offset)
                    data = fh.read(length)
                    if len(data) != length or hashlib.sha256(data).hexdigest() != digest:
                        return False
        except OSError:
            return False
    for name, offset, length in spans:  # and together they hold each span the rank reads
        pos = offset
        for c_off, c_len, _ in sorted(chunks.get(name) or []):
            if c_off <= pos < c_off + c_len:
                pos = c_off + c_len
        if pos < offset + length:
            return False
    return True


ENGINE_FAULT_NAMES = frozenset({
    "worker-crash", "slow-boot", "kv-low", "missing-patch", "engine-fatal", "engine-warning", "garbage-tokens",
    "count-off-by-one", "needle-blind", "no-tool-calls", "nondeterministic", "auth-open", "stream-usage-missing",
    "memory-leak"})


RANK_FAULTS = ("rank-vanish", "rank-hang", "serve-crash")  # act on a running rank, or on the next launch
RANK_SIGNALS = {"rank-hang": signal.SIGUSR1, "serve-crash": signal.SIGUSR2}  # the sim engine's handlers


def rank_faults_due(root: Path) -> list[str]:
    """The rank faults this launch gets: sticky ones always, the others once (then marked acted)."""
    faults = load(root, "faults.json")
    due = [k for k in RANK_FAULTS if k in faults["faults"]
           and (faults["faults"][k].get("sticky") or not faults["faults"][k].get("acted"))]
    for k in due:
        faults["faults"][k]["acted"] = True
    if due:
        save(root, "faults.json", faults)
    return due


def _lane(c: dict) -> bool:
    return LABEL_PREFIX + "profile" in (c["Config"]["Labels"] or {})


def sim_fault(argv: list[str], root: Path) -> int:
    """`sim-fault KIND` (run inside the node by `sparkfleet sim fault`): act on the running lane containers;
    prints how many it acted on."""
    if len(argv) != 1 or argv[0] not in RANK_FAULTS:
        raise ShimError(f"usage: sim-fault {'|'.join(RANK_FAULTS)}", 2)
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
                    os.killpg(int(c["SimProcess"]["pid"]), RANK_SIGNALS[argv[0]])
        save(root, "docker.json", docker)
        render(root)
    print(len(running))
    return 0


def start_engine(root: Path, container: dict, rank_faults: list[str] | None = None) -> None:
    import subprocess

    cfg_path = root / STATE / "engine.json"
    if not cfg_path.is_file():
        return
    cfg = json.loads(cfg_path.read_text())
    argv = engine_argv(root, container, cfg, load(root, "faults.json")["faults"])
    if argv is None:
        return
    if "sparkfleet.simengine" in argv:
        argv += [a for k in rank_faults or () if k in RANK_SIGNALS for a in ("--fault", k)]
    cid = container["Id"]
    log = root / STATE / "logs" / f"{cid}.log"
    exit_file = root / STATE / "logs" / f"{cid}.exit"
    exit_file.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VLLM_API_KEY")}
    key = dict(e.partition("=")[::2] for e in container["Config"]["Env"] or []).get("VLLM_API_KEY")
    if key:  # the engine reads its key from the environment, never from argv
        env["VLLM_API_KEY"] = key
    env["PYTHONPATH"] = cfg["package_root"]
    env["PYTHONUNBUFFERED"] = "1"
    with open(log, "ab") as out:
        proc = subprocess.Popen([cfg["python"], "-c", SUPERVISOR, str(exit_file), *argv], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(root), env=env,
                                start_new_session=True)
    container["SimProcess"] = {"pid": proc.pid, "exit_file": str(exit_file), "argv": argv}
    container["State"]["Pid"] = proc.pid  # the container's main process, as the node's /proc shows it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our child, not reaped yet) is not alive
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def reap(docker: dict) -> bool:
    """Mark containers whose engine process ended as exited (with its exit code); True if any changed."""
    changed = False
    for c in docker.get("containers", []):
        sp = c.get("SimProcess")
        if not sp or not c["State"]["Running"]:
            continue
        exit_file = Path(sp["exit_file"])
        if exit_file.is_file():
            try:
                rc = int(exit_file.read_text().strip() or "1")
            except ValueError:
                rc = 1
        elif not _alive(int(sp["pid"])):
            rc = 137
        else:
            continue
        c["State"].update({"Status": "exited", "Running": False, "Pid": 0, "ExitCode": rc,
                           "FinishedAt": rfc3339(time.time())})
        c["NetworkSettings"]["Ports"] = {}
        changed = True
    return changed


def _refreshed(root: Path) -> dict:
    """docker.json after noticing engines that exited (so ps/inspect/logs tell the truth)."""
    with locked(root):
        docker = _docker_ready(root)
        if reap(docker):
            save(root, "docker.json", docker)
            render(root)
    return docker


def stop_engine(c: dict, wait_s: float, sig_first: int = signal.SIGTERM) -> int | None:
    """End a container's engine: SIGTERM, then SIGKILL after `wait_s`; the exit code when known."""
    sp = c.get("SimProcess")
    if not sp:
        return None
    pid, exit_file = int(sp["pid"]), Path(sp["exit_file"])
    for sig, grace in ((sig_first, wait_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.time() + grace
        while time.time() < deadline and _alive(pid) and not exit_file.is_file():
            time.sleep(0.05)
        if not _alive(pid) or exit_file.is_file():
            break
    with contextlib.suppress(OSError, ValueError):
        return int(exit_file.read_text().strip())
    return None


def container_record(node: dict, cid: str, name: str, image_ref: str, image_id: str, cmd: list[str], *,
                     entrypoint: list[str] | None = None, env: list[str] | None = None,
                     labels: dict[str, str] | None = None, network: str = "bridge",
                     ports: dict[str, list[dict[str, str]]] | None = None, binds: list[str] | None = None,
                     created: str, running: bool, pid: int, host_config: dict | None = None) -> dict:
    """One container as `docker inspect` shows it (the fields docs/sim-layout.md lists, and their neighbours)."""
    ports = ports or {}
    hc = {"Binds": binds or None, "NetworkMode": network, "PortBindings": ports,
          "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0}, "AutoRemove": False, "IpcMode": "private",
          "Privileged": False, "CapAdd": None, "Devices": [], "DeviceRequests": None}
    hc.update(host_config or {})
    return {
        "Id": cid, "Created": created, "Path": (entrypoint or cmd or [""])[0],
        "Args": (cmd if entrypoint else cmd[1:]),
        "State": {"Status": "running" if running else "exited", "Running": running, "Paused": False,
                  "Restarting": False, "OOMKilled": False, "Dead": False, "Pid": pid if running else 0,
                  "ExitCode": 0, "Error": "", "StartedAt": created,
                  "FinishedAt": ZERO_TIME if running else created},
        "Image": image_id, "Name": "/" + name, "RestartCount": 0,
        "HostConfig": hc,
        "Config": {"Hostname": node["hostname"] if network == "host" else cid[:12], "Env": env or None,
                   "Cmd": cmd or None, "Image": image_ref, "Entrypoint": entrypoint or None,
                   "Labels": labels or {}, "ExposedPorts": {p: {} for p in ports} or None},
        "NetworkSettings": {"Ports": _published(ports) if running else {}},
    }


def container_pid(node: dict, cid: str) -> int:
    """A container's main process id: stable per container, so a restart shows the same /proc entry."""
    return int(node["sim"]["container_pid_base"]) + 10 * (int(cid[:6], 16) % 5000)


def _published(ports: dict[str, list[dict[str, str]]]) -> dict[str, list[dict[str, str]]]:
    out = {}
    for cport, binds in ports.items():
        rows = []
        for b in binds:
            if not b["HostPort"]:
                continue
            if b["HostIp"]:
                rows.append({"HostIp": b["HostIp"], "HostPort": b["HostPort"]})
            else:
                rows += [{"HostIp": "0.0.0.0", "HostPort": b["HostPort"]}, {"HostIp": "::", "HostPort": b["HostPort"]}]
        out[cport] = rows
    return out


def _change(argv: list[str], root: Path, verb: str) -> int:
    """stop / kill / start / rm: change containers' state, print each name as docker does."""
    value_flags = {"-t", "--time", "-s", "--signal"}
    bool_flags = {"-f", "--force", "-v", "--volumes", "-a", "--attach", "-i", "--interactive"}
    opts, pos = _opts(argv, value_flags, bool_flags)
    if not pos:
        raise ShimError(f"\"docker {verb}\" requires at least 1 argument.\nSee 'docker {verb} --help'.", 1)
    code = 0
    with locked(root):
        docker = _docker_ready(root)
        node = load(root, "node.json")
        reap(docker)
        now = time.time()
        for ref in pos:
            c = _find_container(docker, ref)
            if c is None:
                sys.stderr.write(f"Error response from daemon: No such container: {ref}\n")
                code = 1
                continue
            st = c["State"]
            if verb in ("stop", "kill") or (verb == "rm" and st["Running"] and _flag(opts, "-f", "--force")):
                if verb == "kill" and not st["Running"]:
                    sys.stderr.write(f"Error response from daemon: cannot kill container: {ref}: container "
                                     f"{c['Id']} is not running\n")
                    code = 1
                    continue
                if st["Running"]:
                    exit_code = node["sim"]["stop_exit_code"] if verb == "stop" else node["sim"]["kill_exit_code"]
                    real = stop_engine(c, ENGINE_STOP_WAIT_S if verb == "stop" else 0.0,
                                       signal.SIGTERM if verb == "stop" else signal.SIGKILL)
                    exit_code = real if real is not None else exit_code
                    st.update({"Status": "exited", "Running": False, "Pid": 0, "ExitCode": exit_code,
                               "FinishedAt": rfc3339(now)})
                    c["NetworkSettings"]["Ports"] = {}
                if c["HostConfig"].get("AutoRemove") and verb != "rm":
                    _remove(root, docker, c)
            elif verb == "rm":
                if st["Running"]:
                    sys.stderr.write(f'Error response from daemon: cannot remove container "{c["Name"]}": container '
                                     "is running: stop the container before removing or force remove\n")
                    code = 1
                    continue
            elif verb == "start" and not st["Running"]:
                st.update({"Status": "running", "Running": True, "ExitCode": 0, "FinishedAt": ZERO_TIME,
                           "StartedAt": rfc3339(now),
                           "Pid": container_pid(node, c["Id"])})
                if c.get("SimProcess"):
                    start_engine(root, c)
                c["NetworkSettings"]["Ports"] = _published(c["HostConfig"].get("PortBindings") or {})
            if verb == "rm":
                _remove(root, docker, c)
            print(ref)
        save(root, "docker.json", docker)
        render(root)
    return code


def _remove(root: Path, docker: dict, c: dict) -> None:
    if c in docker["containers"]:
        docker["containers"].remove(c)
    with contextlib.suppress(FileNotFoundError):
        (root / STATE / "logs" / f"{c['Id']}.log").unlink()


def docker_logs(argv: list[str], root: Path) -> int:
    opts, pos = _opts(argv, {"-n", "--tail", "--since", "--until"},
                      {"-f", "--follow", "-t", "--timestamps", "--details"})
    if len(pos) != 1:
        raise ShimError("\"docker logs\" requires exactly 1 argument.\nSee 'docker logs --help'.", 1)
    docker = _refreshed(root)
    c = _find_container(docker, pos[0])
    if c is None:
        raise ShimError(f"Error response from daemon: No such container: {pos[0]}", 1)
    log = root / STATE / "logs" / f"{c['Id']}.log"
    text = log.read_text() if log.is_file() else ""
    tail = _get(opts, "-n", "--tail")
    lines = text.splitlines(keepends=True)
    if tail and tail[-1] != "all":
        lines = lines[-int(tail[-1]):] if int(tail[-1]) else []
    sys.stdout.write("".join(lines))
    sys.stdout.flush()
    if _flag(opts, "-f", "--follow"):
        offset = len(text.encode())
        while True:  # follow until the container stops, as `docker logs -f` does
            time.sleep(0.2)
            if log.is_file():
                with open(log, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
                offset += len(chunk)
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            try:
                current = _find_container(load(root, "docker.json"), c["Id"])
            except (OSError, ValueError):  # the node went away (unreachable fault, sim down)
                return 1
            if current is None or not current["State"]["Running"]:
                return 0
    return 0


def docker_info(argv: list[str], root: Path, version: bool = False) -> int:
    opts, _ = _opts(argv, {"-f", "--format"}, set())
    node = load(root, "node.json")
    docker = load(root, "docker.json")
    if version and docker.get("daemon") != "up":
        print(f"Client:\n Version:           {node['sim']['docker_version']}\n (sparkfleet simulation)")
    docker = _docker_ready(root)
    ver = node["sim"]["docker_version"]
    data = {"ServerVersion": ver, "Name": node["hostname"], "Containers": len(docker["containers"]),
            "ContainersRunning": sum(c["State"]["Running"] for c in docker["containers"]),
            "Images": len(docker["images"]), "OperatingSystem": "DGX OS (sparkfleet simulation)",
            "Client": {"Version": ver}, "Server": {"Version": ver}}
    fmt = _get(opts, "-f", "--format")
    if fmt:
        print(go_template(fmt[-1], data))
    elif version:
        print(f"Client:\n Version:           {ver}\n\nServer: Docker Engine (sparkfleet simulation)\n Engine:\n"
              f"  Version:          {ver}")
    else:
        print(f"[sim] sparkfleet simulation of dockerd on {node['node']}\nServer:\n Containers: {data['Containers']}"
              f"\n  Running: {data['ContainersRunning']}\n Images: {data['Images']}\n Server Version: {ver}\n"
              f" Operating System: {data['OperatingSystem']}")
    return 0


DOCKER_GLOBAL_VALUE = {"-H", "--host", "--context", "-c", "--config", "-l", "--log-level"}


def docker(argv: list[str], root: Path) -> int:
    while argv and argv[0].startswith("-"):  # global options come before the command
        flag = argv.pop(0)
        if flag.partition("=")[0] in DOCKER_GLOBAL_VALUE and "=" not in flag and argv:
            argv.pop(0)
    if not argv:
        raise ShimError("Usage:  docker [OPTIONS] COMMAND\n\n[sim] sparkfleet simulation of the docker CLI", 1)
    cmd, rest = argv[0], argv[1:]
    if cmd in ("container", "image") and rest:
        sub, rest = rest[0], rest[1:]
        cmd = {("container", "ls"): "ps", ("container", "list"): "ps", ("container", "ps"): "ps",
               ("image", "ls"): "images", ("image", "list"): "images"}.get((cmd, sub), f"{cmd}-{sub}")
    table = {
        "ps": lambda: docker_ps(rest, root), "images": lambda: docker_images(rest, root),
        "inspect": lambda: docker_inspect(rest, root),
        "container-inspect": lambda: docker_inspect(rest, root, "container"),
        "image-inspect": lambda: docker_inspect(rest, root, "image"),
        "run": lambda: docker_run(rest, root), "container-run": lambda: docker_run(rest, root),
        "logs": lambda: docker_logs(rest, root), "container-logs": lambda: docker_logs(rest, root),
        "info": lambda: docker_info(rest, root), "version": lambda: docker_info(rest, root, version=True),
    }
    for verb in ("stop", "kill", "start", "rm"):
        table[verb] = table[f"container-{verb}"] = (lambda v: lambda: _change(rest, root, v))(verb)
    if cmd not in table:
        known = ", ".join(sorted(k for k in table if "-" not in k))
        raise ShimError(f"docker: '{cmd}' is not a docker command.\nSee 'docker --help'\n"
                        f"[sim] the sparkfleet simulation supports: {known}", 1)
    return table[cmd]()


# -- ip and sysctl: runtime addresses (rail-2 aliases) and drop_caches, kept in state -------------

def ip(argv: list[str], root: Path) -> int:
    """`ip addr add|del CIDR dev IFACE` and `ip addr show`: runtime aliases in state/net.json (never persisted,
    like the real command)."""
    args = [a for a in argv if a not in ("-4", "-6", "-br", "-brief")]
    if not args or args[0] not in ("addr", "address", "a"):
        raise ShimError("[sim] the sparkfleet simulation's ip supports: ip addr add|del CIDR dev IFACE; "
                        "ip addr show", 1)
    rest = args[1:] or ["show"]
    with locked(root):
        path = root / STATE / "net.json"
        net = json.loads(path.read_text()) if path.is_file() else {"aliases": []}
        if rest[0] in ("show", "list", "ls"):
            for a in net["aliases"]:
                print(f"    inet {a['cidr']} scope global secondary {a['dev']}")
            return 0
        if rest[0] not in ("add", "del", "delete") or len(rest) < 4 or rest[2] != "dev":
            raise ShimError("Command line is not complete. Try \"ip address help\".", 1)
        entry = {"cidr": rest[1], "dev": rest[3]}
        if rest[0] == "add":
            if entry in net["aliases"]:
                raise ShimError("RTNETLINK answers: File exists", 2)
            net["aliases"].append(entry)
        else:
            if entry not in net["aliases"]:
                raise ShimError("RTNETLINK answers: Cannot assign requested address", 2)
            net["aliases"].remove(entry)
        write_bytes(path, dumps(net).encode())
    return 0


def sysctl(argv: list[str], root: Path) -> int:
    """`sysctl [-q] -w vm.drop_caches=3`: records the drop (the sim's page cache is already small)."""
    sets = [a for a in argv if "=" in a]
    if not sets:
        raise ShimError("[sim] the sparkfleet simulation's sysctl supports -w KEY=VALUE only", 1)
    for kv in sets:
        key, _, value = kv.partition("=")
        path = root / "proc" / "sys" / key.replace(".", "/")
        if not path.parent.is_dir():
            raise ShimError(f"sysctl: cannot stat /proc/sys/{key.replace('.', '/')}: No such file or directory", 255)
        try:
            path.write_text(value + "\n")
        except PermissionError:
            if os.geteuid() != 0:  # what procps' sysctl says to a user who is not root
                raise ShimError(f'sysctl: permission denied on key "{key}"', 1) from None
            # root of the unprivileged lab's user namespace: the kernel keeps the host's vm sysctls to the host
        with open(root / STATE / "sysctl.log", "a") as log:  # what was set, for tests and `sim status`
            log.write(f"{rfc3339(time.time())} {key}={value}\n")
        if "-q" not in argv:
            print(f"{key} = {value}")
    return 0


# -- the node's own processes: its init and the earlyoom it runs -----------------------------------

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


# -- entry point ------------------------------------------------------------------------------

TOOLS = {"nvidia-smi": nvidia_smi, "docker": docker, "ibdev2netdev": ibdev2netdev, "sim-gpu-load": sim_gpu_load,
         "ip": ip, "sysctl": sysctl, "earlyoom": earlyoom, "sim-node-init": sim_node_init,
         "sim-fault": sim_fault}


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


if __name__ == "__main__":
    sys.exit(main())
