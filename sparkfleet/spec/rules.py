"""Lane rules: refuse a profile before anything runs (pure; profile x inventory -> findings).

Each rule is a lesson from the seeds (CATALOG.md ids in the messages' remedies).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from sparkfleet.engines.sglang import RESERVED_FLAGS as SGLANG_RESERVED
from sparkfleet.engines.vllm import RESERVED_ENV, RESERVED_FLAGS
from sparkfleet.findings import Finding
from sparkfleet.placement import Rank
from sparkfleet.spec.inventory import Inventory
from sparkfleet.spec.load import Loaded
from sparkfleet.spec.profile import Profile
from sparkfleet.spec.yamlsrc import locate

Rule = Callable[[Loaded, Inventory, list[Rank]], Iterator[Finding]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def lint(loaded: Loaded, inventory: Inventory, ranks: list[Rank]) -> list[Finding]:
    """Every rule's findings, in rule order."""
    return [f for r in RULES for f in r(loaded, inventory, ranks)]


def _at(loaded: Loaded, *path: Any) -> str | None:
    file, line = locate(loaded.marks, tuple(path))
    return f"{file}:{line}" if file and line else file


def _hardware(inventory: Inventory, ranks: list[Rank]) -> set[str]:
    return {r.node.hardware for r in ranks}


def speculative(p: Profile) -> dict | None:
    spec = p.flags.get("--speculative-config")
    return spec if isinstance(spec, dict) else None


def capture_sizes(p: Profile) -> tuple[list[int] | None, tuple[str, ...]]:
    """The CUDA-graph capture list and where it is set (compilation config or its own flag)."""
    cc = p.flags.get("--compilation-config")
    if isinstance(cc, dict) and "cudagraph_capture_sizes" in cc:
        return list(cc["cudagraph_capture_sizes"]), ("flags", "--compilation-config", "cudagraph_capture_sizes")
    sizes = p.flags.get("--cudagraph-capture-sizes")
    if isinstance(sizes, list):
        return [int(s) for s in sizes], ("flags", "--cudagraph-capture-sizes")
    return None, ("flags",)


def required_capture_sizes(k: int, max_num_seqs: int) -> list[int]:
    """Every multiple of k and of k+1 up to max_num_seqs x (k+1) (CATALOG FM-14, DESIGN OQ-02)."""
    top = max_num_seqs * (k + 1)
    return sorted({m for step in (k, k + 1) for m in range(step, top + 1, step)})


