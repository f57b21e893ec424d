"""Node facts for a lane (or for bare nodes): what to ask each node, the one round trip, the answers.

`facts_requests` decides which paths each node reports on: its storage dirs, and for a lane the
model dir, the Engram and cache dirs and every `-v SRC:DST` bind-mount source of that node's
rendered launch (so a missing source is caught before Docker binds an empty directory, FM-12).
`gather` runs the node-side helper everywhere in parallel and validates each answer as NodeFacts;
a node that fails gives its failed Result and never hides the others.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from sparkfleet.engines.registry import engine_for
from sparkfleet.fleet.nodefacts import FactsRequest, NodeFacts
from sparkfleet.fleet.op import OpGen, run_ops
from sparkfleet.fleet.ops.facts_helper import Facts
from sparkfleet.fleet.ship import helper_ops
from sparkfleet.fleet.transport import Result, Transport
from sparkfleet.patches import manifest as pm
from sparkfleet.plan import make_plan
from sparkfleet.schema.errors import UserError
from sparkfleet.schema.inventory import Inventory, Node
from sparkfleet.schema.playbook import Playbook, Step

if TYPE_CHECKING:  # the plan (and the engines it renders with) is loaded only for a lane's facts
    from sparkfleet.plan import Plan
    from sparkfleet.schema.load import Loaded
    from sparkfleet.schema.profile import Profile

def _add(paths: list[str], path: str | None) -> None:
    if path and path.startswith("/"):
        path = posixpath.normpath(path)
        if path not in paths:
            paths.append(path)


def storage_paths(node: Node) -> list[str]:
    """The node's own storage dirs (inventory), whatever lane runs."""
    s = node.storage
    paths: list[str] = []
    for p in (s.model_root, s.engram_local_dir, s.cache_dir,
              s.nfs_mount.path if s.nfs_mount else None, s.nfs_export.path if s.nfs_export else None):
        _add(paths, p)
    return paths


def model_dir(profile: Profile, node: Node) -> str | None:
    """Where the lane's weights are on this node (the engine adapter says)."""

    return engine_for(profile.engine).model_dir(profile, node)


def plan_for(loaded: Loaded, inventory: Inventory, root: Path) -> Plan:
    """The lane's plan, rendered only for its launches (a one-step playbook: no playbook file read)."""

    return make_plan(loaded, inventory, Playbook(name="facts", steps=[Step(step="facts")]), root)


def fabric_ifaces(node: Node) -> list[str]:
    """The interfaces the node's link facts cover: its fabric interface and its rail-2 interface."""
    if node.rdma is None:
        return []
    return [i for i in dict.fromkeys((node.rdma.fabric_iface, node.rdma.rail2_iface)) if i]


def patch_paths(root: Path | None, profile: Profile | None, node: Node) -> list[str]:
    """Where the lane's patch files are on this node (hashed by the helper for the drift check)."""
    if root is None or profile is None or not profile.patches:
        return []

    if not (pm.set_dir(root, profile.patches) / pm.MANIFEST).is_file():
        return []  # plan and the patches step say so
    manifest = pm.load(root, profile.patches)
    return [posixpath.join(node.storage.patch_root, manifest.name, f.source) for f in manifest.files]


