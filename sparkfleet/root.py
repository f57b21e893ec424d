"""Where an ops directory is: `--root`, then $SPARKFLEET_ROOT, then the checkout sparkfleet runs from."""

from __future__ import annotations

import os
from pathlib import Path

from sparkfleet.spec.errors import UserError

LAYOUT = ("inventories", "profiles", "templates", "playbooks", "patches")


def find_root(explicit: str | None = None) -> Path:
    """The ops directory holding inventories/, profiles/, templates/, playbooks/, patches/."""
    candidate = explicit or os.environ.get("SPARKFLEET_ROOT")
    if candidate:
        root = Path(candidate).expanduser().resolve()
        if not (root / "profiles").is_dir():
            raise UserError(f"--root {candidate}: no profiles/ directory there (expected {', '.join(LAYOUT)})")
        return root
    for start in (Path.cwd(), Path(__file__).resolve().parent.parent):
        for d in (start, *start.parents):
            if (d / "profiles").is_dir() and (d / "inventories").is_dir():
                return d
    raise UserError("no ops directory found: run from a sparkfleet checkout or pass --root DIR")


def state_dir() -> Path:
    """Runs, restore points and locks; never inside the package."""
    env = os.environ.get("SPARKFLEET_STATE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sparkfleet"
