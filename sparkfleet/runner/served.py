"""What a run keeps for `restore` and `diff`, built where it is made: each rank's launch as it ran (with
the pins it launched on), the templates' hashes, and what served. Typed (runner/record.py), from the run's
own state (RunContext), never read back from the record's free parts."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkfleet.diff import parse_docker_argv
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.patches import manifest as pm
from sparkfleet.runner.record import LaunchRecord, Served

if TYPE_CHECKING:
    from sparkfleet.runner.context import RunContext


def template_hashes(root: Path) -> dict[str, str]:
    d = root / "templates"
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("*.j2"))} if d.is_dir() else {}


def image_id_of(facts: Any, ref: str | None) -> str | None:
    if isinstance(facts, NodeFacts) and facts.docker is not None and ref:
        return next((i.id for i in facts.docker.images if i.ref == ref), None)
    return None


def _options(argv: list[str]) -> list[str]:
    """The docker options of a launch: everything between `docker run` and the image, less -e/-v."""

    return parse_docker_argv(argv)["options"]


def spec_to_dict(spec: Any) -> dict:
    """A ContainerSpec as JSON data, every field kept (env None = passed through from the launching shell)."""
    d = dataclasses.asdict(spec)
    d["ports"] = {str(k): v for k, v in spec.ports.items()}
    return d



def launch_records(ctx: RunContext) -> list[LaunchRecord]:
    """Every rank's launch as this run renders it, with the pins it launches on (the Engram manifests the
    engram step read: ctx.engram_manifests)."""

    p = ctx.profile
    patch_files: list[dict] = []
    if p.patches and (pm.set_dir(ctx.spec.root, p.patches) / pm.MANIFEST).is_file():
        m = pm.load(ctx.spec.root, p.patches)
        patch_files = [f.model_dump() for f in m.files] if m.complete else []
    ranks = {r.rank: r for r in ctx.plan.ranks}
    dirs = ctx.engram_dirs()
    out = []
    for launch in ctx.plan.launches:
        node = ranks[launch.rank].node
        facts = ctx.facts.get(node.name)
        engram_dir = dirs[node.name][1] if node.name in dirs else None
        out.append(LaunchRecord.model_validate({
            **launch.as_dict(), "container_options": _options(launch.argv),
            "container_spec": spec_to_dict(launch.spec) if launch.spec is not None else None,
            "image_ref": p.image.ref if p.image else None, "image_digest": p.image.digest if p.image else None,
            "image_id": image_id_of(facts, p.image.ref if p.image else None),
            "patch_set": p.patches, "patch_files": patch_files,
            "engram_dir": engram_dir,
            "engram_manifest_sha256": ctx.engram_manifests.get(str(launch.rank)) if engram_dir else None,
            "inventory": {
                "address": node.ssh.host, "fabric_ip": node.fabric_ip,
                "hcas": list(node.rdma.hcas) if node.rdma else [],
                "fabric_iface": node.rdma.fabric_iface if node.rdma else None,
                "gid_index": ctx.gid_index.get(node.name, node.rdma.gid_index if node.rdma else None),
                "storage": node.storage.model_dump(mode="json"),
                "hostname": facts.hostname if isinstance(facts, NodeFacts) else None,
            },
        }))
    return out


def served(ctx: RunContext) -> Served:
    """At the end of a good run: what served (KV, MoE line, each gate's status)."""
    lf = ctx.log_facts.get(0)
    return Served(kv_tokens=lf.kv_tokens if lf else None, moe_backend_line=lf.moe_backend_line if lf else None,
                  gates={r.name: r.status for r in ctx.gate_results})


def finish(ctx: RunContext) -> None:
    """At the end of a good run: the record says what served, and the launches with the image ids pulled."""
    ctx.record.served = served(ctx).model_dump(mode="json")
    pin_pulled_images(ctx, ctx.launches)
    ctx.record.data["launches"] = [x.model_dump(mode="json") for x in ctx.launches]


def pin_pulled_images(ctx: RunContext, launches: list[LaunchRecord]) -> None:
    """An image pulled during the launch has an id only after it: taken from the facts after load."""
    for x in launches:
        if x.image_id is None and isinstance(ctx.facts_after_load.get(x.node), NodeFacts):
            x.image_id = image_id_of(ctx.facts_after_load[x.node], x.image_ref)
