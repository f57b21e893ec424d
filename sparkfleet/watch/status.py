"""The watch status file: what a running (or ended) watch says about its lane, for the exporter.

One JSON file per lane, `<state_dir>/watch/<profile>.json`, replaced atomically after every probe and
every change of state, so `sparkfleet exporter` (another process) exports it without talking to watch.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

# watch's states, in the order they are exported (one series each, 1 on the current one)
STATES = ("watching", "suspect", "waiting", "backoff", "restarting", "stopped", "stood-down", "ended")
# why a restart (or stop) began; job-ended: a Slurm lane's job ended by itself (watch/slurmjob.py)
REASONS = ("probe-failed", "rank-exited", "rank-vanished", "job-ended", "memory")


@dataclass
class Status:
    profile: str
    inventory: str
    state: str = "watching"
    why: str = ""
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)
    started: float = 0.0
    updated: float = 0.0
    interval_s: float = 0.0
    max_restarts: int = 0
    window_s: float = 0.0
    budget_left: int = 0
    restarts: dict[str, int] = field(default_factory=dict)  # reason -> count since watch started
    probe_ok: bool | None = None
    probe_latency_s: float | None = None
    probe_at: float | None = None
    probe_why: str = ""
    not_judged: list[str] = field(default_factory=list)  # what watch cannot judge now, and why (one line each)

    def as_dict(self) -> dict:
        return asdict(self)


def path_for(state: Path, profile: str) -> Path:
    return state / "watch" / f"{profile}.json"


def write(state: Path, status: Status) -> Path:
    path = path_for(state, status.profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status.as_dict(), indent=1))
    os.replace(tmp, path)
    return path


def read_all(state: Path, inventory: str) -> list[Status]:
    """Every lane's status file for this inventory; unreadable files are left out."""
    out = []
    for p in sorted((state / "watch").glob("*.json")):
        try:
            d = json.loads(p.read_text())
            s = Status(**{k: v for k, v in d.items() if k in Status.__dataclass_fields__})
        except (OSError, ValueError, TypeError):
            continue
        if s.inventory == inventory and s.state in STATES:
            out.append(s)
    return out
