"""The node's sandbox and its sim state (R/var/lib/sparkfleet-sim): load, save, lock, time formats.

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any

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
