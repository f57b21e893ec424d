"""Seeding the Station's FlashInfer autotune cache on a node (runner/autotune.py says why; FM-40/41, LCH-G2):
every hash dir the tuner made in the node's last seconds gets the newest `autotune_configs.json`. The script
prints one JSON line: the copy's source and the dirs it seeded."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from sparkfleet.fleet.ops.base import Op
from sparkfleet.fleet.transport import Result

# Runs on the node (stdlib only).
SEED_SCRIPT = r'''
import json, os, shutil, sys, time
cache, since = sys.argv[1], time.time() - float(sys.argv[2])  # the node's own clock, not the controller's
found = []
for d, dirs, files in os.walk(cache):
    if d[len(cache):].count(os.sep) > 6:
        dirs[:] = []
    if "autotune_configs.json" in files:
        found.append(os.path.join(d, "autotune_configs.json"))
out = {"source": None, "seeded": []}
if found:
    src = max(found, key=os.path.getmtime)
    out["source"] = src
    for parent in {os.path.dirname(os.path.dirname(f)) for f in found}:
        for name in sorted(os.listdir(parent)):
            d = os.path.join(parent, name)
            if os.path.isdir(d) and os.path.getmtime(d) >= since and not os.path.exists(
                    os.path.join(d, "autotune_configs.json")):
                shutil.copy2(src, os.path.join(d, "autotune_configs.json"))
                out["seeded"].append(d)
print(json.dumps(out))
'''


def seed_command(cache_dir: str, age_s: float) -> str:
    """Seed hash dirs made in the last `age_s` seconds, judged by the node's own clock in the same round trip:
    a Station whose clock is behind the controller's (FM-40) stamps its new dirs in its own time, so a
    controller timestamp would make them look old and never seed them. A duration needs no common clock."""
    return f"python3 -c {shlex.quote(SEED_SCRIPT)} {shlex.quote(cache_dir)} {age_s:.3f}"


def parse(stdout: str) -> dict:
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"source": None, "seeded": []}


@dataclass(frozen=True)
class SeedAutotune(Op[list[str]]):
    """Seed the hash dirs under `cache_dir` made in the node's last `age_s` seconds (it copies files). Its
    answer: the dirs it seeded (none when the node did not run it)."""

    cache_dir: str
    age_s: float
    changes = True

    def command(self) -> str:
        return seed_command(self.cache_dir, self.age_s)

    def parse(self, result: Result) -> list[str]:
        return list(parse(result.stdout)["seeded"]) if result.ok else []
