"""The node's own processes: its init and the earlyoom it runs.

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .state import STATE, load, write_bytes

if TYPE_CHECKING:  # for annotations only: the functions import it when they run (the package docstring)
    import subprocess


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


DOCKERD_LOG = "/var/log/dockerd.log"
DOCKERD_PID = "/run/docker.pid"


def dockerd_argv(node: dict) -> list[str]:
    """The node's own Docker daemon (Debian's dockerd): its own data-root, exec-root and socket in the node's
    tree, vfs storage, no iptables, NAT or bridge (the node's network is its namespace; lanes use the host
    network), its containers' cgroups under one parent `sim down` removes, and the sim's stand-in for
    NVIDIA's runtime as the default runtime, as on a DGX (shim/runtime.py)."""
    d = node["dockerd"]
    # the lab's registry (sim/registry.py): the Docker Hub mirror, pushed to over plain HTTP (its own network)
    mirror = ["--registry-mirror", f"http://{d['registry']}", "--insecure-registry", d["registry"]] \
        if d.get("registry") else []
    return ["/usr/sbin/dockerd", "--data-root", "/var/lib/docker", "--exec-root", "/run/docker",
            "-H", "unix:///run/docker.sock", "--pidfile", DOCKERD_PID, "--storage-driver", "vfs",
            "--iptables=false", "--ip-masq=false", "--bridge=none", "--userland-proxy=false",
            "--exec-opt", "native.cgroupdriver=cgroupfs", "--cgroup-parent", d["cgroup_parent"],
            "--add-runtime", "nvidia=/usr/local/bin/sim-nvidia-runtime", "--default-runtime", "nvidia", *mirror]


def start_dockerd(node: dict) -> subprocess.Popen:
    """Start the node's dockerd (a stale pid file from a node that lost power is cleared first: dockerd
    refuses to start over one whose pid is alive, and pids repeat in a fresh pid namespace)."""
    import subprocess

    with contextlib.suppress(FileNotFoundError):
        os.unlink(DOCKERD_PID)
    os.makedirs(os.path.dirname(DOCKERD_LOG), exist_ok=True)
    with open(DOCKERD_LOG, "ab") as log:
        return subprocess.Popen(dockerd_argv(node), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def keep_uptime(root: Path, every_s: float = 1.0) -> None:
    """The node's /proc/uptime counts, as the kernel's does: rewritten in place every second while the node runs
    (a file the sim binds there cannot count by itself)."""
    from .render import bound_source, uptime_line
    from .state import locked, write_in_place

    path = bound_source(root, "/proc/uptime")
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # a state file mid-write: next second
            with locked(root):
                write_in_place(path, uptime_line(load(root, "node.json")).encode())
        time.sleep(every_s)


def sim_node_init(argv: list[str], root: Path) -> int:
    """The node's init: earlyoom (unless the earlyoom-off fault is on), the node's own dockerd when it has
    one, in ssh mode the node's sshd, then it waits; SIGTERM ends the node (and the pid namespace with it)."""
    import subprocess

    children: list[subprocess.Popen] = []
    node = load(root, "node.json")
    if node.get("dockerd") and "docker-down" not in load(root, "faults.json")["faults"]:
        children.append(start_dockerd(node))
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
        for c in children:  # dockerd stops its containers and containerd before it exits
            with contextlib.suppress(Exception):
                c.wait(30)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    threading.Thread(target=keep_uptime, args=(root,), daemon=True).start()
    write_bytes(root / STATE / "init.ready", f"{os.getpid()}\n".encode())
    while True:
        try:
            os.wait()
        except ChildProcessError:
            signal.pause()
