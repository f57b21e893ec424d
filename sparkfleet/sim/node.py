"""A simulated node as a machine: its own root, processes and hostname (and, as root, its own network).

Each node runs one long-lived init under bubblewrap (docs/sim-layout.md):

- a tmpfs root; every top-level directory of the node's own tree `nodes/<node>/fs/` (the inventory's
  model root, NFS mount, Engram and cache dirs, /home or /root, /var, /tmp, /run, /sys ...) bound
  read-write at its node path, so `/nvme/engram-local` on the node is `fs/nvme/engram-local` here;
- the host's /usr, /bin, /sbin, /lib* read-only; /etc entry by entry read-only, except the node's own
  /etc/hostname, /etc/mtab and /etc/default/earlyoom; the Python that runs the sim engine read-only;
- its own pid namespace with a fresh /proc, the node's /proc/meminfo and /proc/uptime bound over it;
- the sim's shims (nvidia-smi, docker, ...) bound read-only at /usr/local/bin, first on every PATH;
- its own hostname (uts namespace); as root, its own network namespace `sfsim-<node>` (lab.py wires it).

Commands enter the running node with nsenter (the `enter` script sim up writes, which the local
transport runs commands under); in ssh mode the node's sshd runs inside it, so sessions are in it too.
Nothing is ever bound onto a path of the host: every mount point lies in the node's tmpfs or its tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import sparkfleet
from sparkfleet.fleet.local import NOT_RUN_FD
from sparkfleet.schema.errors import UserError
from sparkfleet.sim import shim
from sparkfleet.sim.daemon import alive_as
from sparkfleet.sim.vllmbuild import built as vllm_built

SYSTEM_RO = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_TOP = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev"}
SHIM_DIR = "/usr/local/bin"  # the shims, bound over the host's /usr/local/bin: first on the default PATH
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# /etc entries the node has of its own (the rest: the host's); the last two: the clock-skew fault (sim/clock.py)
OWN_ETC = {"hostname", "mtab", "default", "docker", "ld.so.preload", "sparkfleet-sim-clock"}
NSENTER = "/usr/bin/nsenter"
BWRAP_CANDIDATES = ("/usr/bin/bwrap", "/usr/local/bin/bwrap")
START_TIMEOUT_S = 10.0
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")  # what bubblewrap's --dev makes, less devpts


def bwrap_path() -> str | None:
    for c in BWRAP_CANDIDATES:
        if os.access(c, os.X_OK):
            return c
    return shutil.which("bwrap")


def missing_privileges(netns: bool) -> list[str]:
    """What this machine lacks to run simulated nodes (empty: nothing). Checked before anything is created."""
    missing = []
    if bwrap_path() is None:
        missing.append("bubblewrap (apt-get install bubblewrap)")
    if not os.access(NSENTER, os.X_OK):
        missing.append("nsenter (util-linux)")
    if netns and os.geteuid() != 0:
        missing.append("root (network namespaces)")
    if os.geteuid() != 0 and not missing:
        probe = subprocess.run([bwrap_path() or "bwrap", "--unshare-user", "--ro-bind", "/", "/", "true"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            why = (probe.stderr.strip().splitlines() or ["bwrap failed"])[-1]
            missing.append(f"unprivileged user namespaces ({why}); or run as root")
    return missing


def home_dir() -> str:
    """The node user's home (the same user as on this machine, as in the sim's ssh mode)."""
    return pwd.getpwuid(os.getuid()).pw_dir


def vllm_roots() -> list[str]:
    """The lab's vLLM build (sim/vllmbuild.py), when there is one: its venv and checkpoint, bound like Python's."""
    tree = vllm_built()
    return [str(tree)] if tree else []


def python_roots() -> list[str]:
    """Directories the sim engine's Python needs, bound read-only into each node at the same paths."""
    package_root = str(Path(sparkfleet.__file__).resolve().parent.parent)
    out: list[str] = []
    for p in (sys.base_prefix, sys.prefix, package_root, *vllm_roots()):
        p = os.path.realpath(p)
        if any(p == s or p.startswith(s + "/") for s in SYSTEM_RO):
            continue
        if not any(p == o or p.startswith(o + "/") for o in out):
            out = [o for o in out if not o.startswith(p + "/")] + [p]
    return out


