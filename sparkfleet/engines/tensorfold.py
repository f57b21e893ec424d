"""TensorFold: a per-rank `config.env` plus the recipe's `scripts/serve.sh start`, ranks 3, 2, 1, then 0."""

from __future__ import annotations

import posixpath
import shlex

from sparkfleet.engines.base import LaneContext, Launch, container_name, gid_for, groups, render_launch
from sparkfleet.render.shell import render


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines (shell-quoted values) back into a mapping."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            key, _, value = words[0].partition("=")
            env[key] = value
    return env


class TensorFold:
    name = "tensorfold"

    def launches(self, ctx: LaneContext) -> list[Launch]:
        """One rank at a time from the highest rank down; rank 0 (the API) last (CATALOG LCH-T5)."""
        p = ctx.profile
        assert p.tensorfold is not None
        tf = p.tensorfold
        out = []
        ordered = sorted(ctx.ranks, key=lambda r: -r.rank)
        for wave, r in enumerate(ordered, start=1):
            node = r.node
            hcas = node.rdma.hcas if node.rdma else []
            context = {
                "profile": p.name,
                "rank": r.rank,
                "world_size": len(ctx.ranks),
                "head": ctx.head,
                "node": node,
                "host": p.host,
                "port": p.port,
                "gid": gid_for(ctx, node),
                # rail 2 stripes over both HCAs; rail 1 uses the first
                "rdma_hca": ",".join(hcas if p.rail2 else hcas[:1]),
                "model_dir": tf.model_dir,
                "served_names": ",".join(p.served_names),
                "serve_args": " ".join(t for g in groups(tf.args) for t in g),
                "env": p.env,
            }
            config = render(ctx.template_dir, "tensorfold-config.env.j2", context)
            config_path = posixpath.join(tf.recipe_dir, "config.env")
            script, argv = render_launch(ctx, "tensorfold-start.sh.j2",
                                         {"recipe_dir": tf.recipe_dir, "config_path": config_path})
            out.append(Launch(node.name, r.rank, r.role, wave, container_name(p, r.rank), argv,
                              parse_env_file(config), script, {config_path: config}))
        return out
