"""Run a command as if on a machine of its own, so two lab streams of the suite run at once (issue 40).

The sim lab is one per machine: its nodes' network namespaces and bridges have fixed names and subnets, a local
lane serves at 127.0.0.1:8410, Slurm's munge socket is /run/sparkfleet-sim-munge, each node's dockerd puts its
containers under the cgroup `sfsim-<node>` next to its own, and tests judge what is left running by reading
/proc. So the command gets, as root:

- its own network namespace (loopback up): ports, bridges, subnets and routes are its own;
- its own mount namespace with an empty tmpfs on /run/netns (shared, as `ip netns add` leaves it) and on the
  munge socket's dir: `ip netns add` makes a file there, and the other stream's files would be name clashes;
- its own PID namespace with /proc remounted: it sees only its own processes, and when the command ends the
  kernel kills what it left (this script is the namespace's init and reaps every orphan, as an init does,
  so a test waiting for a killed daemon to be gone does not wait on a zombie);
- its own child cgroup in every hierarchy this process is in, so `sfsim-<node>` is a different directory for
  each stream; it is removed at the end.

`python3 tests/labmachine.py --can` exits 0 when this machine allows all that (root, unshare), else 1 and
says why; the Makefile then runs the lab's tests in one stream, as before.

Usage: python3 tests/labmachine.py NAME -- COMMAND [ARG...]   (NAME names the cgroup: sflab-NAME-<pid>)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PRIVATE_DIRS = ("/run/netns", "/run/sparkfleet-sim-munge")  # sparkfleet/sim/netlab.py, sparkfleet/sim/slurm.py
INIT = "--init"


def why_not() -> str | None:
    """Why this machine cannot give a command a machine of its own (None: it can)."""
    if os.geteuid() != 0:
        return "not root (network, mount and PID namespaces and cgroups need it)"
    for exe in ("unshare", "ip", "mount"):
        if shutil.which(exe) is None:
            return f"{exe} not found"
    return None


def own_cgroups() -> list[Path]:
    """This process's cgroup directory in every mounted hierarchy (v1 controllers, or v2's unified one)."""
    dirs = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            mount = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.procs").exists() else CGROUP_ROOT / "unified"
        else:
            name = controllers.removeprefix("name=")
            mount = CGROUP_ROOT / name
        top = mount / path.lstrip("/")
        if (top / "cgroup.procs").exists():
            dirs.append(top)
    return dirs


def enter_cgroups(name: str) -> list[Path]:
    """Make a child cgroup named `name` under each of this process's and move this process into it."""
    made = []
    for top in own_cgroups():
        child = top / name
        try:
            child.mkdir()
            (child / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:  # v2 with its controllers in the parent (no internal process), or a read-only one
            if child.exists() and not (child / "cgroup.procs").read_text().strip():
                child.rmdir()
            continue
        made.append(child)
    return made


def leave_cgroups(made: list[Path], wait_s: float = 10.0) -> None:
    """Back to the parents, then remove the children (a cgroup goes once its last process has)."""
    for child in made:
        try:
            (child.parent / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            pass
    deadline = time.monotonic() + wait_s
    for child in made:
        while True:
            try:
                child.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    print(f"labmachine: cgroup {child} still busy, left", file=sys.stderr)
                    break
                time.sleep(0.2)


def init(command: list[str]) -> int:
    """PID 1 of the namespace: set the machine up, run the command, reap every child, return its status."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for d in PRIVATE_DIRS:
        os.makedirs(d, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755,size=1m", "labmachine", d], check=True)
    # shared, as `ip netns add` makes it the first time (so a test comparing the mounts before and after a lab
    # does not see that first change as the lab's)
    subprocess.run(["mount", "--make-shared", "/run/netns"], check=True)
    child = subprocess.Popen(command)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code  # killed by a signal: the shell's 128+N


def main(argv: list[str]) -> int:
    if argv[:1] == ["--can"]:
        reason = why_not()
        if reason:
            print(f"labmachine: {reason}: the lab's tests run in one stream")
        return 0 if reason is None else 1
    if argv[:1] == [INIT]:
        return init(argv[1:])
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    reason = why_not()
    if reason:
        print(f"labmachine: {reason}", file=sys.stderr)
        return 2
    made = enter_cgroups(f"sflab-{argv[0]}-{os.getpid()}")
    try:
        proc = subprocess.Popen(["unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child",
                                 sys.executable, os.path.abspath(__file__), INIT, *argv[2:]])
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda s, _f: proc.send_signal(s))
        return proc.wait()
    finally:
        leave_cgroups(made)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