def facts_requests(inventory: Inventory, plan: Plan | None = None, profile: Profile | None = None,
                   nodes: Iterable[str] = (), root: Path | None = None) -> dict[str, FactsRequest]:
    """What to ask each node: the plan's nodes (lane paths) plus `nodes` (storage dirs only).

    With `plan`, every bind-mount source of each node's launch (its ContainerSpec) is asked about;
    with `profile` too, the model dir, the Engram dirs and TensorFold's recipe dir. Paths are absolute,
    normalised and listed once, storage dirs first. Every node's fabric interfaces are asked about;
    with `root` (the ops dir) too, the lane's patch files are hashed.
    """
    paths: dict[str, list[str]] = {}
    for name in nodes:
        if name not in inventory.nodes:
            raise UserError(f"node {name!r} is not in inventory {inventory.name!r} "
                            f"(nodes: {', '.join(inventory.nodes)})")
        paths.setdefault(name, storage_paths(inventory.nodes[name]))
    if plan is not None:
        for rank in plan.ranks:
            node = rank.node
            mine = paths.setdefault(node.name, storage_paths(node))
            if profile is not None:
                for path in engine_for(profile.engine).fact_paths(profile, node):
                    _add(mine, path)
            for launch in plan.launches:
                if launch.node == node.name and launch.spec is not None:
                    for src in launch.spec.bind_sources:
                        _add(mine, src)
    elif profile is not None:
        raise ValueError("facts_requests: a profile needs its plan (see plan_for)")
    hashed = {r.node.name: patch_paths(root, profile, r.node) for r in plan.ranks} if plan is not None else {}
    return {name: FactsRequest(node=name, paths=p, interfaces=fabric_ifaces(inventory.nodes[name]),
                               hash_paths=hashed.get(name, [])) for name, p in paths.items()}


def gather_ops(nodes: Iterable[Node], requests: dict[str, FactsRequest],
               timeout_s: float = 30.0) -> OpGen[dict[str, NodeFacts | Result]]:
    """One helper run per node, in parallel; each node's NodeFacts, or its failed Result with the cause.
    Under --dry-run (the helper's run not made) there are no facts: an empty mapping."""
    nodes = list(nodes)
    stdin = {n.name: requests.get(n.name, FactsRequest(node=n.name)).model_dump_json() for n in nodes}
    op = Facts()
    results = yield from helper_ops(op, nodes, stdin, timeout_s)
    out = {n.name: op.parse(results[n.name]) for n in nodes if n.name in results}
    for n in nodes:  # the inventory says a node is simulated (sim up writes it); tables tag it [sim]
        f = out.get(n.name)
        if isinstance(f, NodeFacts):
            f.simulated = n.simulation
    return out


def gather(transport: Transport, nodes: Iterable[Node], requests: dict[str, FactsRequest],
           timeout_s: float = 30.0) -> dict[str, NodeFacts | Result]:
    """gather_ops run now through the executor (for commands that only read)."""
    nodes = list(nodes)
    return run_ops(transport, nodes, gather_ops(nodes, requests, timeout_s))


def resolve_gid_indexes(inventory_nodes: Iterable[Node], facts: dict[str, NodeFacts | Result]) -> dict[str, int]:
    """GID index per node for the launch: fixed indexes as given, `auto` from the node's facts.

    `auto` is the RoCE v2 IPv4 entry on the port whose netdev is the node's fabric interface (the
    entry carrying the node's fabric IP when there are several), else on the first listed HCA.
    Nodes without RDMA, without facts, or where no such entry exists are left out; checks say why.
    """
    out: dict[str, int] = {}
    for node in inventory_nodes:
        if node.rdma is None:
            continue
        if node.rdma.gid_index != "auto":
            out[node.name] = int(node.rdma.gid_index)
            continue
        f = facts.get(node.name)
        if not isinstance(f, NodeFacts):
            continue
        iface = node.rdma.fabric_iface
        on_iface = [p for p in f.rdma if p.netdev == iface or any(g.netdev == iface for g in p.gids)]
        if on_iface:
            candidates = [g for p in on_iface for g in p.gids
                          if g.type == "RoCE v2" and g.ipv4 and g.netdev in (None, iface)]
        else:  # the interface is not seen on any port: fall back to the first HCA the inventory names
            candidates = [g for p in f.rdma if p.hca == node.rdma.hcas[0] for g in p.gids
                          if g.type == "RoCE v2" and g.ipv4]
        exact = [g for g in candidates if node.fabric_ip and g.ipv4 == node.fabric_ip]
        if exact or candidates:
            out[node.name] = (exact or candidates)[0].index
    return out
