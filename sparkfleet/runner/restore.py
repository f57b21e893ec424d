"""Restore points: a named run record holding every rank's launch as it ran, and the pins it served on.

`up --save-as NAME` writes one (state/restore/NAME.json) when the lane serves. `restore NAME` relaunches
the recorded launches verbatim (only the `sparkfleet.run` label becomes the new run's id), says per rank
what today's profile, inventory and templates would render differently, and refuses (nothing stopped)
only when the fleet no longer matches the pins: a node's identity, its image id, its patch files, its
Engram copy, its resolved GID index.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError

from sparkfleet.diff import diff_launches
from sparkfleet.engines.base import Launch
from sparkfleet.engines.container import Bind, ContainerSpec
from sparkfleet.findings import Finding
from sparkfleet.fleet.gather import resolve_gid_indexes
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.fleet.op import OpGen, query
from sparkfleet.fleet.ops import ReadFile
from sparkfleet.fleet.ops.patches import inspect_ops
from sparkfleet.naming import RUN_LABEL, engram_manifest_path
from sparkfleet.patches.manifest import PatchManifest
from sparkfleet.placement import Rank
from sparkfleet.plan import make_plan
from sparkfleet.runner.record import (
    SCHEMA_VERSION,
    LaunchRecord,
    RecordError,
    RunRecord,
    _Open,
    read_record,
    write_json,
)
from sparkfleet.runner.served import image_id_of, template_hashes
from sparkfleet.schema.overrides import as_mapping

if TYPE_CHECKING:
    from sparkfleet.engines.base import Launch
    from sparkfleet.runner.context import RunContext



class RestorePoint(_Open):
    """state/restore/NAME.json: the run record of the run that served, under a name."""

    schema_version: int = SCHEMA_VERSION
    name: str
    recorded_at: str = ""
    record: RunRecord
    overrides: dict[str, Any] = Field(default_factory=dict)  # the -o KEY=VALUE it served with (restore reapplies)

    @property
    def profile(self) -> str:
        return self.record.profile

    @property
    def inventory(self) -> str:
        return self.record.inventory

    @property
    def kv_tokens(self) -> int | None:
        return self.record.served.kv_tokens if self.record.served else None

    @property
    def launches(self) -> list[LaunchRecord]:
        return self.record.data.launches or []

    def options_view(self) -> dict:
        """What the runner's steps read from RunOptions.restore_point (expect: the recorded KV tokens)."""
        return {"name": self.name, "profile": self.profile, "kv_tokens": self.kv_tokens, "inventory": self.inventory,
                "overrides": self.overrides, "point": self}


def points_dir(state: Path) -> Path:
    return state / "restore"


def save_point(ctx: RunContext, name: str) -> Path:
    d = points_dir(ctx.state_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.json"
    record = read_record(ctx.record.as_dict(), f"run {ctx.record.run_id}")

    point = RestorePoint(name=name, recorded_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), record=record,
                         overrides=as_mapping(ctx.loaded.overrides))
    write_json(path, point.model_dump(mode="json", exclude_unset=False))
    return path


# -- reading points ----------------------------------------------------------------------------------

def load_point(state: Path, name: str) -> RestorePoint | None:
    """The point, None when there is none; RecordError (exit 2) for one this sparkfleet cannot relaunch."""
    path = points_dir(state) / f"{name}.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except ValueError:
        raise RecordError(f"{path}: restore point is not valid JSON; remove it or record it again") from None
    version = doc.get("schema_version", 1) if isinstance(doc, dict) else None
    if version == 1 or (isinstance(doc, dict) and "record" not in doc and "pins" in doc):
        raise RecordError(f"{path}: restore point {name!r} was saved by an older sparkfleet (schema 1: pins only, "
                          "no recorded launches), so it cannot be relaunched as it ran; nothing was done. Bring the "
                          f"lane up and record it again: sparkfleet up --profile {doc.get('profile', 'P')} "
                          f"--save-as {name}")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise RecordError(f"{path}: schema_version {version!r} is newer than this sparkfleet reads "
                          f"({SCHEMA_VERSION}); upgrade sparkfleet to restore it")
    try:
        point = RestorePoint.model_validate(doc)
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        raise RecordError(f"{path}: {'.'.join(map(str, e['loc']))}: {e['msg']}") from None
    if not point.launches:
        raise RecordError(f"{path}: restore point {name!r} holds no launches; record it again with up --save-as")
    return point


