"""Where things are: the ops directory (`--root`, $SPARKFLEET_ROOT, the user config file, else this checkout),
the state directory, and the simulated lab's place in it (its inventory, which `--inventory sim` reads
whether or not the sim package is loaded; sim/paths.py lays out the rest of that directory)."""

from __future__ import annotations

from pathlib import Path

from sparkfleet.schema.errors import UserError
from sparkfleet.userconfig import setting

LAYOUT = ("inventories", "profiles", "templates", "playbooks", "patches")


def find_root(explicit: str | None = None) -> Path:
    """The ops directory holding inventories/, profiles/, templates/, playbooks/, patches/."""
    chosen = setting("root", explicit)
    candidate = chosen.value
    if candidate:
        root = Path(candidate).expanduser().resolve()
        if not (root / "profiles").is_dir():
            raise UserError(f"root {candidate} (from {chosen.source}): no profiles/ directory there "
                            f"(expected {', '.join(LAYOUT)})")
        return root
    for start in (Path.cwd(), Path(__file__).resolve().parent.parent):
        for d in (start, *start.parents):
            if (d / "profiles").is_dir() and (d / "inventories").is_dir():
                return d
    raise UserError("no ops directory found: run from a sparkfleet checkout or pass --root DIR")


def state_dir() -> Path:
    """Runs, restore points and locks; never inside the package."""
    return Path(setting("state").value).expanduser()


def sim_dir() -> Path:
    """The simulated lab's directory: sandboxes, ssh keys and configs, the manifest, the inventory."""
    return state_dir() / "sim"


def sim_inventory_path() -> Path:
    """The inventory `sim up` writes for itself; `--inventory sim` resolves here."""
    return sim_dir() / "inventory.yaml"