@rule
def not_servable(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if not p.servable:
        yield Finding("servable", "fail", f"lane {p.name!r} never served: {p.unservable_reason}",
                      "pick a servable lane (`sparkfleet profiles`)", field="servable",
                      where=_at(loaded, "servable"))


@rule
def eager(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.engine == "tensorfold":
        return
    if p.flags.get("--enforce-eager") not in (None, False):
        yield Finding("eager", "fail", "eager mode (--enforce-eager) is the throughput ceiling: ~200 ms a step",
                      "remove --enforce-eager; lanes run with CUDA graphs (CATALOG LCH-04, FM-08)",
                      field="flags.--enforce-eager", where=_at(loaded, "flags", "--enforce-eager"))
    cc = p.flags.get("--compilation-config")
    mode = cc.get("cudagraph_mode") if isinstance(cc, dict) else None
    if isinstance(mode, str) and mode.upper() == "NONE":
        yield Finding("eager", "fail", "cudagraph_mode NONE runs eager",
                      "use FULL_AND_PIECEWISE (CATALOG LCH-04)", field="flags.--compilation-config",
                      where=_at(loaded, "flags", "--compilation-config", "cudagraph_mode"))


@rule
def block_size(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.engine != "vllm" or "gb10" not in _hardware(inv, ranks):
        return
    value = p.flags.get("--block-size")
    if str(value) != "128":
        yield Finding("block-size", "fail",
                      f"a vLLM lane on GB10 needs --block-size 128 (has {value if value is not None else 'none'})",
                      "set flags: {--block-size: 128}; 32 and 64 die at KV init with 'No common block size' "
                      "(CATALOG FM-04)", field="flags.--block-size", where=_at(loaded, "flags", "--block-size"))


@rule
def jit_guard(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.engine == "tensorfold" or "gb10" not in _hardware(inv, ranks):
        return
    missing = [k for k in ("MAX_JOBS", "FLASHINFER_NVCC_THREADS") if k not in p.env]
    if missing:
        yield Finding("jit-guard", "fail", f"no JIT-storm guard: {', '.join(missing)} not set",
                      "set env MAX_JOBS: 2 and FLASHINFER_NVCC_THREADS: 1; a 22-job runtime compile wedged "
                      "all four nodes (CATALOG LCH-10, FM-02)", field="env", where=_at(loaded, "env"))


@rule
def capture_rule(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.engine != "vllm" or "gb10" not in _hardware(inv, ranks):
        return
    spec = speculative(p)
    k = spec.get("num_speculative_tokens") if spec else None
    if not isinstance(k, int) or "num_speculative_tokens_per_batch_size" in (spec or {}):
        return
    mns = p.flags.get("--max-num-seqs")
    sizes, path = capture_sizes(p)
    if not isinstance(mns, int):
        yield Finding("capture-sizes", "warn",
                      "--max-num-seqs is not set, so the capture sizes cannot be checked against the rule",
                      "set --max-num-seqs; the rule is every multiple of k and k+1 up to max_num_seqs x (k+1) "
                      "(CATALOG FM-14)", field="flags.--max-num-seqs", where=_at(loaded, "flags"))
        return
    want = required_capture_sizes(k, mns)
    if sizes is None:
        return  # generated from the rule at render time
    missing = [s for s in want if s not in sizes]
    if missing:
        yield Finding("capture-sizes", "warn",
                      f"capture sizes miss {missing} required by the rule for k={k}, max_num_seqs={mns}",
                      "padded DSpark batches can hang SM120 sparse MLA (CATALOG FM-14, OQ-02); add them or "
                      "drop the list to have it generated", field=".".join(map(str, path[:2])),
                      where=_at(loaded, *path), observed=str(sizes), expected=str(want))


@rule
def k_schedule(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    spec = speculative(loaded.profile)
    if not spec:
        return
    k = spec.get("num_speculative_tokens")
    for band in spec.get("num_speculative_tokens_per_batch_size") or []:
        if not (isinstance(band, list) and len(band) == 3):
            yield Finding("k-schedule", "fail", f"band {band!r} is not [first_batch, last_batch, k]",
                          "write each band as [lo, hi, k]", field="flags.--speculative-config",
                          where=_at(loaded, "flags", "--speculative-config"))
            continue
        if band[2] not in (k, 1):
            yield Finding("k-schedule", "fail",
                          f"band {band} drafts k={band[2]} inside a num_speculative_tokens={k} schedule: it pays "
                          f"the full {k}-token verify for {band[2]}",
                          f"use k={k} or k=1 in every band (CATALOG FM-58)", field="flags.--speculative-config",
                          where=_at(loaded, "flags", "--speculative-config", "num_speculative_tokens_per_batch_size"))


@rule
def reasoning_medium(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    kwargs = loaded.profile.flags.get("--default-chat-template-kwargs")
    if isinstance(kwargs, dict) and kwargs.get("reasoning_effort") == "medium":
        yield Finding("reasoning-effort", "fail", "reasoning_effort 'medium': the V4.1 chat template returns 400",
                      "use low, high, xhigh, max or an integer 1-100 (CATALOG LCH-G11, FM-56)",
                      field="flags.--default-chat-template-kwargs",
                      where=_at(loaded, "flags", "--default-chat-template-kwargs", "reasoning_effort"))


@rule
def station_offload(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if "gb300" not in _hardware(inv, ranks):
        return
    params = p.flags.get("--cpu-offload-params")
    if params is not None:
        items = params if isinstance(params, list) else [params]
        bad = [x for x in items if not str(x).startswith("routed_experts.")]
        if bad:
            yield Finding("offload-matcher", "fail", f"offload matcher {bad} is not routed_experts.*",
                          "use --cpu-offload-params routed_experts.w13_weight routed_experts.w2_weight "
                          "(CATALOG LCH-G6)", field="flags.--cpu-offload-params",
                          where=_at(loaded, "flags", "--cpu-offload-params"))
    text = " ".join([*map(str, p.flags), *map(str, p.flags.values()), *p.env, *p.env.values()]).lower()
    if "megamoe" in text and len(ranks) == 1:
        yield Finding("megamoe", "fail", "MegaMoE on one GPU: it needs expert parallel, then OOMs at construction "
                      "(268.8 GiB needed, 249.8 available)", "remove the MegaMoE setting (CATALOG FM-57)",
                      field="flags", where=_at(loaded, "flags"))


@rule
def reserved(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    flags = SGLANG_RESERVED if p.engine == "sglang" else RESERVED_FLAGS
    for flag in p.flags:
        if flag in flags:
            yield Finding("reserved", "fail", f"{flag} is set by sparkfleet from the profile and inventory",
                          "use the profile's port/host/served_names/tp/dcp/master_port fields instead",
                          field=f"flags.{flag}", where=_at(loaded, "flags", flag))
    for key in p.env:
        if key in RESERVED_ENV:
            yield Finding("reserved", "fail", f"env {key} is per node and comes from the inventory",
                          "set the node's fabric_ip, rdma and storage in the inventory instead",
                          field=f"env.{key}", where=_at(loaded, "env", key))


@rule
def image_pin(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.image and not p.image.digest:
        yield Finding("image-digest", "warn", f"image {p.image.ref} has no digest pin",
                      "add image.digest (sha256:...) so a re-pushed tag cannot change the lane",
                      field="image.digest", where=_at(loaded, "image"))


@rule
def examples(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.examples:
        yield Finding("example-values", "warn", f"example values, not from the seeds: {', '.join(p.examples)}",
                      "set them to your lab's values before a real launch", field="examples",
                      where=_at(loaded, "examples"))
    if inv.example:
        yield Finding("example-values", "warn",
                      f"inventory {inv.name!r} holds example addresses, HCAs and interfaces",
                      "set your nodes' values in the inventory (marked example: true)")


@rule
def engram_nodes(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    e = loaded.profile.engram
    if not e or not e.node_local:
        return
    for r in ranks:
        if r.rank in e.nfs_ranks and r.node.storage.model_local:
            # the node holding the checkpoint reads its rows from local disk (3 ms a step, ENG-16): no copy needed
            yield Finding("engram-nfs", "ok", f"rank {r.rank} ({r.node.name}) reads Engram rows from its local "
                          "checkpoint (the model is on this node's disk)", node=r.node.name, field="engram.nfs_ranks")
        elif r.rank in e.nfs_ranks:
            yield Finding("engram-nfs", "warn", f"rank {r.rank} ({r.node.name}) reads Engram rows over NFS",
                          "6-8 ms a step against 3 locally (CATALOG ENG-16); drop it from engram.nfs_ranks "
                          "once it has a copy", node=r.node.name, field="engram.nfs_ranks")
        elif r.node.storage.engram_local_dir is None:
            yield Finding("engram-nfs", "warn",
                          f"rank {r.rank} ({r.node.name}) has no engram_local_dir in the inventory: reads over NFS",
                          "set storage.engram_local_dir for the node", node=r.node.name)

