"""What an engine adapter is, and what it produces: one Launch per rank, in execution order.

An adapter (one module per engine, listed in engines/registry.py) owns everything specific to its
engine: the launch (a ContainerSpec per rank, its command from one template), the flags and env
sparkfleet sets itself (reserved), its lane rules, its log vocabulary, its metric names and the
variable its API key is read from.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from sparkfleet import naming
from sparkfleet.engines.build_recipe import EngineBuild
from sparkfleet.engines.container import ContainerSpec, docker_argv, docker_script
from sparkfleet.engines.logs import LogVocabulary
from sparkfleet.findings import Finding
from sparkfleet.placement import Rank
from sparkfleet.render.flags import flag_tokens
from sparkfleet.render.shell import render, to_argv
from sparkfleet.schema.inventory import Inventory, Node
from sparkfleet.schema.load import Loaded
from sparkfleet.schema.profile import Profile
from sparkfleet.schema.yamlsrc import locate

T = TypeVar("T")


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
    # an `auto` GID index not in gid_index renders as its slot (gid_slot), bound once facts resolve it (bind_gids)
    late_gids: bool = False

    @property
    def head(self) -> Node:
        return self.ranks[0].node


@dataclass
class Launch:
    """One rank's start: what runs on which node, in which wave. `spec` is the container as data
    (None for a launch that is not a container); argv, env and script are rendered from it."""

    node: str
    rank: int
    role: str  # head | worker
    wave: int  # launches of one wave start together; waves run in order
    container: str
    argv: list[str]
    env: dict[str, str]
    script: str  # the rendered shell, as run on the node
    files: dict[str, str] = field(default_factory=dict)  # path on the node -> content
    spec: ContainerSpec | None = None
    # shell run on the node once the wave has started; it must exit 0 before the next wave (e.g. an RPC
    # server accepting, which the head connects to once); its stderr says why not. "" for none.
    ready_check: str = ""

    @classmethod
    def of(cls, r: Rank, wave: int, spec: ContainerSpec, files: dict[str, str] | None = None) -> Launch:
        """A container launch: argv and shell rendered from the spec (engines/container.py)."""
        return cls(r.node.name, r.rank, r.role, wave, spec.name, docker_argv(spec), spec.env_items(),
                   docker_script(spec), dict(files or {}), spec)

    def as_dict(self) -> dict:
        d = {"node": self.node, "rank": self.rank, "role": self.role, "wave": self.wave,
             "container": self.container, "argv": self.argv, "env": self.env, "script": self.script}
        if self.files:
            d["files"] = self.files
        if self.ready_check:
            d["ready_check"] = self.ready_check
        return d


@dataclass(frozen=True)
class MetricNames:
    """An engine's /metrics names, by what the bench and dashboards read them for.

    `counters` keys: generation_tokens, prompt_tokens, requests, preemptions, prefix_cache_queries,
    prefix_cache_hits, drafts, draft_tokens, accepted; `gauges` keys: running, waiting, kv_usage;
    `histograms` keys: ttft, itl. `fallbacks`: a key's older name, read when the current one is absent.
    An engine lists only what it exports."""

    prefix: str  # every name of the engine's own starts with it ("vllm:", "llamacpp:")
    counters: dict[str, str] = field(default_factory=dict)
    gauges: dict[str, str] = field(default_factory=dict)
    per_pos: str | None = None  # spec decoding: accepted tokens per draft position
    histograms: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)


LaneRule = Callable[["Engine", Loaded, Inventory, list[Rank]], Iterator[Finding]]


class Engine:
    """The base every adapter extends; class attributes are the engine's vocabulary."""

    name: ClassVar[str]
    required: ClassVar[tuple[str, ...]] = ("image", "model", "group", "port")  # profile fields a lane must set
    reserved_flags: ClassVar[tuple[str, ...]] = ()  # set by sparkfleet from the profile and inventory
    reserved_env: ClassVar[tuple[str, ...]] = ()  # per node, from the inventory
    log: ClassVar[LogVocabulary] = LogVocabulary()
    metrics: ClassVar[MetricNames | None] = None  # None: no /metrics the bench or dashboards read
    api_key_var: ClassVar[str | None] = None  # the container variable the engine reads its API key from
    # the launch variables that carry a RoCE GID index: a fixed one must be the node's RoCE v2 entry (INV-23)
    gid_env: ClassVar[tuple[str, ...]] = ()
    ready_from_log: ClassVar[bool] = False  # wait for the head's `log.serving` line as well as /health
    lane_rules: ClassVar[tuple[LaneRule, ...]] = ()
    # hardware classes whose kernel autotune cache `up` seeds while a rank boots (runner/autotune.py)
    autotune_hardware: ClassVar[frozenset[str]] = frozenset()
    chat_template_flag: ClassVar[str | None] = None  # the flag that names the lane's chat template file
    # the shared checks (sparkfleet/checks) that judge something only this engine does, by check name:
    # kv-sizing (KV sized by --gpu-memory-utilization), graph-memory, long-context
    guarded_by: ClassVar[frozenset[str]] = frozenset()
    # the ranks are one CUDA program (NCCL between them), so a rank on another NVIDIA driver or CUDA fails the
    # lane; False: each rank drives its own GPU (llama.cpp's rpc-servers), so a difference only warns (drift)
    ranks_share_driver: ClassVar[bool] = True
    # why `engram-local` needs --source for this engine (its weights pack has no Engram shards), or None
    engram_source_needed: ClassVar[str | None] = None
    # the entrypoint of the engine's published image (a lane's command follows it); None: the lane's command is
    # the container's whole command (or its --entrypoint). The lab's images are built with it (sim/sandbox.py).
    image_entrypoint: ClassVar[tuple[str, ...] | None] = None

    def model_dir(self, profile: Profile, node: Node) -> str | None:
        """Where the lane's weights are on this node: the model's repo dir under the node's model root."""
        if profile.model is None:
            return None
        return posixpath.join(node.storage.model_root, profile.model.repo_dir)

    def fact_paths(self, profile: Profile, node: Node) -> list[str]:
        """The lane's own paths a rank's node reports on in its facts (beyond the node's storage dirs)."""
        d = self.model_dir(profile, node)
        return [d] if d else []

    def model_label(self, profile: Profile) -> str:
        """What the exporter's lane_info names as the lane's model."""
        return (profile.model.name or profile.model.repo_dir) if profile.model else ""

    def engram_copy_dir(self, ctx: LaneContext, r: Rank) -> str | None:
        """The node-local Engram copy this engine's rank mounts, or None (it reads the model dir)."""
        return None

    def log_for(self, p: Profile) -> LogVocabulary:
        """The lines this lane's ranks are read for: the engine's, and the profile's expect.log_lines."""
        return dataclasses.replace(self.log, expected=tuple(p.expect.log_lines))

    def engine_build(self, profile: Profile) -> EngineBuild | None:
        """The build every rank runs before this lane can serve (`sparkfleet build`), or None: the engine
        comes in the image."""
        return None

    def launches(self, ctx: LaneContext) -> list[Launch]:
        """Every rank's launch, in the order they start (waves)."""
        raise NotImplementedError

    def rules(self, loaded: Loaded, inventory: Inventory, ranks: list[Rank]) -> list[Finding]:
        """The engine's lane rules, in order (rules.py runs them between the shared ones)."""
        return [f for rule in self.lane_rules for f in rule(self, loaded, inventory, ranks)]


