"""The files a node shows, rendered from its state: /proc/meminfo, /etc/mtab, /sys/class/... .

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.
"""

from __future__ import annotations

import ipaddress
import os
import time
from pathlib import Path

from .state import STATE, load, write_bytes, write_in_place


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
BOUND_FILES = ("/proc/meminfo", "/proc/uptime", "/etc/hostname", "/etc/mtab", "/etc/default/earlyoom",
               "/etc/ld.so.preload", "/etc/sparkfleet-sim-clock")


def uptime_state(uptime_s: float, idle_per_s: float) -> dict:
    """node.json's uptime: a node up `uptime_s` seconds now, on this machine's CLOCK_BOOTTIME (which no node's wall
    clock moves: the clock-skew fault leaves it alone), so /proc/uptime keeps counting (sim-node-init rewrites it)."""
    return {"base": time.clock_gettime(time.CLOCK_BOOTTIME) - uptime_s, "idle_per_s": idle_per_s}


def uptime_line(node: dict) -> str:
    """/proc/uptime now: seconds since the node booted, and idle CPU seconds (every CPU mostly idle)."""
    up = max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - node["uptime"]["base"])
    return f"{up:.2f} {up * node['uptime']['idle_per_s']:.2f}\n"


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
        "/proc/uptime": uptime_line(node),
        # what getmntent(3) reads: the lab's filesystems (NFS, XFS, CIFS cannot be mounted here)
        "/etc/mtab": "".join(" ".join(r) + " 0 0\n" for r in mount_rows(node, faults)),
        # the clock-skew fault's node clock (sim/clock.py): named for every program the node starts while on
        "/etc/ld.so.preload": "/usr/local/bin/sim-clock.so\n" if "clock-skew" in faults else "",
        "/etc/sparkfleet-sim-clock": f"{faults['clock-skew']['seconds']:g}\n" if "clock-skew" in faults else "0\n",
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
KEPT_DIRS = ("sys/fs/cgroup",)  # mount points in a node with its own dockerd: render never looks inside


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
        walked = []
        for dirpath, dirnames, filenames in os.walk(top):  # top-down, so a kept mount point is never entered
            d = Path(dirpath)
            links = [n for n in dirnames if (d / n).is_symlink()]
            dirnames[:] = [n for n in dirnames if str((d / n).relative_to(root)) not in KEPT_DIRS]
            walked.append((d, links, filenames))
        for d, links, filenames in reversed(walked):  # then bottom-up, so emptied directories go too
            for name in filenames + links:
                rel = str((d / name).relative_to(root))
                if rel not in wanted:
                    (d / name).unlink()
            rel_dir = str(d.relative_to(root))
            if rel_dir not in wanted_dirs and rel_dir != tree and not any(d.iterdir()):
                d.rmdir()