def point_names(state: Path) -> list[str]:
    return sorted(p.stem for p in points_dir(state).glob("*.json"))


def list_points(state: Path) -> list[dict]:
    out = []
    for p in sorted(points_dir(state).glob("*.json")):
        try:
            d = json.loads(p.read_text())
        except ValueError:
            continue
        rec = d.get("record") or d  # schema 1 kept these at the top
        served = rec.get("served") or {}
        out.append({"name": d.get("name", p.stem), "profile": rec.get("profile"), "inventory": rec.get("inventory"),
                    "recorded_at": d.get("recorded_at"), "kv_tokens": served.get("kv_tokens", d.get("kv_tokens")),
                    "run_id": rec.get("run_id"), "schema_version": d.get("schema_version", 1)})
    return out


# -- restoring ----------------------------------------------------------------------------------------

def spec_from_dict(d: dict, run_id: str) -> Any:

    labels = {k: (run_id if k == RUN_LABEL else v) for k, v in (d.get("labels") or {}).items()}
    return ContainerSpec(d["name"], d["image"], list(d["command"]), d["command_text"], labels,
                         [list(g) for g in d.get("options") or []], [Bind(**b) for b in d.get("mounts") or []],
                         dict(d.get("env") or {}), {int(k): v for k, v in (d.get("ports") or {}).items()},
                         d.get("entrypoint"))


def relabel(launch: LaunchRecord, run_id: str) -> Launch:
    """The recorded launch with this run's id in its `sparkfleet.run` label; nothing else changes."""

    old = next((t.split("=", 1)[1] for t in launch.argv if t.startswith(f"{RUN_LABEL}=")), None)
    argv = [f"{RUN_LABEL}={run_id}" if t == f"{RUN_LABEL}={old}" else t for t in launch.argv]
    script = launch.script
    if old:
        for form in (f"{RUN_LABEL}={old}", shlex.quote(f"{RUN_LABEL}={old}")):
            script = script.replace(form, f"{RUN_LABEL}={run_id}")
    raw = getattr(launch, "container_spec", None)
    spec = spec_from_dict(raw, run_id) if raw else None
    return Launch(launch.node, launch.rank, launch.role, launch.wave, launch.container, argv, dict(launch.env),
                  script, dict(launch.files), spec, launch.ready_check)


def adopt(ctx: RunContext, point: RestorePoint) -> None:
    """Make the run launch the recorded lane: its ranks on their recorded nodes, its launches verbatim."""

    ctx.plan.ranks = [Rank(x.rank, ctx.inventory.nodes[x.node]) for x in sorted(point.launches, key=lambda x: x.rank)]
    ctx.plan.launches = [relabel(x, ctx.record.run_id) for x in point.launches]
    ctx.rendered = True  # the launch step must not render today's lane
    records = []
    for x in point.launches:
        d = x.model_dump(mode="json")
        launch = next(n for n in ctx.plan.launches if n.rank == x.rank)
        d.update(argv=launch.argv, script=launch.script)
        records.append(d)
    ctx.launches = [LaunchRecord.model_validate(d) for d in records]
    ctx.record.data["launches"] = records
    ctx.record.restored_from = point.name


