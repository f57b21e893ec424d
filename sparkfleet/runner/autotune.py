"""The Station's FlashInfer autotune cache (docs/failure-modes.md FM-40/41; LCH-G2).

A launch-flag change makes vLLM tune into a new hash directory under the persistent cache, and a copy
that lands after the tuner reads it is too late (74-90 minutes lost). While a Station lane boots, `up`
seeds every new hash directory with the newest `autotune_configs.json` within a poll; when the change
touched kernel shapes (capture list, speculative depth or schedule, runner) seeding cannot help, and
`up` says so with the time budget. The seeding itself is an operation (fleet/ops/autotune.py SeedAutotune).
"""

from __future__ import annotations

import json
from pathlib import Path

from sparkfleet.fleet.ops.autotune import SEED_SCRIPT, parse, seed_command

__all__ = ["CONFIGS", "SEED_SCRIPT", "SHAPE_FLAGS", "flag_values", "parse", "seed_command", "shape_changes"]

CONFIGS = "autotune_configs.json"
# Flags whose change alters kernel shapes: the tuner ignores entries whose shapes differ (FM-41): the capture list
# ("the capture list is part of the FlashInfer autotune hash"), the verify shape ("depth, runner"). Not
# --max-num-seqs or --max-model-len: they change the hash but not the shapes, and seeding works ([000]: "Changing
# --max-num-seqs from 8 to 16 produced a fresh hash ... re-tuning kernels whose shapes had not changed ... Copying
# autotune_configs.json from the old hash directory into the new one was accepted: Loaded 168 configs").
SHAPE_FLAGS = ("--cudagraph-capture-sizes", "--compilation-config", "--speculative-config")

def flag_values(argv: list[str]) -> dict[str, list[str]]:
    """The values of the shape flags in a launch argv (tokens up to the next --flag)."""
    out: dict[str, list[str]] = {}
    key = None
    for tok in argv:
        if tok.startswith("--"):
            key = tok if tok in SHAPE_FLAGS else None
            if key:
                out[key] = []
        elif key:
            out[key].append(tok)
    return out


def shape_changes(runs_dir: Path, profile: str, argv: list[str]) -> list[str]:
    """Shape flags that differ from this lane's last successful run (none when there is no such run)."""
    last = None
    for p in sorted(runs_dir.glob("*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("profile") == profile and rec.get("outcome") == "ok" and rec.get("data", {}).get("launches"):
            last = rec
    if last is None:
        return []
    before = flag_values(last["data"]["launches"][-1]["argv"])
    now = flag_values(argv)
    return [f for f in SHAPE_FLAGS if before.get(f) != now.get(f)]
