"""Run a command as if `root` were a node's whole filesystem (bubblewrap), for hand-built node fixtures.

The node-side helpers read a node's real paths (/proc/meminfo, /etc/mtab, /sys/class/infiniband, ...);
a test builds those files under a directory and runs the helper with that directory as `/`: every
top-level entry of `root` is bound at `/<entry>` (so the fixture's own proc/, etc/, sys/ replace the
real ones), this machine's /usr, /bin, /lib* read-only where the fixture has none, the Python running
the tests read-only, and `extra` paths (a bin dir of fake tools that log their calls) bound where they are.
Nothing is bound onto a path of this machine: the root is a tmpfs.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from sparkfleet.sim import node

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def argv_in_root(root: Path, argv: list[str], *, extra: list[Path] = (), hostname: str | None = None) -> list[str]:
    args = [node.bwrap_path() or "bwrap", "--unshare-pid"]
    if hostname:
        args += ["--unshare-uts", "--hostname", hostname]
    args += ["--tmpfs", "/"]
    entries = sorted(os.listdir(root))
    for entry in entries:
        args += ["--bind", str(root / entry), f"/{entry}"]
    for p in SYSTEM:
        if p.lstrip("/") in entries:
            continue
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    for p in node.python_roots():
        args += ["--ro-bind", p, p]
    for p in map(str, extra):
        args += ["--bind", p, p]
    if "proc" not in entries:
        args += ["--proc", "/proc"]
    args += ["--dev", "/dev"]
    return args + ["--", *argv]


def run_in_root(root: Path, argv: list[str], *, extra: list[Path] = (), hostname: str | None = None,
                **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv_in_root(root, argv, extra=extra, hostname=hostname), **kwargs)


def write_wrapper(root: Path, path: Path, *, extra: list[Path] = (), env: dict[str, str] | None = None) -> Path:
    """A node `wrapper` (inventory field) that runs each command with `root` as the node's filesystem,
    HOME=/home (root/home), PATH=/bin:/usr/bin (root/bin first, where the fixture has one) and `env`
    (the node's own environment: the local transport passes nothing of this machine's)."""
    args = argv_in_root(root, [], extra=extra)[:-1]  # up to and with "--"
    own = " ".join(shlex.quote(f"{k}={v}") for k, v in (env or {}).items())
    path.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in args)
                    + f" /usr/bin/env HOME=/home PATH=/bin:/usr/bin {own} "
                    "/usr/bin/sh -c 'cd \"$HOME\" && exec \"$@\"' sh \"$@\"\n")
    path.chmod(0o755)
    return path
