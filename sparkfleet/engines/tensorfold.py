"""TensorFold: a per-rank `config.env` plus the recipe's `scripts/serve.sh start`, ranks 3, 2, 1, then 0."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator

from sparkfleet.engines.base import Engine, LaneContext, Launch, at, container_name, gid_for, groups, render_command
from sparkfleet.engines.base import reserved as reserved_rule
from sparkfleet.engines.logs import LogVocabulary
from sparkfleet.findings import Finding
from sparkfleet.naming import tensorfold_config_path
from sparkfleet.placement import Rank
from sparkfleet.render.shell import render
from sparkfleet.spec.inventory import Inventory
from sparkfleet.spec.load import Loaded

# config.env keys sparkfleet writes per rank (templates/tensorfold-config.env.j2); the profile's env
# is appended after them, so one of these in env would silently override the rank's own value
RESERVED_ENV = ("HOST", "PORT", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RDMA_HCA", "GID_INDEX",
                "MODEL_DIR", "SERVED_NAMES", "SERVE_ARGS")

# The seeds show no TensorFold boot lines beyond the fatal ones the lanes list (CATALOG §5.2), so its
# vocabulary names only what a Python server prints on the way up.
LOG = LogVocabulary(
    serving=re.compile(r"Application startup complete|Uvicorn running on"),
    phases=((re.compile(r"[Ll]oading"), "loading weights"),
            (re.compile(r"Application startup complete|Uvicorn running on"), "serving")),
)


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines (shell-quoted values) back into a mapping."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            key, _, value = words[0].partition("=")
            env[key] = value
    return env


def flags_unused(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    """TensorFold's serve settings are tensorfold.args; `flags` would never reach the server."""
    p = loaded.profile
    if p.flags:
        yield Finding("engine-flags", "fail", f"flags {', '.join(p.flags)} are not read by a TensorFold lane",
                      "put serve settings in tensorfold.args (they become SERVE_ARGS in config.env)",
                      field="flags", where=at(loaded, "flags"))


class TensorFold(Engine):
    name = "tensorfold"
    required = ("image", "model", "group", "port", "tensorfold")
    reserved_env = RESERVED_ENV
    log = LOG
    lane_rules = (flags_unused, reserved_rule)
    engram_source_needed = ("a TensorFold lane's Engram shards come from the base checkpoint, not its EXL3 pack "
                            "(CATALOG ENG-29)")

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
            config_path = tensorfold_config_path(tf.recipe_dir)
            script, argv = render_command(ctx, "tensorfold-start.sh.j2",
                                          {"recipe_dir": tf.recipe_dir, "config_path": config_path})
            out.append(Launch(node.name, r.rank, r.role, wave, container_name(p, r.rank), argv,
                              parse_env_file(config), script, {config_path: config}))
        return out
