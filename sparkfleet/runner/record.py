"""Run records: what ran, what was seen and how it ended, one JSON file per run in the state dir.

Secrets never reach a record: values of env vars whose names look secret, and the API key itself,
are replaced before anything is written.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkfleet.redact import REDACTED, SECRET_NAME, redact

__all__ = ["REDACTED", "SECRET_NAME", "Record", "list_runs", "new_run_id", "redact"]


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


@dataclass
class Record:
    run_id: str
    playbook: str
    profile: str
    inventory: str
    command: str
    started: float = field(default_factory=time.time)
    steps: list[dict] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # rendered commands, facts, findings, log facts...
    outcome: str = "running"  # ok | failed | refused | interrupted
    reason: str = ""
    finished: float | None = None
    secret_values: set[str] = field(default_factory=set)

    def as_dict(self) -> dict:
        d = {"run_id": self.run_id, "playbook": self.playbook, "profile": self.profile,
             "inventory": self.inventory, "command": self.command, "started": self.started,
             "finished": self.finished, "outcome": self.outcome, "reason": self.reason,
             "duration_s": round((self.finished or time.time()) - self.started, 3),
             "steps": self.steps, "data": self.data}
        return redact(d, self.secret_values)

    def write(self, runs_dir: Path) -> Path:
        """Atomic write: a reader never sees half a record."""
        runs_dir.mkdir(parents=True, exist_ok=True)
        path = runs_dir / f"{self.run_id}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.as_dict(), indent=1, default=str))
        os.replace(tmp, path)
        return path


def list_runs(runs_dir: Path) -> list[dict]:
    out = []
    for p in sorted(runs_dir.glob("*.json")):
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        out.append({k: d.get(k) for k in ("run_id", "playbook", "profile", "inventory", "outcome", "reason",
                                          "started", "duration_s")})
    return out
