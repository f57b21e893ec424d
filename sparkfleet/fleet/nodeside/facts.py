#!/usr/bin/env python3
"""sparkfleet node facts: read a FactsRequest (JSON) on stdin, print one NodeFacts JSON document.

Runs on the node with the system python3 and the standard library only: it is copied to
~/.cache/sparkfleet/bin/ by the controller and must not import sparkfleet or anything third-party.
It reads the node's own files (/proc, /sys, /etc) and runs its commands (nvidia-smi, docker,
ibdev2netdev) from PATH.
A part that cannot be read adds a line to "errors" and the rest still reports. Exit 0 whenever a
document was printed; exit 2 only for a request that is not valid JSON.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from fractions import Fraction

HELPER_VERSION = "1"

# nvidia-smi can hang on a wedged GPU and docker on a stuck daemon: every command is bounded.
GPU_TIMEOUT_S = 8.0
DOCKER_TIMEOUT_S = 8.0
IB_TIMEOUT_S = 4.0

GPU_FIELDS = ("index,name,pstate,clocks.sm,clocks.max.sm,clocks_event_reasons.active,power.draw,"
              "memory.total,memory.used")
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3")
MOUNTS = "/etc/mtab"  # getmntent(3)'s table; on DGX OS (Ubuntu) a link to /proc/self/mounts
EARLYOOM_DEFAULT_PERCENT = 10.0  # earlyoom's built-in -m default (MANPAGE: "default 10 %")
# earlyoom's short options that take an argument (getopt string "m:s:M:S:kingN:dvr:ph" and the
# older/newer variants); -P (pre-kill script) exists in newer releases.
EARLYOOM_ARG_SHORT = "msMSNPr"
EARLYOOM_ARG_LONG = ("--prefer", "--avoid", "--ignore")


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line
    return ""


def run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """Run a command with a timeout; raises FileNotFoundError when it is not installed."""
    env = dict(os.environ, LC_ALL="C")
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"timed out after {timeout:g} s") from None
    return (p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))


def why(exc: OSError) -> str:
    """An OSError's reason without the path (the error line already names what was read)."""
    return exc.strerror or str(exc)


def command_error(name: str, exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"{name}: not found"
    if isinstance(exc, PermissionError):
        return f"{name}: permission denied"
    return f"{name}: {exc}"


# -- memory, uptime, hostname ----------------------------------------------------------------

def meminfo(errors: list[str]) -> dict | None:
    want = {"MemTotal": "mem_total_bytes", "MemAvailable": "mem_available_bytes",
            "SwapTotal": "swap_total_bytes", "SwapFree": "swap_free_bytes"}
    try:
        text = read_text("/proc/meminfo")
    except OSError as exc:
        errors.append(f"meminfo: {why(exc)}")
        return None
    out: dict = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in want:
            parts = rest.split()
            try:
                value = int(parts[0])
            except (IndexError, ValueError):
                continue
            # the kernel prints kB (KiB); a unitless line would be a count, but these four always have kB
            out[want[key]] = value * 1024 if (len(parts) < 2 or parts[1] == "kB") else value
    for required in ("mem_total_bytes", "mem_available_bytes"):
        if required not in out:
            key = "MemTotal" if required == "mem_total_bytes" else "MemAvailable"
            errors.append(f"meminfo: no {key} line")
            return None
    return out


def uptime(errors: list[str]) -> float | None:
    try:
        return float(read_text("/proc/uptime").split()[0])
    except (OSError, IndexError, ValueError) as exc:
        errors.append("uptime: " + (why(exc) if isinstance(exc, OSError) else "unreadable /proc/uptime"))
        return None


def hostname() -> str:
    return socket.gethostname()


# -- processes --------------------------------------------------------------------------------

def processes() -> dict[int, str]:
    """pid -> comm for every process visible under R/proc."""
    out: dict[int, str] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            out[int(name)] = read_text(f"/proc/{name}/comm").rstrip("\n")
        except OSError:
            continue  # exited while we looked, or not ours to read
    return out


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a] if raw else []


# -- GPU ------------------------------------------------------------------------------------

