"""A lab node's own Docker daemon, from the controller's side: wait for it, give it the lab's images, stop and
start it (the docker-down fault), and remove what it leaves on this machine (its containers' cgroups). `sim down`
does not stop it: ending the node ends its daemon and containers (lab.down).

The daemon itself runs inside the node (its init starts it: shim/node.py dockerd_argv), so its data-root,
exec-root and socket are in the node's tree, `--network host` is the node's namespace and `-v /nvme/...`
is the node's /nvme. Debian's `docker.io` (dockerd 20.10) provides it; root only.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from sparkfleet.schema.errors import UserError
from sparkfleet.sim import node, shim
from sparkfleet.sim.shim.node import DOCKERD_LOG, DOCKERD_PID, dockerd_argv

DOCKERD = "/usr/sbin/dockerd"
READY_TIMEOUT_S = 30.0  # dockerd 20.10 answers in about a second here; a loaded 2-core machine is slower
STOP_TIMEOUT_S = 20.0  # dockerd stops its containers (10 s grace each, in parallel) before it exits
CGROUP_ROOT = Path("/sys/fs/cgroup")


def missing() -> list[str]:
    """What this machine lacks to give lab nodes their own dockerd (empty: nothing)."""
    out = []
    if os.geteuid() != 0:
        out.append("root (a Docker daemon needs it)")
    for exe, pkg in ((DOCKERD, "docker.io"), ("/usr/bin/docker", "docker.io"), ("/usr/sbin/runc", "runc")):
        if not os.access(exe, os.X_OK):
            out.append(f"{exe} (apt-get install {pkg})")
    return out


def cgroup_parent(name: str) -> str:
    """The node's parent cgroup for its containers (relative: under the daemon's own cgroup)."""
    return f"sfsim-{name}"


def log_tail(node_dir: Path) -> str:
    try:
        lines = (node_dir / "fs" / DOCKERD_LOG.lstrip("/")).read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no dockerd log"
    return lines[-1] if lines else "dockerd logged nothing"


def wait_ready(node_dir: Path, name: str, timeout_s: float | None = None) -> None:
    """Until the node's `docker version` reaches its daemon (within READY_TIMEOUT_S); else a UserError
    naming the node and the last line of its dockerd's log."""
    timeout_s = READY_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    while True:
        r = node.run_in(node_dir, ["/usr/bin/docker", "version", "--format", "{{.Server.Version}}"], timeout_s=10)
        if r is not None and r.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise UserError(f"simulated node {name}: its Docker daemon did not come up within {timeout_s:.0f} s: "
                            f"{log_tail(node_dir)}")
        time.sleep(0.1)


def load_images(node_dir: Path, name: str, archive: bytes) -> None:
    """`docker load` the lab's image archive on the node (the same ids everywhere)."""
    r = node.run_in(node_dir, ["/usr/bin/docker", "load", "-q"], stdin=archive, timeout_s=120)
    if r is None or r.returncode != 0:
        why = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()[-1:] if r else ["no answer"]
        raise UserError(f"simulated node {name}: docker load of the lab's images failed: {' '.join(why)}")


def _pid(node_dir: Path) -> int | None:
    try:
        return int((node_dir / "fs" / DOCKERD_PID.lstrip("/")).read_text().strip())
    except (OSError, ValueError):
        return None


def start_daemon(node_dir: Path, name: str) -> None:
    """Start the node's dockerd again (as its init does) and wait until it answers."""
    argv = dockerd_argv(shim.load(node_dir / "fs", "node.json"))
    node.run_in(node_dir, ["/bin/sh", "-c", f'rm -f {DOCKERD_PID}; exec "$@" >>{DOCKERD_LOG} 2>&1', "sh", *argv],
                detach=True)
    wait_ready(node_dir, name)


def stop_daemon(node_dir: Path) -> None:
    """SIGTERM to the node's dockerd (it stops its containers and containerd), then wait until both are gone."""
    if _pid(node_dir) is None:
        return
    node.run_in(node_dir, ["/bin/sh", "-c", f"kill -TERM $(cat {DOCKERD_PID}) 2>/dev/null"], timeout_s=5)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        r = node.run_in(node_dir, ["/bin/sh", "-c", "pgrep -x dockerd || pgrep -x containerd"], timeout_s=5)
        if r is None or r.returncode != 0:
            return
        time.sleep(0.1)


def own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 hierarchy mount dir (the daemons inherit it: their parent's)."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _hid, controllers, path = line.split(":", 2)
            for c in controllers.split(","):
                name = c.removeprefix("name=") if c else "unified"
                out[name] = path
    return out


def cgroup_dirs(parent: str) -> list[Path]:
    """The node's parent cgroup in every hierarchy where it exists."""
    out = []
    if not CGROUP_ROOT.is_dir():
        return out
    mine = own_cgroups()
    for mount in sorted(CGROUP_ROOT.iterdir()):
        rel = mine.get(mount.name, "/").lstrip("/")
        d = mount / rel / parent
        if d.is_dir():
            out.append(d)
    return out


def remove_cgroups(parent: str, wait_s: float = 2.0) -> list[Path]:
    """rmdir the node's parent cgroup and any container cgroups left under it (a cgroup dir goes with
    rmdir once no process is in it; its files are the kernel's). A process the kernel is still ending keeps
    its cgroup busy: tried again for up to `wait_s`."""
    gone: list[Path] = []
    deadline = time.monotonic() + wait_s
    while True:
        for top in cgroup_dirs(parent):
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: -t[0].count("/")):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)
            if not top.exists():
                gone.append(top)
        if not cgroup_dirs(parent) or time.monotonic() > deadline:
            return gone
        time.sleep(0.05)
