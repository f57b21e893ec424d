"""One run at a time per fleet: an exclusive lock file naming who holds it."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from sparkfleet.spec.errors import UserError


class FleetLock:
    """`with FleetLock(path, what):` — refuses (UserError) while another live run holds it."""

    def __init__(self, path: Path, what: str):
        self.path = path
        self.what = what
        self.held = False

    def __enter__(self) -> FleetLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "user": os.environ.get("USER", "?"),
              "command": self.what, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is not None and self._alive(holder):
                    raise UserError(
                        f"another run holds the fleet lock ({self.path}): {holder.get('command')!r} by "
                        f"{holder.get('user')}@{holder.get('host')} pid {holder.get('pid')} since "
                        f"{holder.get('since')}; wait for it, or remove the lock if that process is gone") from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise UserError(f"could not take the fleet lock {self.path}")

    def __exit__(self, *exc: object) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def live_holder(self) -> dict | None:
        """Who holds the lock now (pid, host, user, command, since), or None when nobody alive does."""
        holder = self._holder()
        return holder if holder is not None and self._alive(holder) else None

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _alive(holder: dict) -> bool:
        if holder.get("host") != socket.gethostname():
            return True  # cannot tell for another host: assume it is running
        try:
            os.kill(int(holder.get("pid", 0)), 0)
        except ProcessLookupError:
            return False
        except (PermissionError, ValueError):
            return True
        return True