def _ro_tree(host_dir: str, node_dir: str, skip: set[str]) -> list[str]:
    """Bind each entry of a host directory read-only (symlinks copied as symlinks), except `skip`."""
    args: list[str] = []
    for name in sorted(os.listdir(host_dir)):
        if name in skip:
            continue
        src = os.path.join(host_dir, name)
        if os.path.islink(src):
            args += ["--symlink", os.readlink(src), f"{node_dir}/{name}"]
        elif os.path.isdir(src) or os.path.isfile(src):
            args += ["--ro-bind", src, f"{node_dir}/{name}"]
    return args


def node_root_user(*, ssh: bool) -> bool:
    """Whether commands run as root inside the node. As root, always (the lab's nodes are entered as root:
    its inventory's ssh.user). Without root, the local lab's user namespace maps this user to uid 0 (root
    there, nowhere else), so `up` can do what needs root on a node (drop the page cache) as on the lab. Not
    in ssh mode: sshd must switch to the login user, and a user namespace made without root maps one uid."""
    return os.geteuid() == 0 or not ssh


def bwrap_args(node_dir: Path, hostname: str, *, userns: bool, caps: bool, root: bool = True,
               dockerd: bool = False) -> list[str]:
    """The bubblewrap command line of the node's init (everything the node is, as mounts); `root`: the
    node's user is uid 0 in its user namespace (with userns), else this user's own uid. `dockerd`: the
    node runs its own Docker daemon, which needs this machine's cgroups at /sys/fs/cgroup (the rest of
    the node's /sys stays its own) and the RDMA device nodes a lane hands its containers."""
    fs = node_dir / "fs"
    args = [bwrap_path() or "bwrap", "--unshare-pid", "--unshare-uts", "--unshare-ipc", "--hostname", hostname]
    if userns:
        uid, gid = (0, 0) if root else (os.getuid(), os.getgid())
        args += ["--unshare-user", "--uid", str(uid), "--gid", str(gid)]
    if caps:
        args += ["--cap-add", "ALL"]  # root's node: its sshd drops privileges per session, as on a real node
    args += ["--tmpfs", "/"]
    for entry in sorted(os.listdir(fs)):
        if entry in SYSTEM_TOP:
            raise UserError(f"simulated node {hostname}: /{entry} is shared read-only with this machine; "
                            "keep the inventory's paths out of it")
        args += ["--bind", str(fs / entry), f"/{entry}"]
    for p in SYSTEM_RO:
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    args += ["--dir", "/etc"] + _ro_tree("/etc", "/etc", OWN_ETC)
    args += ["--dir", "/etc/default"]
    if os.path.isdir("/etc/default"):
        args += _ro_tree("/etc/default", "/etc/default", {"earlyoom"})
    for p in python_roots():
        args += ["--ro-bind", p, p]
    args += ["--ro-bind", str(node_dir / "bin"), SHIM_DIR, "--proc", "/proc", *dev_args(userns and not root)]
    if dockerd:
        args += ["--bind", CGROUPS, CGROUPS, *rdma_devices(fs)]
    for node_path in shim.BOUND_FILES:
        args += ["--ro-bind", str(shim.bound_source(fs, node_path)), node_path]
    args += ["--chdir", home_dir(), "--clearenv", "--setenv", "PATH", NODE_PATH, "--setenv", "HOME", home_dir()]
    return args


def dev_args(nests: bool) -> list[str]:
    """The node's /dev: bubblewrap's own (`--dev`), unless that would nest user namespaces (`nests`: without
    root, for a node user other than uid 0). There `--dev` makes bubblewrap map the user to uid 0 first (to
    mount devpts), then nest a second user namespace for the sandbox's uid; the node's mount, ipc, uts and
    pid namespaces belong to the first, which no process stays in, so nothing outside could ever enter the
    node (nsenter: "reassociate to namespace 'ns/ipc' failed: Operation not permitted"). That node gets the
    host's harmless devices bound one by one instead, so its one user namespace owns all the others."""
    if not nests:
        return ["--dev", "/dev"]
    args = ["--dir", "/dev"]
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        args += ["--symlink", target, f"/dev/{name}"]
    return args + ["--perms", "1777", "--tmpfs", "/dev/shm"]


