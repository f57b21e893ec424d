"""The parts of a `docker run` launch that the container engines share: names, labels, options, binds."""

from __future__ import annotations

import posixpath

from sparkfleet.engines.base import LaneContext, container_name, gid_for, groups, labels
from sparkfleet.engines.container import Bind, ContainerSpec
from sparkfleet.naming import engram_copy_dir
from sparkfleet.placement import Rank
from sparkfleet.schema.errors import SpecError


def engram_host_dir(ctx: LaneContext, r: Rank) -> str | None:
    """The node-local Engram copy mounted into this rank, or None when it reads from the model dir."""
    e = ctx.profile.engram
    root = r.node.storage.engram_local_dir
    if e is None or not e.node_local or r.rank in e.nfs_ranks or root is None:
        return None
    name = ctx.profile.engram_copy_name()
    assert name is not None
    return engram_copy_dir(root, name)


def lane_binds(ctx: LaneContext, r: Rank) -> list[Bind]:
    """The patch set's files (read-only, from the node's patch root) and the profile's own mounts."""
    p = ctx.profile
    node = r.node
    return ([Bind(posixpath.join(node.storage.patch_root, p.patches or "", src), dst, True)
             for src, dst in ctx.patch_mounts]
            + [Bind(m.source, m.target, m.readonly) for m in p.mounts])


def model_host_dir(ctx: LaneContext, r: Rank) -> str:
    assert ctx.profile.model is not None
    return posixpath.join(r.node.storage.model_root, ctx.profile.model.repo_dir)


def container_spec(ctx: LaneContext, r: Rank, command_text: str, command: list[str], *, binds: list[Bind],
                   env: dict[str, str | None], ports: dict[int, str],
                   entrypoint: str | None = None, image: str | None = None) -> ContainerSpec:
    """A lane container: name, labels and the profile's docker options, then the engine's binds and env.
    The image is the profile's unless the adapter gives one (a placeholder where the profile names none)."""
    p = ctx.profile
    if image is None:
        assert p.image is not None
        image = p.image.pinned
    return ContainerSpec(name=container_name(p, r.rank), image=image, command=command,
                         command_text=command_text, labels=labels(ctx, r.rank), options=groups(p.docker, "repeat"),
                         mounts=binds, env=env, ports=ports, entrypoint=entrypoint)


def template_context(ctx: LaneContext, r: Rank) -> dict:
    """What the container engines' command templates read."""
    p = ctx.profile
    assert p.model is not None
    return {
        "snapshot": p.model.snapshot or p.model.revision,
        "node": r.node,
        "head": ctx.head,
        "rank": r.rank,
        "nnodes": len(ctx.ranks),
        "master_port": p.master_port,
        "gid": gid_for(ctx, r.node),
        "served_names": p.served_names,
        "host": p.host,
        "port": p.port,
        "tp": p.tp,
        "dcp": p.dcp,
        "given": sorted(p.model_fields_set),  # fields the lane sets (a template may print a default only then)
        "args": groups(p.flags),
    }


def need(value: object, what: str, node: str) -> str:
    """A per-node value the launch needs; unset is a spec error naming the node and the field."""
    if value is None:
        raise SpecError(f"node {node} has no {what}, and the launch needs it", "inventory", None, what)
    return str(value)
