"""Lane rules: refuse a profile before anything runs (pure; profile x inventory -> findings).

Each rule is a lesson from the seeds (docs/failure-modes.md ids in the messages' remedies). The rules here hold
for every engine; an engine's own (vLLM's block size, capture sizes...) live in its adapter.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from sparkfleet.engines.base import at, hardware
from sparkfleet.engines.registry import engine_for
from sparkfleet.findings import Finding
from sparkfleet.naming import container_name
from sparkfleet.placement import Rank, loopback_bound
from sparkfleet.schema.inventory import Inventory
from sparkfleet.schema.load import Loaded
from sparkfleet.schema.yamlsrc import locate

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
def examples(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    """A lane shipped with example values says so once: the profile's fields and the inventory's."""
    p = loaded.profile
    parts = [f"profile: {', '.join(p.examples)}"] if p.examples else []
    if inv.example:
        parts.append(f"inventory {inv.name!r}: node addresses, HCAs and interfaces")
    if parts:
        yield Finding("example-values", "warn", f"example values, not from the seeds: {'; '.join(parts)}",
                      "set them to your lab's values before a real launch (the inventory: remove example: true "
                      "once its nodes are yours)", field="examples" if p.examples else None,
                      where=at(loaded, "examples") if p.examples else None)


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


@rule
def srun_endpoint(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    """A head reached through srun (slurm.ssh: false) that binds loopback: no SSH tunnel can reach its API, so
    readiness would wait out the boot budget for an answer that cannot come."""
    p = loaded.profile
    head = ranks[0].node if ranks else None
    if head is not None and head.transport == "srun" and loopback_bound(p.host):
        yield Finding("endpoint", "fail", f"the lane's API binds {p.host} on {head.name}, which is reached through "
                      "srun (slurm.ssh: false): nothing here can reach it, no SSH tunnel carries it",
                      f"bind the API to an address this machine reaches (-o host=0.0.0.0, or {head.ssh.host})",
                      node=head.name, field="host", where=at(loaded, "host"))


# -- the lane's shape: what docker and the engine would refuse at launch, said at plan ---------------------

# docker's container-name rule (moby daemon/names: RestrictedNamePattern)
DOCKER_NAME = re.compile(r"^/?[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
# the modes `docker run -v SRC:DST:MODE` takes (comma-separated; moby volume/mounts parser)
VOLUME_MODES = {"ro", "rw", "z", "Z", "nocopy", "consistent", "cached", "delegated",
                "shared", "rshared", "slave", "rslave", "private", "rprivate"}


@rule
def lane_shape(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    """dcp divides tp; a lane on part of its group says so (ranks: or partial_group: true)."""
    p = loaded.profile
    if p.tp % p.dcp:
        divisors = ", ".join(str(d) for d in range(1, p.tp + 1) if p.tp % d == 0)
        yield Finding("lane-shape", "fail", f"dcp {p.dcp} does not divide tp {p.tp} ({_set_at(loaded, 'tp')}): "
                      "each DCP group is tp/dcp ranks", f"use a dcp that divides {p.tp}: {divisors}",
                      field="dcp", where=at(loaded, "dcp"))
    members = inv.groups.get(p.group or "", [])
    if p.ranks is None and not p.partial_group and len(members) > len(ranks):
        used = [r.node.name for r in ranks]
        left = [n for n in members if n not in used]
        yield Finding("lane-shape", "fail",
                      f"tp {p.tp} uses {len(used)} of the {len(members)} nodes of group {p.group!r} "
                      f"({', '.join(used)}): {', '.join(left)} would be left out without a word",
                      f"name the nodes in rank order (ranks: [{', '.join(used)}]), or set partial_group: true "
                      f"when the first {len(used)} of the group are meant, or set tp to {len(members)}",
                      field="tp", where=at(loaded, "tp"))


def _set_at(loaded: Loaded, key: str) -> str:
    """Where a field's value came from: `set at FILE:LINE`, `set by -o KEY=VALUE`, or the default."""
    file, line = locate(loaded.marks, (key,))
    if (key,) not in loaded.marks and not any(k[:1] == (key,) for k in loaded.marks):
        return "the default"
    if file and file.startswith("-o "):
        return f"set by {file}"
    return f"set at {file}:{line}" if line else f"set in {file}"


@rule
def docker_names(loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    """The container name and the bind mounts as docker will parse them."""

    p = loaded.profile
    name = container_name(p.name, 0)
    if not DOCKER_NAME.match(name):
        yield Finding("docker-name", "fail", f"container name {name!r} (from the profile's name {p.name!r}) is not "
                      "one docker accepts: [a-zA-Z0-9][a-zA-Z0-9_.-]+",
                      "rename the profile file: letters, digits, '_', '.' and '-' only", field="name",
                      where=loaded.chain[-1] if loaded.chain else None)
    for i, m in enumerate(p.mounts):
        for part in ("source", "target"):
            value = getattr(m, part)
            if ":" in value or not value.strip() or "\n" in value:
                yield Finding("docker-mount", "fail", f"mounts[{i}].{part} {value!r}: docker's -v SRC:DST[:MODE] "
                              "cannot carry a path with ':' (nor an empty one)",
                              "mount a path without ':' (a symlink to it, or the directory above)",
                              field=f"mounts.{i}.{part}", where=at(loaded, "mounts", i, part))
    for flag in ("-v", "--volume"):
        values = p.docker.get(flag)
        for j, spec in enumerate(values if isinstance(values, list) else [] if values is None else [values]):
            parts = str(spec).split(":")
            modes = parts[2].split(",") if len(parts) == 3 else []
            if len(parts) not in (2, 3) or not all(parts[:2]) or not parts[1].startswith("/") or \
                    any(x not in VOLUME_MODES for x in modes):
                yield Finding("docker-mount", "fail", f"docker {flag} {spec!r} is not SRC:DST[:MODE] with an "
                              f"absolute DST and MODE of {', '.join(sorted(VOLUME_MODES))}",
                              "fix the volume spec (a path with ':' cannot be mounted with -v)",
                              field=f"docker.{flag}", where=at(loaded, "docker", flag, *([j] if isinstance(values, list)
                                                                                         else [])))
