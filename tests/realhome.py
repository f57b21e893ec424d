"""The real user's home, as the suite found it, and what of it the suite must leave alone (tests/conftest.py
`_own_home` gives the suite a HOME of its own and fails the session if any of this changed).

Read at import, before any fixture moves HOME: the build caches that `make llama-rpc` (and the real-vLLM lab's
build) fill before pytest runs are the real user's, and the suite still reads them there
($SPARKFLEET_LLAMA_CACHE, $SPARKFLEET_VLLM_CACHE). They are the only part of the real home the suite may use,
and they are not watched: a build may fill them while the suite runs.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

REAL_HOME = Path.home()  # $HOME as the suite was started (the user's own, unless the caller set another)
REAL_ENV = dict(os.environ)

# the build caches the suite reads: variable -> its default under the real home (sim/llamabuild.py's convention)
BUILD_CACHES = {"SPARKFLEET_LLAMA_CACHE": REAL_HOME / ".cache" / "sparkfleet" / "llama.cpp",
                "SPARKFLEET_VLLM_CACHE": REAL_HOME / ".cache" / "sparkfleet" / "vllm"}

# sparkfleet's own dirs in a home: (the XDG variable that moves the base, the base under the home)
XDG_BASES = {"XDG_CACHE_HOME": ".cache", "XDG_STATE_HOME": ".local/state", "XDG_CONFIG_HOME": ".config",
             "XDG_DATA_HOME": ".local/share"}


def build_caches(env: dict[str, str] = REAL_ENV) -> dict[str, Path]:
    """Each build cache the suite reads: the caller's setting, else the real home's default."""
    return {var: Path(env[var]) if env.get(var) else default for var, default in BUILD_CACHES.items()}


def watched(home: Path = REAL_HOME, env: dict[str, str] = REAL_ENV) -> list[Path]:
    """sparkfleet's dirs in `home` (~/.cache/sparkfleet, ~/.local/state/sparkfleet, ~/.config/sparkfleet,
    ~/.local/share/sparkfleet), and where the caller's XDG variables move them, each once."""
    out: list[Path] = []
    for var, base in XDG_BASES.items():
        for d in (home / base / "sparkfleet", Path(env[var]) / "sparkfleet" if env.get(var) else None):
            if d is not None and d not in out:
                out.append(d)
    return out


def snapshot(roots: list[Path], skip: list[Path] = ()) -> dict[str, tuple[int, int, int]]:
    """Every entry below `roots` (not the roots themselves, nor anything at or below `skip`): its mode, and
    for a file or link its size and mtime. A root that is missing holds nothing."""
    skipped = {os.path.normpath(s) for s in skip}
    out: dict[str, tuple[int, int, int]] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [n for n in dirnames if os.path.join(dirpath, n) not in skipped]
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                if path in skipped:
                    continue
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                is_dir = stat.S_ISDIR(st.st_mode)
                out[path] = (st.st_mode, 0 if is_dir else st.st_size, 0 if is_dir else st.st_mtime_ns)
    return out


def changes(before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]) -> list[str]:
    """What differs between two snapshots, one line per path: added, removed or changed."""
    return ([f"added {p}" for p in sorted(after.keys() - before.keys())]
            + [f"removed {p}" for p in sorted(before.keys() - after.keys())]
            + [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]])
