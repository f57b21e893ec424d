"""Lane rules: refuse a profile before anything runs (pure; profile x inventory -> findings).

Each rule is a lesson from the seeds (docs/failure-modes.md ids in the messages' remedies). The rules here hold
for every engine; an engine's own (vLLM's block size, capture sizes...) live in its adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sparkfleet.engines.base import at, hardware
from sparkfleet.engines.registry import engine_for
from sparkfleet.findings import Finding
from sparkfleet.placement import Rank
from sparkfleet.spec.inventory import Inventory
from sparkfleet.spec.load import Loaded

Rule = Callable[[Loaded, Inventory, list[Rank]], Iterator[Finding]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def lint(loaded: Loaded, inventory: Inventory, ranks: list[Rank]) -> list[Finding]:
    """Every rule's findings, in rule order: whether the lane is servable, then the engine's own rules
    (its adapter's `lane_rules`), then the rules every lane shares."""
    first, *rest = RULES
    engine = engine_for(loaded.profile.engine)
    return [*first(loaded, inventory, ranks), *engine.rules(loaded, inventory, ranks),
            *(f for r in rest for f in r(loaded, inventory, ranks))]


@rule
def not_servable(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if not p.servable:
        yield Finding("servable", "fail", f"lane {p.name!r} never served: {p.unservable_reason}",
                      "pick a servable lane (`sparkfleet profiles`)", field="servable",
                      where=at(loaded, "servable"))


@rule
def station_offload(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if "gb300" not in hardware(ranks):
        return
    params = p.flags.get("--cpu-offload-params")
    if params is not None:
        items = params if isinstance(params, list) else [params]
        bad = [x for x in items if not str(x).startswith("routed_experts.")]
        if bad:
            yield Finding("offload-matcher", "fail", f"offload matcher {bad} is not routed_experts.*",
                          "use --cpu-offload-params routed_experts.w13_weight routed_experts.w2_weight "
                          "(LCH-G6)", field="flags.--cpu-offload-params",
                          where=at(loaded, "flags", "--cpu-offload-params"))
    text = " ".join([*map(str, p.flags), *map(str, p.flags.values()), *p.env, *p.env.values()]).lower()
    if "megamoe" in text and len(ranks) == 1:
        yield Finding("megamoe", "fail", "MegaMoE on one GPU: it needs expert parallel, then OOMs at construction "
                      "(268.8 GiB needed, 249.8 available)", "remove the MegaMoE setting (docs/failure-modes.md FM-57)",
                      field="flags", where=at(loaded, "flags"))


@rule
def image_pin(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.image and not p.image.digest:
        yield Finding("image-digest", "warn", f"image {p.image.ref} has no digest pin",
                      "add image.digest (sha256:...) so a re-pushed tag cannot change the lane",
                      field="image.digest", where=at(loaded, "image"))


@rule
def examples(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.examples:
        yield Finding("example-values", "warn", f"example values, not from the seeds: {', '.join(p.examples)}",
                      "set them to your lab's values before a real launch", field="examples",
                      where=at(loaded, "examples"))
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
                          "6-8 ms a step against 3 locally (ENG-16); drop it from engram.nfs_ranks "
                          "once it has a copy", node=r.node.name, field="engram.nfs_ranks")
        elif r.node.storage.engram_local_dir is None:
            yield Finding("engram-nfs", "warn",
                          f"rank {r.rank} ({r.node.name}) has no engram_local_dir in the inventory: reads over NFS",
                          "set storage.engram_local_dir for the node", node=r.node.name)



@rule
def api_key(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.api_key_env and engine_for(p.engine).api_key_var is None:
        yield Finding("api-key", "fail", f"engine {p.engine} does not take an API key from sparkfleet",
                      "drop api_key_env, or set the key the way the engine's own recipe reads it",
                      field="api_key_env", where=at(loaded, "api_key_env"))
