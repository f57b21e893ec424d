"""What every engine adapter produces: one Launch per rank, in execution order."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sparkfleet.placement import Rank
from sparkfleet.render.flags import flag_tokens
from sparkfleet.render.shell import render, to_argv
from sparkfleet.spec.inventory import Inventory, Node
from sparkfleet.spec.profile import Profile

LABEL_PREFIX = "sparkfleet"


@dataclass
class LaneContext:
    """Everything rendering needs; pure data, no I/O."""

    profile: Profile
    inventory: Inventory
    ranks: list[Rank]
    template_dir: Path
    run_id: str = "plan"
    gid_index: dict[str, int] = field(default_factory=dict)  # resolved `auto` GID indexes, by node
    patch_mounts: list[tuple[str, str]] = field(default_factory=list)  # (relative source, target)

    @property
    def head(self) -> Node:
        return self.ranks[0].node


@dataclass
class Launch:
    node: str
    rank: int
    role: str  # head | worker
    wave: int  # launches of one wave start together; waves run in order
    container: str
    argv: list[str]
    env: dict[str, str]
    script: str  # the rendered shell, as run on the node
    files: dict[str, str] = field(default_factory=dict)  # path on the node -> content

    def as_dict(self) -> dict:
        d = {"node": self.node, "rank": self.rank, "role": self.role, "wave": self.wave,
             "container": self.container, "argv": self.argv, "env": self.env, "script": self.script}
        if self.files:
            d["files"] = self.files
        return d


class Engine(Protocol):
    name: str

    def launches(self, ctx: LaneContext) -> list[Launch]: ...


def container_name(profile: Profile, rank: int) -> str:
    return f"sf-{profile.name}-r{rank}"


def labels(ctx: LaneContext, rank: int) -> dict[str, str]:
    """Labels mark sparkfleet's containers: `stop` only ever touches containers carrying them."""
    return {f"{LABEL_PREFIX}.profile": ctx.profile.name, f"{LABEL_PREFIX}.rank": str(rank),
            f"{LABEL_PREFIX}.run": ctx.run_id}


def gid_for(ctx: LaneContext, node: Node) -> str:
    """The node's RoCE v2 IPv4 GID index; `auto` until facts resolve it."""
    if node.name in ctx.gid_index:
        return str(ctx.gid_index[node.name])
    return str(node.rdma.gid_index) if node.rdma else "auto"


def groups(flags: dict, lists: str = "nargs") -> list[list[str]]:
    """Flag tokens grouped per flag, so templates can print one flag per line."""
    out: list[list[str]] = []
    for key, value in flags.items():
        tokens = flag_tokens({key: value}, lists)  # type: ignore[arg-type]
        if not tokens:
            continue
        if lists == "repeat" and isinstance(value, list):
            out += [tokens[i:i + 2] for i in range(0, len(tokens), 2)]
        else:
            out.append(tokens)
    return out


def env_from_argv(argv: list[str], stop_at: str) -> dict[str, str]:
    """The container env, read back from the `-e K=V` options before the image."""
    env: dict[str, str] = {}
    end = argv.index(stop_at) if stop_at in argv else len(argv)
    it = iter(argv[:end])
    for token in it:
        if token in ("-e", "--env"):
            key, _, value = next(it).partition("=")
            env[key] = value
    return env


def render_launch(ctx: LaneContext, template: str, context: dict) -> tuple[str, list[str]]:
    script = render(ctx.template_dir, template, context)
    return script, to_argv(script)
