"""A node-side helper (sparkfleet/fleet/nodeside/), verified by sha256 and run: the guard, the ship, the inline run.

The command sent to a node is a small `python3 -c` guard: it reads ~/.cache/sparkfleet/bin/<name>,
checks its sha256 against this sparkfleet's copy and, if it matches, runs exactly the bytes it
hashed (no window between check and run). If the file is missing or different it exits with
MISSING (97) plus a marker on stderr; only those nodes get the helper (`ShipHelper`: the same guard,
the file written first, mode 0755) and are run again. fleet/ship.py drives the three.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sparkfleet.fleet.ops.base import Op
from sparkfleet.fleet.transport import Result

NODESIDE = Path(__file__).resolve().parent.parent / "nodeside"
HELPER_DIR = "~/.cache/sparkfleet/bin"
MISSING = 97  # the guard's exit code for "helper missing or changed"; the helpers never exit with it
MARKER = "sparkfleet-helper-missing"
SHIP_MODE = 0o755

_GUARD = """\
import hashlib, os, sys
p = os.path.expanduser({path!r})
try:
    with open(p, 'rb') as f:
        b = f.read()
except OSError:
    b = None
if b is None or hashlib.sha256(b).hexdigest() != {digest!r}:
    sys.stderr.write({marker!r} + ' ' + p + chr(10))
    sys.exit({missing})
if {run}:
    sys.argv = [p] + sys.argv[1:]
    exec(compile(b, p, 'exec'), {{'__name__': '__main__', '__file__': p}})
"""


def _check_name(name: str) -> str:
    if "/" in name or name.startswith(".") or not (NODESIDE / name).is_file():
        known = sorted(p.name for p in NODESIDE.glob("*.py") if p.name != "__init__.py")
        raise ValueError(f"no node-side helper {name!r} (known: {', '.join(known)})")
    return name


@lru_cache(maxsize=16)
def helper_bytes(name: str) -> bytes:
    """The helper as this sparkfleet ships it."""
    return (NODESIDE / _check_name(name)).read_bytes()


def helper_sha256(name: str) -> str:
    return hashlib.sha256(helper_bytes(name)).hexdigest()


def remote_path(name: str) -> str:
    return f"{HELPER_DIR}/{_check_name(name)}"


def guard_command(name: str, *, run: bool = True) -> str:
    """The one shell command that verifies the node's copy by sha256 and (if `run`) runs it."""
    code = _GUARD.format(path=remote_path(name), digest=helper_sha256(name), marker=MARKER,
                         missing=MISSING, run=run)
    return "python3 -c " + shlex.quote(code)


def inline_command(name: str) -> str:
    """The helper's own bytes run by `python3 -c`, for a node that lacks it when nothing may be written."""
    return "python3 -c " + shlex.quote(helper_bytes(name).decode())


def is_missing(r: Result) -> bool:
    """True when the guard said: the helper on that node is missing or differs."""
    return r.exit_code == MISSING and MARKER in (r.stderr + r.stdout)


def explain(r: Result, name: str) -> Result:
    """The node's Result, a failed run given a one-line cause people can act on (a copy; `r` is left as it is)."""
    if r.ok or r.message:
        if not r.ok and r.exit_code == 127 and "python3" not in r.message:
            return dataclasses.replace(r, message=f"python3 not found on {r.node} (exit 127): {r.message}")
        return r
    if r.exit_code == 127:
        message = f"python3 not found on {r.node} (exit 127); node-side helpers need the system python3"
    else:
        last = (r.stderr.strip().splitlines() or [""])[-1]
        message = f"{name} on {r.node} failed (exit {r.exit_code})" + (f": {last}" if last else "")
    return dataclasses.replace(r, message=message)


@dataclass(frozen=True)
class RunHelper(Op[Result]):
    """Run this sparkfleet's copy of a helper (or with `run=False` only verify it): the sha256 guard. Its answer
    is the node's Result with a cause people can act on when it failed; `missing(result)` says the guard found
    the node's copy missing or different (then `ShipHelper`). `writes`: the helper's own run writes on the
    node (a copy), so it is not run under --dry-run=facts."""

    name: str
    run: bool = True
    writes: bool = False

    @property
    def changes(self) -> bool:  # type: ignore[override]
        return self.writes and self.run

    def command(self) -> str:
        return guard_command(self.name, run=self.run)

    @staticmethod
    def missing(result: Result) -> bool:
        return is_missing(result)

    def parse(self, result: Result) -> Result:
        return explain(result, self.name)


@dataclass(frozen=True)
class ShipHelper(RunHelper):
    """Write the helper (`files()`, mode SHIP_MODE) where the guard found it missing, and run the guard again."""

    @property
    def changes(self) -> bool:  # type: ignore[override]
        return True

    def files(self) -> dict[str, bytes]:
        return {remote_path(self.name): helper_bytes(self.name)}


@dataclass(frozen=True)
class InlineHelper(RunHelper):
    """The helper's own bytes run by `python3 -c` (--dry-run=facts on a node that lacks it: nothing written)."""

    @property
    def changes(self) -> bool:  # type: ignore[override]
        return False

    def command(self) -> str:
        return inline_command(self.name)
