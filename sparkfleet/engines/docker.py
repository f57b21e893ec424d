"""The parts of a `docker run` launch that vLLM and SGLang share: names, labels, mounts, host dirs."""

from __future__ import annotations

import posixpath

from sparkfleet.engines.base import LaneContext, container_name, gid_for, groups, labels
from sparkfleet.placement import Rank


def engram_host_dir(ctx: LaneContext, r: Rank) -> str | None:
    """The node-local Engram copy mounted into this rank, or None when it reads from the model dir."""
    e = ctx.profile.engram
    root = r.node.storage.engram_local_dir
    if e is None or not e.node_local or r.rank in e.nfs_ranks or root is None:
        return None
    name = ctx.profile.engram_copy_name()
    assert name is not None
    # copies are per checkpoint (CATALOG ENG-26): one directory per revision under the node's root
    return posixpath.join(root, name)


def docker_context(ctx: LaneContext, r: Rank) -> dict:
    p = ctx.profile
    assert p.image is not None and p.model is not None
    node = r.node
    return {
        "container_name": container_name(p, r.rank),
        "labels": labels(ctx, r.rank),
        "docker": groups(p.docker, "repeat"),
        "image": p.image.pinned,
        "model_host_dir": posixpath.join(node.storage.model_root, p.model.repo_dir),
        "snapshot": p.model.snapshot or p.model.revision,
        "engram_host_dir": engram_host_dir(ctx, r),
        "engram_container_dir": p.engram.container_dir if p.engram else None,
        "mounts": [f"{posixpath.join(node.storage.patch_root, p.patches or '', src)}:{dst}:ro"
                   for src, dst in ctx.patch_mounts]
        + [f"{m.source}:{m.target}" + (":ro" if m.readonly else "") for m in p.mounts],
        "env": p.env,
        # the key's value never reaches argv or records: `-e VLLM_API_KEY` takes it from the environment
        # the launch command runs in (sparkfleet sets it there from profile.api_key_env)
        "api_key_env": p.api_key_env,
        "node": node,
        "head": ctx.head,
        "rank": r.rank,
        "nnodes": len(ctx.ranks),
        "master_port": p.master_port,
        "gid": gid_for(ctx, node),
        "served_names": p.served_names,
        "host": p.host,
        "port": p.port,
        "tp": p.tp,
        "dcp": p.dcp,
        "args": groups(p.flags),
    }