CGROUPS = "/sys/fs/cgroup"


def rdma_devices(fs: Path) -> list[str]:
    """/dev/infiniband as a node with its HCAs has it (one uverbs per port, rdma_cm), for `--device
    /dev/infiniband`: dockerd reads each device's type and numbers. Each is this machine's /dev/null (a
    character device that does nothing), named as the RDMA stack names its devices."""
    try:
        ports = len(shim.load(fs, "node.json")["rdma"])
    except (OSError, ValueError, KeyError, TypeError):
        ports = 0
    args = ["--dir", "/dev/infiniband", "--dev-bind", "/dev/null", "/dev/infiniband/rdma_cm"]
    for i in range(ports):
        args += ["--dev-bind", "/dev/null", f"/dev/infiniband/uverbs{i}"]
    return args


def init_path(node_dir: Path) -> Path:
    return node_dir / "init.json"


def start(node_dir: Path, hostname: str, *, netns: str | None, sshd: list[str] | None, dockerd: bool = False) -> int:
    """Start the node's init (returns its pid on this machine) and wait until it says it is up."""
    userns = os.geteuid() != 0
    argv = bwrap_args(node_dir, hostname, userns=userns, caps=not userns, root=node_root_user(ssh=bool(sshd)),
                      dockerd=dockerd)
    info_r, info_w = os.pipe()
    argv[1:1] = ["--info-fd", str(info_w)]
    argv += ["--", "/usr/bin/python3", f"{SHIM_DIR}/sim-node-init", *(["--sshd", *sshd] if sshd else [])]
    if netns:
        # nsenter, not `ip netns exec`: that also mounts a fresh /sys, without this machine's cgroups, which
        # the node's dockerd needs (it stops with "Devices cgroup isn't mounted")
        argv = [NSENTER, f"--net=/run/netns/{netns}", "--", *argv]
    ready = node_dir / "fs" / shim.STATE / "init.ready"
    ready.unlink(missing_ok=True)
    with open(node_dir / "node.log", "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                pass_fds=(info_w,), start_new_session=True)
    os.close(info_w)
    with os.fdopen(info_r) as fh:
        info = fh.read()
    try:
        child = int(json.loads(info)["child-pid"])
    except (ValueError, KeyError):
        proc.wait(5)
        raise UserError(f"simulated node {hostname} did not start: {_tail(node_dir / 'node.log')}") from None
    init_path(node_dir).write_text(json.dumps({"pid": child, "bwrap": proc.pid, "netns": netns,
                                              "userns": userns}) + "\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready.is_file():
            return child
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    stop(node_dir)
    raise UserError(f"simulated node {hostname} did not come up: {_tail(node_dir / 'node.log')}")


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"


def running_pid(node_dir: Path) -> int | None:
    """The init's pid, only while that process is this node's (pids get reused)."""
    try:
        pid = int(json.loads(init_path(node_dir).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None
    try:
        if os.path.isfile(f"/proc/{pid}/root/{shim.STATE}/node.json"):
            return pid
    except OSError:
        pass
    return None


def stop(node_dir: Path, timeout_s: float = 5.0) -> bool:
    """End the node: its init and with it every process in its pid namespace. True if it was running."""
    return stop_all([node_dir], timeout_s)[0]


def stop_all(node_dirs: list[Path], timeout_s: float = 5.0) -> list[bool]:
    """End every node at once (stop, for a whole lab): each init is killed before any is waited for, so the
    nodes' pid namespaces empty in parallel. Per node, True if it was running."""
    infos: list[tuple[list[int], bool]] = []
    for node_dir in node_dirs:
        try:
            info = json.loads(init_path(node_dir).read_text())
        except (OSError, ValueError):
            infos.append(([], False))
            continue
        infos.append(([int(info["pid"]), int(info["bwrap"])], running_pid(node_dir) is not None))
    # The namespace's init (bwrap's pid 1) takes only SIGKILL from outside; it takes every process of the
    # node with it (a node's dockerd, containerd, its shims and their containers' nested pid namespaces too),
    # and the bwrap monitor exits when it has.
    pids = [pid for own, _was in infos for pid in own]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive_as(p) for p in pids):
        _reap(pids)
        time.sleep(0.01)
    _reap(pids)
    for node_dir, (own, _was) in zip(node_dirs, infos, strict=True):
        if own:
            init_path(node_dir).unlink(missing_ok=True)
    return [was for _own, was in infos]


def _reap(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def enter_script(node_dir: Path, node: str, *, netns: bool, userns: bool, root: bool = True) -> str:
    """The wrapper the local transport runs each command under: it enters the running node (or answers
    as ssh does for a host that cannot be reached, exit 255).

    Without root it joins the node's user namespace first (--preserve-credentials: the same uid there),
    which owns the node's other namespaces (dev_args). What nsenter itself says (it could not enter, or
    not start the node's shell) goes to the local transport's status pipe, fd $SPARKFLEET_NOT_RUN_FD, so
    a command that never ran is told from one that ran and failed; the command never sees that fd."""
    ns = "-m -u -i -p" + (" -n" if netns else "") + (" -U --preserve-credentials" if userns else "")
    d = shlex.quote(str(node_dir))
    state = shlex.quote(shim.STATE)
    user = "root" if root else shlex.quote(pwd.getpwuid(os.getuid()).pw_name)  # as `id -un` says there
    inner = "exec 2>&8 8>&- 9>&-; exec /usr/bin/env -u " + NOT_RUN_FD + " -u " + CONSOLE_ENV + ' "$@"'
    # bash, not sh: the status pipe's fd may be 10 or more, which dash cannot name in a redirection
    return (f"#!/bin/bash\n# SIMULATION: run a command on simulated node {node} (written by `sparkfleet sim up`)\n"
            f"d={d}\n"
            f'fd=${{{NOT_RUN_FD}:-}}\n'
            'case "$fd" in 9) ;; [0-2]|""|*[!0-9]*) exec 9>&2 ;; *) exec 9>&"$fd" {fd}>&- ;; esac\n'
            f'pid=$(sed -n \'s/.*"pid": \\([0-9]*\\).*/\\1/p\' "$d/init.json" 2>/dev/null)\n'
            f'if {{ [ -e "$d/unreachable" ] && [ -z "${{{CONSOLE_ENV}:-}}" ]; }} || [ -z "$pid" ] '
            f'|| [ ! -f "/proc/$pid/root/"{state}/node.json ]; then\n'
            f'  echo "ssh: connect to host {node} port 22: No route to host" >&2\n  exit 255\nfi\n'
            f'if [ ! -x {NSENTER} ]; then\n'
            f'  echo "cannot enter simulated node {node}: {NSENTER} is not installed here (util-linux)" >&9\n'
            f"  exit 125\nfi\n"
            f"exec 8>&2\n"
            f"exec {NSENTER} -t \"$pid\" {ns} -r -w -- /bin/sh -c {shlex.quote(inner)} sh PATH={NODE_PATH} "
            f"HOME={shlex.quote(home_dir())} USER={user} LOGNAME={user} SHELL=/bin/bash LANG=C.UTF-8 \"$@\" 2>&9\n")


# Set by the lab's own hand (run_in, Sim.exec): it enters the node as its console does, also while the
# unreachable fault makes the wrapper answer the controller's transport as ssh does for a host it cannot reach.
CONSOLE_ENV = "SPARKFLEET_SIM_CONSOLE"


def enter_path(node_dir: Path) -> Path:
    return node_dir / "enter"


def run_in(node_dir: Path, argv: list[str], *, timeout_s: float = 30.0, detach: bool = False,
           stdin: bytes | None = None) -> subprocess.CompletedProcess | None:
    """Run a command inside the node from the controller's side (faults, heal); detach: leave it running."""
    cmd = [str(enter_path(node_dir)), *argv]
    if detach:
        subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env={CONSOLE_ENV: "1"})
        return None
    return subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout_s, env={CONSOLE_ENV: "1"})
