"""A profile is one serving lane: engine, image, model, placement, flags, env and expectations."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sparkfleet.schema.base import FieldError, Strict

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FLAG_KEY = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Image(Strict):
    ref: str = Field(min_length=1)  # repository:tag
    digest: str | None = None  # sha256:... pin
    # the engine version inside, as its own `--version` says ("0.11.1"): it picks the log lines the reader
    # expects (vLLM's MoE line differs by version) and the lane rules that need a version (multi-node vLLM)
    engine_version: str | None = Field(None, pattern=r"^\d+\.\d+(\.\d+)?([.+-]?[A-Za-z0-9][A-Za-z0-9.+-]*)?$")

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        if v is not None and not DIGEST.match(v):
            raise ValueError("expected 'sha256:' followed by 64 lowercase hex digits")
        return v

    @property
    def pinned(self) -> str:
        """The reference docker runs: `ref@digest` when a digest is pinned."""
        return f"{self.ref}@{self.digest}" if self.digest else self.ref


class ModelSpec(Strict):
    name: str | None = None  # Hugging Face repo id, for people
    repo_dir: str  # directory under the node's model_root (the HF repo dir, not the snapshot)
    revision: str | None = None  # checkpoint revision (HF commit); exported as a metric label
    snapshot: str | None = None  # snapshots/<dir> inside repo_dir; defaults to revision

    @field_validator("repo_dir")
    @classmethod
    def _relative(cls, v: str) -> str:
        if v.startswith("/") or ".." in v.split("/"):
            raise ValueError("must be a directory name under the node's model_root, without '..'")
        return v


class Engram(Strict):
    mode: Literal["disk", "pinned", "none"]  # disk: rows read from files; pinned: host memory (GB300)
    format: Literal["fp8", "nvfp4"] | None = None
    tensor_pattern: str | None = None  # safetensors name with a {layer} placeholder
    layers: list[int] = Field(default_factory=list)
    shards: list[int] = Field(default_factory=list)
    node_local: bool = False  # mount each node's local copy of its rows
    container_dir: str = "/engram-local"
    nfs_ranks: list[int] = Field(default_factory=list)  # ranks that read from the model dir instead
    # directory under each node's engram_local_dir; default the checkpoint revision (copies are per
    # checkpoint, ENG-26). A lane whose ranks split the rows differently (TP3) needs its own.
    copy_dir: str | None = None

    @field_validator("copy_dir")
    @classmethod
    def _copy_dir(cls, v: str | None) -> str | None:
        if v is not None and ("/" in v or v in ("", ".", "..")):
            raise ValueError("must be one directory name (no '/')")
        return v

    @field_validator("tensor_pattern")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        if v is not None and "{layer}" not in v:
            raise ValueError("must contain the {layer} placeholder")
        return v


class Memory(Strict):
    model_gib_per_rank: float | None = None
    model_gib_per_rank_max: float | None = None  # uneven splits (EXL3 wide slices)
    headroom_after_load_gb: dict[str, float] = Field(default_factory=dict)  # head/workers: measured


class KvRange(Strict):
    min: int = Field(ge=0)
    max: int = Field(ge=0)

    @model_validator(mode="before")
    @classmethod
    def _scalar(cls, data: Any) -> Any:
        if isinstance(data, int) and not isinstance(data, bool):
            return {"min": data, "max": data}
        return data

    @model_validator(mode="after")
    def _order(self) -> KvRange:
        if self.min > self.max:
            raise ValueError("min is larger than max")
        return self


class Expect(Strict):
    kv_tokens: KvRange | None = None
    moe_backend: str | None = None
    engram_node_local: bool = False
    mem_available_floor_gb: dict[str, float] = Field(default_factory=dict)  # head / workers / host
    boot_budget_s: int | None = Field(None, gt=0)
    # a boot with no new line on any rank this long is judged by its processes' CPU use (FM-42); default 600 s
    stall_s: int | None = Field(None, gt=0)
    log_lines: list[str] = Field(default_factory=list)  # other lines that must appear (regex)


class Mount(Strict):
    source: str
    target: str
    readonly: bool = True

    @field_validator("source", "target")
    @classmethod
    def _abs(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must be an absolute path")
        return v


class TensorFoldBuild(Strict):
    """How every rank builds the engine (seed 002 Quick start 2: clone the branch, check out the commit,
    `git am` the patches, `zig build <steps> <options>`); `sparkfleet build` runs it, `up` checks its pin."""

    source: str  # the fork's git URL
    branch: str
    commit: str
    patches: str  # the node dir holding the *.patch files `git am` applies (in name order)
    dir: str  # where the clone is built on every node (zig-out/ under it is the artefact)
    zig: str = "zig"  # the Zig 0.17.0 the recipe's setup.sh fetches
    steps: list[str] = Field(default_factory=lambda: ["install", "native"])
    options: list[str] = Field(default_factory=list)  # -D options, as the seed prints them

    @field_validator("patches", "dir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/") or ".." in v.split("/") or v.rstrip("/") in ("", "/"):
            raise ValueError("must be an absolute node path (without '..'), not /")
        return v.rstrip("/")

    @field_validator("options")
    @classmethod
    def _d_options(cls, v: list[str]) -> list[str]:
        for o in v:
            if not o.startswith("-D") or len(o) < 3:
                raise ValueError(f"{o!r}: each option is a -DNAME[=VALUE] (what `zig build` takes)")
        return v


class TensorFold(Strict):
    recipe_dir: str  # where the recipe (scripts/serve.sh) lives on every node
    model_dir: str  # weights directory on every node (NFS on workers)
    args: dict[str, Any] = Field(default_factory=dict)  # serve settings, flag-dict form
    # what each rank's container runs in the foreground; default: bash <recipe_dir>/scripts/serve.sh start
    rank_command: list[str] | None = None
    build: TensorFoldBuild | None = None  # the engine build `sparkfleet build` runs on every rank


class LlamaCpp(Strict):
    """llama.cpp's own settings; its server arguments are `flags` (llama-server's flag names)."""

    gguf: str | None = None  # the GGUF file, relative to the model dir (model.repo_dir on the node's model_root)
    rpc_ports: dict[str, int] = Field(default_factory=dict)  # worker node -> the port its rpc-server listens on
    server_entrypoint: str = "/app/llama-server"  # where llama.cpp's own images put the binaries (check yours)
    rpc_entrypoint: str = "/app/rpc-server"

    @field_validator("gguf")
    @classmethod
    def _relative(cls, v: str | None) -> str | None:
        if v is not None and (v.startswith("/") or ".." in v.split("/") or not v.endswith(".gguf")):
            raise ValueError("must be a .gguf file name inside the model dir (relative, without '..')")
        return v

    @field_validator("rpc_ports")
    @classmethod
    def _ports(cls, v: dict[str, int]) -> dict[str, int]:
        for node, port in v.items():
            if not 1 <= port <= 65535:
                raise FieldError(node, f"port {port} is not in 1-65535")
        return v


class GateSet(Strict):
    """The answer gates `up` runs for this lane (and `gates` by default); unset = derived from the lane."""

    only: list[str] | None = None  # gate names; default: every gate the lane supports (image needs vision...)
    soak_minutes: float | None = Field(None, gt=0)
    soak_streams: int | None = Field(None, ge=1)
    needle_tokens: list[int] | None = None
    determinism_prompts: int | None = Field(None, ge=1)  # fewer prompts for a slow engine (default 8, HLT-50)


class Rail2(Strict):
    nodes: list[str] = Field(min_length=1)  # nodes that get the runtime alias on their second port


class Profile(Strict):
    name: str
    extends: str | None = None
    abstract: bool = False  # a base for other lanes; never launched itself
    description: str = ""
    examples: list[str] = Field(default_factory=list)  # dotted fields holding example values to set
    engine: str  # one of engines/registry.py's names
    image: Image | None = None
    model: ModelSpec | None = None
    group: str | None = None
    ranks: list[str] | None = None  # rank order by node name; rank 0 is the head
    # true: the lane runs on the first `tp` nodes of its group on purpose (one Spark of the sparks group);
    # otherwise a tp below the group's size is refused unless `ranks:` names the nodes (rules.py lane_shape)
    partial_group: bool = False
    tp: int = Field(1, ge=1)
    dcp: int = Field(1, ge=1)
    port: int | None = Field(None, ge=1, le=65535)
    host: str = "0.0.0.0"
    master_port: int | None = Field(None, ge=1, le=65535)
    served_names: list[str] = Field(default_factory=list)
    api_key_env: str | None = None  # name of the env var holding the API key (never the key)
    # the clock probe before launch (up/restore `probe` step): `required` refuses `up --no-probe`
    probe: Literal["on", "required"] = "on"
    docker: dict[str, Any] = Field(default_factory=dict)  # docker run options, flag-dict form
    flags: dict[str, Any] = Field(default_factory=dict)  # engine arguments, flag-dict form
    env: dict[str, str] = Field(default_factory=dict)
    mounts: list[Mount] = Field(default_factory=list)
    patches: str | None = None  # a patch set under patches/
    engram: Engram | None = None
    memory: Memory = Field(default_factory=Memory)
    expect: Expect = Field(default_factory=Expect)
    fatal_signatures: list[str] = Field(default_factory=list)  # regexes; WARNING lines never match
    servable: bool = True
    unservable_reason: str | None = None
    restore: str | None = None  # what the seeds' restore script for this lane was
    tensorfold: TensorFold | None = None
    llamacpp: LlamaCpp | None = None
    rail2: Rail2 | None = None
    vision: bool = False
    tools: bool = False
    gates: GateSet = Field(default_factory=GateSet)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out = {}
        for key, value in v.items():
            if not ENV_KEY.match(str(key)):
                raise FieldError(key, f"{key!r} is not a valid environment variable name")
            if isinstance(value, bool):
                value = "1" if value else "0"
            if not isinstance(value, str | int | float):
                raise FieldError(key, f"expected a string or number, got {type(value).__name__}")
            out[key] = str(value)
        return out

    @field_validator("flags", "docker")
    @classmethod
    def _flags(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, value in v.items():
            if not FLAG_KEY.match(key):
                raise FieldError(key, f"{key!r} is not a flag name (expected --name)")
            if value is None:
                raise FieldError(key, "null is not a value; use true, a value, or !unset to remove it")
        return v

    @field_validator("fatal_signatures")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
        return v

    @model_validator(mode="after")
    def _complete(self) -> Profile:
        if self.abstract:
            return self
        # the engine's name and the fields its lanes need are the adapter's to judge (engines/registry.py
        # check_lane, run by the loader above the schema)
        if not self.servable and not self.unservable_reason:
            raise FieldError("servable", "servable: false needs unservable_reason")
        return self

    @property
    def world_size(self) -> int:
        return self.tp

    def engram_copy_name(self) -> str | None:
        """The lane's node-local Engram copy directory name (under each node's engram_local_dir)."""
        if self.engram and self.engram.copy_dir:
            return self.engram.copy_dir
        return (self.model.revision or self.model.repo_dir) if self.model else None