def at(loaded: Loaded, *path: Any) -> str | None:
    """`file:line` of a profile key, for a finding's `where`."""
    file, line = locate(loaded.marks, tuple(path))
    return f"{file}:{line}" if file and line else file


def reserved(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    """Flags and env the adapter sets itself may not come from the profile."""
    p = loaded.profile
    for flag in p.flags:
        if flag in engine.reserved_flags:
            yield Finding("reserved", "fail", f"{flag} is set by sparkfleet from the profile and inventory",
                          "use the profile's port/host/served_names/tp/dcp/master_port fields instead",
                          field=f"flags.{flag}", where=at(loaded, "flags", flag))
    for key in p.env:
        if key in engine.reserved_env:
            yield Finding("reserved", "fail", f"env {key} is per node and comes from the inventory",
                          "set the node's fabric_ip, rdma and storage in the inventory instead",
                          field=f"env.{key}", where=at(loaded, "env", key))


def hardware(ranks: list[Rank]) -> set[str]:
    return {r.node.hardware for r in ranks}


def container_name(profile: Profile, rank: int) -> str:
    return naming.container_name(profile.name, rank)


def labels(ctx: LaneContext, rank: int) -> dict[str, str]:
    """Labels mark sparkfleet's containers: `stop` only ever touches containers carrying them."""
    return naming.labels(ctx.profile.name, rank, ctx.run_id)


def gid_for(ctx: LaneContext, node: Node) -> str:
    """The node's RoCE v2 IPv4 GID index; `auto` until facts resolve it (its slot, with `late_gids`)."""
    if node.name in ctx.gid_index:
        return str(ctx.gid_index[node.name])
    if ctx.late_gids and node.rdma is not None and node.rdma.gid_index == "auto":
        return gid_slot(node.name)
    return str(node.rdma.gid_index) if node.rdma else "auto"


def gid_slot(node: str) -> str:
    """Where a node's `auto` GID index stands in a launch rendered before facts (shell-safe: shlex.quote
    leaves it bare, as it leaves the index that replaces it; node names are [a-z0-9_-])."""
    return f"@sparkfleet-gid:{node}@"


SLOT = re.compile(r"@sparkfleet-gid:([a-z0-9][a-z0-9_-]*)@")


def bind_gids(value: T, gid_index: dict[str, int]) -> T:
    """`value` (a Launch, a ContainerSpec, a plan step: strings, lists, dicts and dataclasses of them) with each
    GID slot replaced by the node's resolved index, or `auto` where facts did not resolve it: exactly what
    rendering with those indexes gives (tests/test_plan.py holds that), without rendering again."""
    def sub(m: re.Match[str]) -> str:
        return str(gid_index[m.group(1)]) if m.group(1) in gid_index else "auto"

    def bind(v: Any) -> Any:
        if isinstance(v, str):
            return SLOT.sub(sub, v) if "@sparkfleet-gid:" in v else v
        if isinstance(v, list):
            return [bind(x) for x in v]
        if isinstance(v, tuple):
            return tuple(bind(x) for x in v)
        if isinstance(v, dict):
            return {bind(k): bind(x) for k, x in v.items()}
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return dataclasses.replace(v, **{f.name: bind(getattr(v, f.name))
                                             for f in dataclasses.fields(v) if f.init})
        return v

    return bind(value)


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


def render_command(ctx: LaneContext, template: str, context: dict) -> tuple[str, list[str]]:
    """An engine template's text (the command after the image, or a whole script) and its argv."""
    text = render(ctx.template_dir, template, context)
    return text, to_argv(text)
