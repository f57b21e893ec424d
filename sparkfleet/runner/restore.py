"""Restore points: the pins of a lane that served, recorded after `up --save-as NAME`."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sparkfleet.fleet.facts import NodeFacts
from sparkfleet.spec.errors import UserError

if TYPE_CHECKING:
    from sparkfleet.runner.context import RunContext


def points_dir(state: Path) -> Path:
    return state / "restore"


def profile_hash(ctx: RunContext) -> str:
    data = ctx.profile.model_dump(mode="json")
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def image_pins(ctx: RunContext) -> dict[str, str | None]:
    """Each rank's local image id for the lane's image (a re-pulled tag changes it)."""
    ref = ctx.profile.image.ref if ctx.profile.image else None
    out: dict[str, str | None] = {}
    for r in ctx.plan.ranks:
        f = ctx.facts.get(r.node.name)
        hit = None
        if isinstance(f, NodeFacts) and f.docker is not None:
            hit = next((i.id for i in f.docker.images if i.ref == ref), None)
        out[r.node.name] = hit
    return out


def engram_pins(ctx: RunContext) -> dict[str, str | None]:
    from sparkfleet.fleet.commands import read_file_command
    from sparkfleet.naming import engram_manifest_path

    e = ctx.profile.engram
    if e is None or not e.node_local:
        return {}
    dirs = ctx.engram_dirs()
    cmds = {n: read_file_command(engram_manifest_path(d)) for n, (_, d) in dirs.items()}
    ranks = {n: str(rank) for n, (rank, _) in dirs.items()}
    res = ctx.run_each(cmds, timeout_s=30)
    return {ranks[n]: (hashlib.sha256(x.stdout.encode()).hexdigest() if x.ok else None) for n, x in res.items()}


def current_pins(ctx: RunContext) -> dict:
    return {"profile_sha256": profile_hash(ctx), "images": image_pins(ctx),
            "patch_manifest_sha256": ctx.patch_manifest_sha256(),
            "engram_manifests": engram_pins(ctx), "ranks": {str(r.rank): r.node.name for r in ctx.plan.ranks}}


def diff_pins(recorded: dict, now: dict) -> list[str]:
    """One line per difference, saying what was recorded and what is there now."""
    out = []
    if recorded.get("profile_sha256") != now.get("profile_sha256"):
        out.append("the merged profile changed since it was recorded (profile_sha256)")
    for key, label in (("images", "image on"), ("engram_manifests", "Engram manifest of rank"),
                       ("ranks", "node of rank")):
        rec, cur = recorded.get(key) or {}, now.get(key) or {}
        for k in sorted(set(rec) | set(cur)):
            if rec.get(k) != cur.get(k):
                out.append(f"{label} {k}: recorded {_short(rec.get(k))}, now {_short(cur.get(k))}")
    if recorded.get("patch_manifest_sha256") != now.get("patch_manifest_sha256"):
        out.append(f"patch manifest: recorded {_short(recorded.get('patch_manifest_sha256'))}, "
                   f"now {_short(now.get('patch_manifest_sha256'))}")
    return out


def _short(v: object) -> str:
    if v is None:
        return "none"
    s = str(v)
    return s.removeprefix("sha256:")[:12] if len(s) > 16 else s


def save_point(ctx: RunContext, name: str) -> Path:
    from sparkfleet.spec.overrides import as_mapping

    head_kv = ctx.log_facts.get(0).kv_tokens if ctx.log_facts.get(0) else None
    point = {"name": name, "profile": ctx.profile.name, "inventory": ctx.inventory.name,
             "run_id": ctx.record.run_id, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "kv_tokens": head_kv, "pins": current_pins(ctx),
             "overrides": as_mapping(ctx.loaded.overrides)}
    d = points_dir(ctx.state_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(point, indent=1))
    os.replace(tmp, path)
    return path


def load_point(state: Path, name: str) -> dict | None:
    path = points_dir(state) / f"{name}.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise UserError(f"{path}: restore point is not valid JSON; remove it or record it again") from None


def list_points(state: Path) -> list[dict]:
    out = []
    for p in sorted(points_dir(state).glob("*.json")):
        try:
            d = json.loads(p.read_text())
        except ValueError:
            continue
        out.append({k: d.get(k) for k in ("name", "profile", "inventory", "recorded_at", "kv_tokens", "run_id")})
    return out