def today_changes(ctx: RunContext, point: RestorePoint) -> list[Finding]:
    """What today's profile, inventory and templates would render differently, per rank (launch unchanged)."""

    gid = resolve_gid_indexes([ctx.inventory.nodes[x.node] for x in point.launches], ctx.facts)
    for x in point.launches:  # a node that did not answer cannot resolve `auto`: that is its own finding
        if x.node not in gid and x.inventory and isinstance(x.inventory.gid_index, int):
            gid[x.node] = x.inventory.gid_index
    today = make_plan(ctx.loaded, ctx.inventory, ctx.playbook, ctx.spec.root, run_id=point.record.run_id,
                      gid_index=gid)
    out = []
    recorded = [x.model_dump(mode="json") for x in point.launches]
    for rd in diff_launches(recorded, [x.as_dict() for x in today.launches]):
        node = rd.node_a or rd.node_b
        out += [Finding("restore-diff", "warn", f"rank {rd.rank} ({node}): today would change {c.line()}", node=node,
                        remedy="restore launches the recorded lane; `sparkfleet diff` shows it all")
                for c in rd.changes]
    was, now = point.record.template_hashes or {}, template_hashes(ctx.spec.root)
    for name in sorted(set(was) | set(now)):
        if was.get(name) != now.get(name):
            out.append(Finding("restore-diff", "warn", f"template {name} changed since the point was recorded "
                               f"({_short(was.get(name))} -> {_short(now.get(name))})"))
    return out


def _short(v: object) -> str:
    if v is None:
        return "none"
    s = str(v)
    return s.removeprefix("sha256:")[:12] if len(s) > 16 else s


def pin_drift(ctx: RunContext, point: RestorePoint) -> OpGen[list[Finding] | None]:
    """Per node, every pin the fleet no longer matches (facts gathered by the caller); None under --dry-run
    (nothing read, nothing judged)."""

    out: list[Finding] = []

    def drift(node: str, pin: str, was: object, now: object) -> None:
        out.append(Finding("pins", "fail", f"{node}: {pin}: recorded {_short(was)}, now {_short(now)}", node=node,
                           remedy="put it back, or restore anyway with --force", observed=str(now), expected=str(was)))

    nodes = {x.node: ctx.inventory.nodes[x.node] for x in point.launches}
    gids = resolve_gid_indexes(list(nodes.values()), ctx.facts)
    engram_cmds = {x.node: ReadFile(engram_manifest_path(x.engram_dir)).command()
                   for x in point.launches if x.engram_dir and x.engram_manifest_sha256}
    engram_now = yield query("read the recorded Engram manifests", engram_cmds, 30)
    if engram_now is None or not ctx.facts:
        return None
    for x in sorted(point.launches, key=lambda x: x.rank):
        f = ctx.facts.get(x.node)
        if not isinstance(f, NodeFacts):
            out.append(Finding("pins", "fail", f"{x.node}: did not answer, so no pin can be checked", node=x.node,
                               remedy="bring the node back (or fix its SSH), then restore again"))
            continue
        inv = x.inventory
        if inv and inv.hostname and f.hostname != inv.hostname:
            drift(x.node, "node identity (hostname)", inv.hostname, f.hostname)
        if x.image_id and image_id_of(f, x.image_ref) != x.image_id:
            drift(x.node, f"image id of {x.image_ref}", x.image_id, image_id_of(f, x.image_ref))
        if inv and isinstance(inv.gid_index, int) and gids.get(x.node) != inv.gid_index:
            drift(x.node, "resolved GID index", inv.gid_index, gids.get(x.node))
        if x.engram_dir and x.engram_manifest_sha256:
            res = engram_now.get(x.node)
            now = hashlib.sha256(res.stdout.encode()).hexdigest() if res is not None and res.ok else None
            if now != x.engram_manifest_sha256:
                drift(x.node, f"Engram copy manifest ({x.engram_dir})", x.engram_manifest_sha256, now)
    by_set: dict[str, list[LaunchRecord]] = {}
    for x in point.launches:
        if x.patch_set and x.patch_files:
            by_set.setdefault(x.patch_set, []).append(x)
    for name, xs in by_set.items():
        manifest = PatchManifest(name=name, files=[f.model_dump() for f in xs[0].patch_files])
        states = (yield from inspect_ops([nodes[x.node] for x in xs], manifest)) or {}
        for node, st in sorted(states.items()):
            for source in st.missing:
                drift(node, f"patch file {name}/{source}", "present", "missing")
            for source in st.wrong:
                want = next(f.sha256 for f in manifest.files if f.source == source)
                drift(node, f"patch file {name}/{source}", want, "a different sha256")
    return out


def unknown_nodes(point: RestorePoint, inventory_nodes: dict) -> list[str]:
    return sorted({x.node for x in point.launches} - set(inventory_nodes))
