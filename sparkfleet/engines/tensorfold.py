"""TensorFold: each rank a labelled container of the profile's image (host network, GPUs), the recipe
dir mounted at its own path and the rank's rendered `config.env` mounted as <recipe_dir>/config.env,
running the recipe's serve script in the foreground; ranks 3, 2, 1, then 0 (LCH-T5)."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterator

from sparkfleet.engines.base import Engine, LaneContext, Launch, at, container_name, gid_for, groups, labels
from sparkfleet.engines.base import reserved as reserved_rule
from sparkfleet.engines.build_recipe import BuildStep, EngineBuild, stage_of
from sparkfleet.engines.container import Bind, ContainerSpec
from sparkfleet.engines.logs import LogVocabulary
from sparkfleet.findings import Finding
from sparkfleet.naming import tensorfold_config_path, tensorfold_rank_config
from sparkfleet.placement import Rank
from sparkfleet.render.shell import render
from sparkfleet.schema.inventory import Inventory, Node
from sparkfleet.schema.load import Loaded
from sparkfleet.schema.profile import Profile

# config.env keys sparkfleet writes per rank (templates/tensorfold-config.env.j2); the profile's env
# is appended after them, so one of these in env would silently override the rank's own value
RESERVED_ENV = ("HOST", "PORT", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RDMA_HCA", "GID_INDEX",
                "MODEL_DIR", "SERVED_NAMES", "SERVE_ARGS")

# The seeds show no TensorFold boot lines beyond the fatal ones the lanes list, so its
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
    gid_env = ("NCCL_IB_GID_INDEX", "GID_INDEX")  # GID_INDEX: its config.env
    required = ("image", "model", "group", "port", "tensorfold")
    reserved_env = RESERVED_ENV
    log = LOG
    lane_rules = (flags_unused, reserved_rule)
    engram_source_needed = ("a TensorFold lane's Engram shards come from the base checkpoint, not its EXL3 pack "
                            "(ENG-29)")

    def model_dir(self, profile: Profile, node: Node) -> str | None:
        """TensorFold names its own weights dir (the EXL3 pack), the same on every node."""
        return profile.tensorfold.model_dir if profile.tensorfold else None

    def fact_paths(self, profile: Profile, node: Node) -> list[str]:
        """The weights dir and the recipe dir whose serve script every rank runs."""
        return [p for p in (self.model_dir(profile, node), profile.tensorfold.recipe_dir if profile.tensorfold
                            else None) if p]

    def model_label(self, profile: Profile) -> str:
        return super().model_label(profile) or (profile.tensorfold.model_dir if profile.tensorfold else "")

    def engine_build(self, profile: Profile) -> EngineBuild | None:
        """The seed's build, command for command (seed 002 Quick start 2; LCH-T1):
            git clone -b deepseek-v41-zig-tp4 https://github.com/bertholomus/TensorFold && cd TensorFold
            git checkout 5940208
            git am "$REPO"/runs/2026-10-17-1017-tensorfold/patches/*.patch
            zig build install native -Dtarget=aarch64-linux-gnu.2.28 -Doptimize=ReleaseFast ...
        The clone goes to the build's staging dir instead of ./TensorFold (moved to tensorfold.build.dir once
        every rank built the same bytes); `zig build install` installs under zig-out/ (Zig's default prefix)."""
        b = profile.tensorfold.build if profile.tensorfold else None
        if b is None:
            return None
        q = shlex.quote
        zig = " ".join([q(b.zig), "build", *(q(s) for s in b.steps), *(q(o) for o in b.options)])
        stage = stage_of(b.dir)
        return EngineBuild(
            engine=self.name, dir=b.dir,
            fetch=BuildStep("git clone", f"git clone -b {q(b.branch)} {q(b.source)} {q(stage)}"),
            steps=(BuildStep("git checkout", f"git checkout {q(b.commit)}"),
                   # the glob stays outside the quotes: git am takes the set in name order, as the seed's does
                   BuildStep("git am", f"git am {q(b.patches)}/*.patch"),
                   BuildStep("zig build", zig)),
            inputs=b.model_dump())

    def launches(self, ctx: LaneContext) -> list[Launch]:
        """One rank at a time from the highest rank down; rank 0 (the API) last (LCH-T5)."""
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
            host_config = tensorfold_rank_config(tf.recipe_dir, p.name, r.rank)
            launch = Launch.of(r, wave, rank_container(ctx, r), {host_config: config})
            launch.env = parse_env_file(config)  # the rank's environment: the serve script sources config.env
            out.append(launch)
        return out


def rank_command(recipe_dir: str, override: list[str] | None) -> list[str]:
    """The recipe's `scripts/serve.sh start` (seed 002: "start1.sh runs the recipe's scripts/serve.sh start")
    as the container's command (the container lives as long as the rank serves)."""
    return list(override) if override else ["bash", posixpath.join(recipe_dir, "scripts", "serve.sh"), "start"]


def rank_container(ctx: LaneContext, r: Rank) -> ContainerSpec:
    """One TensorFold rank as a container: the same labels, stop, logs and state as every engine's ranks."""
    p = ctx.profile
    assert p.tensorfold is not None and p.image is not None
    tf = p.tensorfold
    own = {g[0] for g in groups(p.docker, "repeat")}
    options = [o for o in (["--network", "host"], ["--gpus", "all"]) if o[0] not in own] + groups(p.docker, "repeat")
    command = rank_command(tf.recipe_dir, tf.rank_command)
    mounts = [Bind(tf.recipe_dir, tf.recipe_dir, field="tensorfold.recipe_dir"),
              Bind(tensorfold_rank_config(tf.recipe_dir, p.name, r.rank), tensorfold_config_path(tf.recipe_dir), True),
              Bind(tf.model_dir, tf.model_dir, True, field="tensorfold.model_dir")]
    ports = {p.port: "port"} if r.rank == 0 and p.port is not None else {}
    return ContainerSpec(name=container_name(p, r.rank), image=p.image.pinned, command=command,
                         command_text=" ".join(shlex.quote(t) for t in command), labels=labels(ctx, r.rank),
                         options=options, mounts=mounts, ports=ports)