def _na(value: str) -> str | None:
    v = value.strip()
    if not v or v.startswith("[") or v in ("N/A", "Not Supported", "Unknown Error"):
        return None
    return v


def _int(value: str) -> int | None:
    v = _na(value)
    if v is None:
        return None
    try:
        return int(float(v))
    except ValueError:
        return None


def _float(value: str) -> float | None:
    v = _na(value)
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _hex(value: str) -> int | None:
    v = _na(value)
    if v is None:
        return None
    try:
        return int(v, 16) if v.lower().startswith("0x") else int(v)
    except ValueError:
        return None


def parse_gpus(text: str, errors: list[str]) -> list[dict]:
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = [x.strip() for x in line.split(",")]
        if len(f) != 9 or _int(f[0]) is None:
            errors.append(f"nvidia-smi: unexpected line {line.strip()[:120]!r}")
            continue
        gpus.append({
            "index": _int(f[0]), "name": f[1], "pstate": _na(f[2]),
            "sm_clock_mhz": _int(f[3]), "max_sm_clock_mhz": _int(f[4]),
            "clock_event_reasons": _hex(f[5]), "power_draw_w": _float(f[6]),
            "memory_total_mib": _int(f[7]), "memory_used_mib": _int(f[8]),
        })
    return gpus


def gpus(errors: list[str]) -> list[dict]:
    try:
        rc, out, err = run(["nvidia-smi", "--query-gpu=" + GPU_FIELDS, "--format=csv,noheader,nounits"],
                           GPU_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        errors.append(command_error("nvidia-smi", exc))
        return []
    if rc != 0:
        errors.append("nvidia-smi: " + (first_line(err) or first_line(out) or f"exit {rc}"))
        return []
    return parse_gpus(out, errors)


# -- earlyoom ---------------------------------------------------------------------------------

def _term_value(arg: str) -> float:
    """The SIGTERM part of PERCENT[,KILL_PERCENT] (or SIZE[,KILL_SIZE])."""
    return float(arg.split(",", 1)[0])


def earlyoom_limits(argv: list[str]) -> tuple[float | None, float | None]:
    """(-m percent, -M KiB) as earlyoom's getopt_long would read them; the last one given wins."""
    m = big_m = None
    i = 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if tok == "--":
            break
        if tok.startswith("--"):
            if tok in EARLYOOM_ARG_LONG:
                i += 1  # its value
            continue
        if not tok.startswith("-") or tok == "-":
            continue
        j = 1
        while j < len(tok):
            opt = tok[j]
            if opt in EARLYOOM_ARG_SHORT:
                if j + 1 < len(tok):
                    value = tok[j + 1:]
                elif i < len(argv):
                    value = argv[i]
                    i += 1
                else:
                    value = ""
                if opt == "m":
                    m = _term_value(value)
                elif opt == "M":
                    big_m = _term_value(value)
                break
            j += 1
    return m, big_m


def default_args() -> str | None:
    """EARLYOOM_ARGS from /etc/default/earlyoom (shell syntax; the last assignment wins)."""
    try:
        text = read_text("/etc/default/earlyoom")
    except OSError:
        return None
    value = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[7:].lstrip()
        if not line.startswith("EARLYOOM_ARGS="):
            continue
        try:
            words = shlex.split(line[len("EARLYOOM_ARGS="):], comments=True)
        except ValueError:
            continue
        value = " ".join(words)
    return value


def earlyoom(procs: dict[int, str], mem: dict | None, errors: list[str]) -> dict:
    pid = min((p for p, comm in procs.items() if comm == "earlyoom"), default=None)
    argv = cmdline(pid) if pid is not None else []
    defaults = default_args()
    out: dict = {"running": pid is not None, "pid": pid, "argv": argv, "default_args": defaults}
    total_kib = mem["mem_total_bytes"] / 1024 if mem else None
    percent = threshold = None
    # the running process is the truth; the defaults file is what the next start would use
    for source, args in (("running argv", argv[1:] if argv else None),
                         ("EARLYOOM_ARGS", shlex.split(defaults) if defaults else None)):
        if args is None:
            continue
        try:
            m, big_m = earlyoom_limits(args)
        except ValueError as exc:
            errors.append(f"earlyoom: cannot read -m/-M from {source}: {exc}")
            continue
        if big_m is not None and total_kib:
            # earlyoom turns -M KiB into a percent of MemTotal; with -m too, the lower one wins
            m_pct = 100.0 * big_m / total_kib
            if m is None or m_pct < m:
                percent, threshold = m_pct, int(big_m * 1024)
            else:
                percent = m
        else:
            percent = m if m is not None else EARLYOOM_DEFAULT_PERCENT
        break
    if percent is None:
        percent = EARLYOOM_DEFAULT_PERCENT
    out["mem_term_percent"] = percent
    if threshold is None and mem:
        # exact arithmetic: 2% of 126,701,056 kB must not come out one byte off
        threshold = int(Fraction(mem["mem_total_bytes"]) * Fraction(repr(percent)) / 100)
    out["sigterm_threshold_bytes"] = threshold
    return out


# -- docker -----------------------------------------------------------------------------------

def _docker_json(args: list[str], errors: list[str]) -> list:
    rc, out, err = run(["docker"] + args, DOCKER_TIMEOUT_S)
    try:
        data = json.loads(out) if out.strip() else []
    except ValueError:
        data = None
    if rc != 0:
        # e.g. a container removed between `ps` and `inspect`: keep what did come back
        errors.append(f"docker {args[0]}: " + (first_line(err) or f"exit {rc}"))
    if data is None:
        if rc == 0:
            errors.append(f"docker {args[0]}: output is not JSON")
        return []
    return data if isinstance(data, list) else []


def _ports(c: dict) -> list[int]:
    ports = set()
    for mapping in ((c.get("HostConfig") or {}).get("PortBindings") or {},
                    (c.get("NetworkSettings") or {}).get("Ports") or {}):
        for bindings in mapping.values():
            for b in bindings or []:
                try:
                    ports.add(int((b or {}).get("HostPort") or ""))
                except ValueError:
                    continue
    return sorted(ports)


def _wants_gpus(c: dict) -> bool:
    for req in (c.get("HostConfig") or {}).get("DeviceRequests") or []:
        caps = [cap for group in (req.get("Capabilities") or []) for cap in (group or [])]
        if "gpu" in caps or req.get("Driver") == "nvidia":
            return True
    return False


def docker(errors: list[str]) -> dict:
    try:
        rc, out, err = run(["docker", "ps", "-aq", "--no-trunc"], DOCKER_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        line = command_error("docker", exc)
        errors.append(line)
        return {"available": False, "error": line.split(": ", 1)[1]}
    if rc != 0:
        # daemon down or no permission: docker answers before touching any container
        msg = first_line(err) or first_line(out) or f"exit {rc}"
        errors.append(f"docker: {msg}")
        return {"available": False, "error": msg}
    try:
        ids = [x.strip() for x in out.splitlines() if x.strip()]
        raw = _docker_json(["inspect"] + ids, errors) if ids else []
        rc, out, err = run(["docker", "images", "-q", "--no-trunc"], DOCKER_TIMEOUT_S)
        if rc != 0:
            errors.append("docker images: " + (first_line(err) or f"exit {rc}"))
            out = ""
        image_ids = []
        # also inspect each container's image, so a dangling one still yields its digests
        for iid in [x.strip() for x in out.splitlines()] + [c.get("Image") or "" for c in raw]:
            if iid and iid not in image_ids:
                image_ids.append(iid)
        raw_images = _docker_json(["image", "inspect"] + image_ids, errors) if image_ids else []
    except (OSError, TimeoutError) as exc:
        errors.append(command_error("docker", exc))
        return {"available": True, "error": str(exc)}
    digests = {i.get("Id"): list(i.get("RepoDigests") or []) for i in raw_images}
    listed = set(x.strip() for x in out.splitlines() if x.strip())
    images = []
    for i in raw_images:
        if i.get("Id") not in listed:
            continue  # inspected only to resolve a container's digests
        refs = list(i.get("RepoTags") or []) or ["<none>:<none>"]
        for ref in refs:
            images.append({"ref": ref, "id": i.get("Id") or "", "digests": list(i.get("RepoDigests") or [])})
    containers = []
    for c in raw:
        state = c.get("State") or {}
        started = state.get("StartedAt")
        if not started or started.startswith("0001-01-01"):
            started = None  # docker's zero time: never started
        finished = state.get("FinishedAt")
        if not finished or finished.startswith("0001-01-01"):
            finished = None  # never ended
        labels = (c.get("Config") or {}).get("Labels") or {}
        containers.append({
            "id": c.get("Id") or "",
            "name": (c.get("Name") or "").lstrip("/"),
            "image": (c.get("Config") or {}).get("Image") or "",
            "image_id": c.get("Image"),
            "image_digests": digests.get(c.get("Image"), []),
            "state": state.get("Status") or "unknown",
            "started_at": started,
            "finished_at": finished,
            "exit_code": state.get("ExitCode") if not state.get("Running") else None,
            "labels": {str(k): str(v) for k, v in labels.items()},
            "host_ports": _ports(c),
            "network_mode": (c.get("HostConfig") or {}).get("NetworkMode"),
            "gpus": _wants_gpus(c),
        })
    return {"available": True, "error": None, "containers": containers, "images": images}


# -- listening TCP sockets -------------------------------------------------------------------

def _addr(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    # the kernel prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening(procs: dict[int, str], errors: list[str]) -> list[dict]:
    found: dict[tuple[str, int], int] = {}
    read_any = False
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = read_text(name).splitlines()[1:]
        except OSError as exc:
            if name.endswith("6") and isinstance(exc, FileNotFoundError):
                continue  # a kernel without IPv6 has no tcp6 table: nothing listens there
            # one table unread hides its listeners: said, so the conflicts check says unknown, never "free"
            errors.append(f"listening: cannot read {name}: {why(exc)}")
            continue
        read_any = True
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != "0A":
                continue
            try:
                ip_hex, port_hex = f[1].split(":")
                key = (_addr(ip_hex), int(port_hex, 16))
                inode = int(f[9])
            except ValueError:
                continue
            if key not in found or not found[key]:
                found[key] = inode
    if not read_any:
        return []
    owners = _socket_owners({i for i in found.values() if i}, procs)
    out = []
    for (address, port), inode in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        pid = owners.get(inode)
        out.append({"port": port, "address": address, "pid": pid, "process": procs.get(pid) if pid else None})
    return out


def _socket_owners(inodes: set[int], procs: dict[int, str]) -> dict[int, int]:
    """socket inode -> pid, from R/proc/<pid>/fd links (only processes we may read; best effort)."""
    owners: dict[int, int] = {}
    if not inodes:
        return owners
    for pid in sorted(procs):
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("socket:["):
                try:
                    inode = int(target[8:-1])
                except ValueError:
                    continue
                if inode in inodes and inode not in owners:
                    owners[inode] = pid
        if len(owners) == len(inodes):
            break
    return owners


# -- RDMA -----------------------------------------------------------------------------------

def _read_opt(path: str) -> str | None:
    try:
        return read_text(path).strip()
    except OSError:
        return None  # e.g. EINVAL from gid_attrs of an unpopulated entry


def _ipv4_of(gid: str) -> str | None:
    h = gid.replace(":", "").lower()
    if len(h) == 32 and h[:20] == "0" * 20 and h[20:24] == "ffff":
        return str(ipaddress.IPv4Address(bytes.fromhex(h[24:])))
    return None


def _ibdev2netdev(errors: list[str]) -> dict[tuple[str, int], str]:
    try:
        rc, out, err = run(["ibdev2netdev"], IB_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        if not isinstance(exc, FileNotFoundError):
            errors.append(command_error("ibdev2netdev", exc))
        return {}
    out_map: dict[tuple[str, int], str] = {}
    for line in out.splitlines():
        # rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)
        f = line.split()
        if len(f) >= 5 and f[1] == "port" and f[3] == "==>":
            try:
                out_map[(f[0], int(f[2]))] = f[4]
            except ValueError:
                continue
    return out_map


def rdma(errors: list[str]) -> list[dict]:
    base = "/sys/class/infiniband"
    try:
        hcas = sorted(os.listdir(base))
    except OSError:
        return []  # no RDMA devices: nothing to report (checks that need RDMA say so)
    ports = []
    for hca in hcas:
        try:
            port_names = sorted((p for p in os.listdir(f"{base}/{hca}/ports") if p.isdigit()), key=int)
        except OSError as exc:
            errors.append(f"rdma {hca}: cannot list ports: {why(exc)}")
            continue
        for pn in port_names:
            pdir = f"{base}/{hca}/ports/{pn}"
            state = _read_opt(pdir + "/state")
            if state and ":" in state:
                state = state.split(":", 1)[1].strip()  # "4: ACTIVE" -> "ACTIVE"
            gids = []
            try:
                idxs = sorted((i for i in os.listdir(pdir + "/gids") if i.isdigit()), key=int)
            except OSError:
                idxs = []
            for i in idxs:
                gid = _read_opt(f"{pdir}/gids/{i}")
                if not gid or not gid.replace(":", "").strip("0"):
                    continue  # unpopulated entry
                gids.append({"index": int(i), "gid": gid,
                             "type": _read_opt(f"{pdir}/gid_attrs/types/{i}") or None,
                             "ipv4": _ipv4_of(gid),
                             "netdev": _read_opt(f"{pdir}/gid_attrs/ndevs/{i}") or None})
            netdev = next((g["netdev"] for g in gids if g["netdev"]), None)
            if netdev is None:
                try:
                    nets = os.listdir(f"{base}/{hca}/device/net")
                except OSError:
                    nets = []
                if len(nets) == 1:
                    netdev = nets[0]
            ports.append({"hca": hca, "port": int(pn), "state": state, "netdev": netdev, "gids": gids})
    if any(p["netdev"] is None for p in ports):
        names = _ibdev2netdev(errors)
        for p in ports:
            if p["netdev"] is None:
                p["netdev"] = names.get((p["hca"], p["port"]))
    return ports


# -- mounts and paths ------------------------------------------------------------------------

def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as \040 \011 \012 \134
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def read_mounts(errors: list[str]) -> list[dict]:
    try:
        text = read_text(MOUNTS)
    except OSError as exc:
        errors.append(f"mounts: {why(exc)}")
        return []
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 3:
            out.append({"source": _unescape(f[0]), "target": _unescape(f[1]), "fstype": f[2],
                        "options": f[3] if len(f) > 3 else ""})
    return out


def mount_of(path: str, mounts: list[dict]) -> dict | None:
    """The mount `path` lives on: the longest matching target; the later of equal ones (it shadows)."""
    best = None
    for m in mounts:
        t = m["target"].rstrip("/") or "/"
        if t == "/" or path == t or path.startswith(t + "/"):
            if best is None or len(t) >= len(best["target"].rstrip("/") or "/"):
                best = m
    return best


def path_info(path: str, mounts: list[dict]) -> dict:
    real = path
    exists = os.path.exists(real)
    info: dict = {"path": path, "exists": exists, "is_dir": os.path.isdir(real)}
    # resolve symlinks so the mount is the one the data is on (a link into another filesystem)
    resolved = os.path.realpath(real)
    info["mount"] = mount_of(resolved, mounts)
    probe = real
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)  # a missing path: the space it would be created in
    try:
        st = os.statvfs(probe)
        info["free_bytes"] = st.f_bavail * st.f_frsize  # what a non-root writer can still use
        info["total_bytes"] = st.f_blocks * st.f_frsize
    except OSError:
        info["free_bytes"] = info["total_bytes"] = None
    return info


# -- fabric links and the stack's versions (issue 15) -----------------------------------------
# Plain absolute paths: on a node (real or the lab's own namespace) /sys/class/net is the kernel's.

NET = "/sys/class/net"
IB = "/sys/class/infiniband"
# the netdev's error counters (statistics/) and the RDMA port's (counters/), where the node has them
NET_COUNTERS = ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "rx_crc_errors")
# beside statistics/, not in it: the kernel keeps /sys/class/net/IFACE/carrier_changes (Documentation/ABI/
# testing/sysfs-class-net, since 3.15); reported with the counters
NET_LINK_COUNTERS = ("carrier_changes",)
IB_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
               "port_xmit_discards", "local_link_integrity_errors", "excessive_buffer_overrun_errors")
VERSION_TIMEOUT_S = 8.0


def _sys(path: str) -> str | None:
    """A sysfs value, or None: reading `speed` or `carrier` of a down link is EINVAL, not a value."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _sys_int(path: str) -> int | None:
    v = _sys(path)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _counters(directory: str, names: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for name in names:
        v = _sys_int(f"{directory}/{name}")
        if v is not None:
            out[name] = v
    return out


def net_link(iface: str) -> dict:
    """One interface as /sys/class/net shows it; `exists` False when the node has no such interface."""
    d = f"{NET}/{iface}"
    if "/" in iface or iface in ("", ".", "..") or not os.path.isdir(d):
        return {"name": iface, "exists": False}
    speed = _sys_int(d + "/speed")
    return {"name": iface, "exists": True, "operstate": _sys(d + "/operstate"),
            "carrier": _sys_int(d + "/carrier"),
            "speed_mbps": speed if speed is not None and speed > 0 else None,  # -1: unknown (virtual, down)
            "mtu": _sys_int(d + "/mtu"),
            "counters": {**_counters(d + "/statistics", NET_COUNTERS), **_counters(d, NET_LINK_COUNTERS)}}


def rdma_link(hca: str, port: int) -> dict:
    """A port's link layer, physical state, rate and error counters (the existing RDMA part has state/GIDs)."""
    d = f"{IB}/{hca}/ports/{port}"
    phys = _sys(d + "/phys_state")
    return {"link_layer": _sys(d + "/link_layer"),
            "phys_state": phys.split(":", 1)[1].strip() if phys and ":" in phys else phys,
            "rate": _sys(d + "/rate"),
            "counters": _counters(d + "/counters", IB_COUNTERS)}


def links(names: list[str]) -> dict[str, dict]:
    return {name: net_link(name) for name in names if isinstance(name, str)}


def _smi_versions(text: str) -> tuple[str | None, str | None]:
    """Driver and CUDA versions from nvidia-smi's banner ("Driver Version: 580.95.05   CUDA Version: 13.0")."""
    driver = cuda = None
    for line in text.splitlines():
        for key in ("Driver Version:", "CUDA Version:"):
            if key in line:
                words = line.split(key, 1)[1].split()
                if words:
                    if key.startswith("Driver"):
                        driver = words[0].strip("|")
                    else:
                        cuda = words[0].strip("|")
    return driver, cuda


def versions(errors: list[str]) -> dict:
    """Kernel release, NVIDIA driver and CUDA (nvidia-smi's banner): part of what must match across ranks."""
    out: dict = {"kernel": _sys("/proc/sys/kernel/osrelease") or os.uname().release,
                 "driver": None, "cuda": None, "docker": None}
    try:
        rc, text, err = run(["nvidia-smi"], GPU_TIMEOUT_S)
        if rc == 0:
            out["driver"], out["cuda"] = _smi_versions(text)
        else:
            errors.append("nvidia-smi (versions): " + (first_line(err) or first_line(text) or f"exit {rc}"))
    except (OSError, TimeoutError) as exc:
        errors.append(command_error("nvidia-smi (versions)", exc))
    return out


def docker_version(errors: list[str]) -> str | None:
    """The docker server's version (asked only of a daemon that answered `docker ps`)."""
    try:
        rc, text, err = run(["docker", "version", "--format", "{{.Server.Version}}"], VERSION_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        errors.append(command_error("docker version", exc))
        return None
    if rc != 0:
        errors.append("docker version: " + (first_line(err) or first_line(text) or f"exit {rc}"))
        return None
    return first_line(text) or None


def _new_errors(mine: list[str], reported: list[str]) -> list[str]:
    """The versions part's error lines, less those the GPU or docker part already gave (one cause, one line)."""
    said = {e.split(": ", 1)[-1] for e in reported}
    return [e for e in mine if e.split(": ", 1)[-1] not in said]


def file_hashes(paths: list[str]) -> dict[str, str | None]:
    """sha256 of each asked file (the lane's patch files), None where it cannot be read."""
    out: dict[str, str | None] = {}
    for p in paths:
        if not isinstance(p, str) or p in out:
            continue
        try:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out[p] = h.hexdigest()
        except OSError:
            out[p] = None
    return out


# -- main -------------------------------------------------------------------------------------

def part(name: str, errors: list[str], fn, *args, default=None):
    """Run one part; an unexpected failure there is an error line, never a lost document."""
    try:
        return fn(*args)
    except Exception as exc:  # the rest of the node's facts must still be reported
        errors.append(f"{name}: helper failed: {type(exc).__name__}: {exc}")
        return default


def gather(request: dict) -> dict:
    errors: list[str] = []
    # the slow parts are external commands: run them beside the file reads
    gpu_errors: list[str] = []
    docker_errors: list[str] = []
    results: dict = {}
    version_errors: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.__setitem__(
            "gpus", part("nvidia-smi", gpu_errors, gpus, gpu_errors, default=[])), daemon=True),
        threading.Thread(target=lambda: results.__setitem__(
            "versions", part("versions", version_errors, versions, version_errors)), daemon=True),
        threading.Thread(target=lambda: results.__setitem__(
            "docker", part("docker", docker_errors, docker, docker_errors)), daemon=True),
    ]
    for t in threads:
        t.start()
    mem = part("meminfo", errors, meminfo, errors)
    up = part("uptime", errors, uptime, errors)
    procs = part("processes", errors, processes, default={})
    eo = part("earlyoom", errors, earlyoom, procs, mem, errors)
    listeners = part("listening", errors, listening, procs, errors, default=[])
    ports = part("rdma", errors, rdma, errors, default=[])
    for p in ports:
        p.update(part(f"rdma link {p['hca']}", errors, rdma_link, p["hca"], p["port"], default={}))
    fabric = part("links", errors, links, list(request.get("interfaces") or []), default={})
    hashes = part("hashes", errors, file_hashes, list(request.get("hash_paths") or []), default={})
    mounts = part("mounts", errors, read_mounts, errors, default=[])
    paths = {}
    for p in request.get("paths") or []:
        if isinstance(p, str) and p not in paths:
            info = part(f"path {p}", errors, path_info, p, mounts)
            paths[p] = info if info is not None else {"path": p, "exists": False}
    keep = []
    for m in [m for m in mounts if m["fstype"] in NETWORK_FS] + [i.get("mount") for i in paths.values()]:
        if m and m not in keep:
            keep.append(m)
    for t in threads:
        t.join()
    stack = results.get("versions")
    if stack is not None and (results.get("docker") or {}).get("available"):
        stack["docker"] = part("docker version", version_errors, docker_version, version_errors)
    name = hostname()
    # the last reading of the node's clock before the document leaves: the controller compares it with
    # the moment the answer arrived (clock skew between nodes, checks/drift.py)
    return {
        "node": request.get("node") or name,
        "hostname": name,
        "collected_at": time.time(),
        "uptime_s": up,
        "helper_version": HELPER_VERSION,
        "meminfo": mem,
        "gpus": results.get("gpus", []),
        "earlyoom": eo,
        "docker": results.get("docker"),
        "listening": listeners,
        "rdma": ports,
        "mounts": keep,
        "paths": paths,
        "links": fabric,
        "versions": results.get("versions"),
        "hashes": hashes,
        "errors": errors + gpu_errors + docker_errors + _new_errors(version_errors, gpu_errors + docker_errors),
    }


def main() -> int:
    text = sys.stdin.read() if not sys.stdin.isatty() else ""
    try:
        request = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        sys.stderr.write(f"facts.py: the request on stdin is not JSON: {exc}\n")
        return 2
    if not isinstance(request, dict):
        sys.stderr.write("facts.py: the request on stdin must be a JSON object\n")
        return 2
    sys.stdout.write(json.dumps(gather(request)) + "\n")  # paths keep the order asked
    return 0


if __name__ == "__main__":
    sys.exit(main())
