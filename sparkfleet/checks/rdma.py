"""RoCE GID index: the configured one must be the node's RoCE v2 IPv4 entry on the fabric HCA (INV-23).

"GID index = this node's RoCE-v2 IPv4 entry (not always 3)": a fixed index that points elsewhere
makes b12x/TensorFold talk over the wrong GID, and so does a fixed index in a launch variable that
carries one (the engine adapter's `gid_env`): both fail before anything starts. `auto` is resolved
exactly as the launch resolves it (`fleet.gather.resolve_gid_indexes`), so the check and the launch can
never disagree.
"""

from __future__ import annotations

from sparkfleet.engines.registry import engine_for
from sparkfleet.findings import Finding
from sparkfleet.fleet.gather import resolve_gid_indexes
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.schema.inventory import Node

from .context import CheckContext, part_error, unread

CHECK = "rdma"


def right_index(node: Node, facts: NodeFacts) -> int | None:
    """The node's RoCE v2 IPv4 GID index on its fabric interface, whatever the inventory configures."""
    assert node.rdma is not None
    auto = node.model_copy(update={"rdma": node.rdma.model_copy(update={"gid_index": "auto"})})
    return resolve_gid_indexes([auto], {node.name: facts}).get(node.name)


def describe(node: Node, facts: NodeFacts, index: int) -> str:
    """'index 1: RoCE v2 192.168.192.12 on enp1s0f0np0 (rocep1s0f0 port 1)' for the fabric port's entry."""
    assert node.rdma is not None
    iface = node.rdma.fabric_iface
    ports = sorted(facts.rdma, key=lambda p: p.netdev != iface)  # the fabric interface's port first
    for p in ports:
        for g in p.gids:
            if g.index == index and (g.netdev in (None, iface) or p.netdev != iface):
                return (f"index {index}: {g.type or '?'} {g.ipv4 or g.gid} on {g.netdev or p.netdev or '?'} "
                        f"({p.hca} port {p.port})")
    return f"index {index}"


def check(ctx: CheckContext) -> list[Finding]:
    out: list[Finding] = []
    if len(ctx.plan.ranks) < 2:
        return out  # one rank: nothing crosses the fabric
    for r, f in ctx.ranks():
        node = r.node
        if node.rdma is None:
            continue
        iface, hcas = node.rdma.fabric_iface, ",".join(node.rdma.hcas)
        configured = node.rdma.gid_index
        expected = f"the RoCE v2 IPv4 GID entry on {iface} ({hcas})"
        # an HCA whose ports were not read: its GID entry is unknown, not missing
        error = part_error(f, "rdma", *(f"rdma {hca}" for hca in node.rdma.hcas))
        if error and (not f.rdma or right_index(node, f) is None):
            out.append(unread(CHECK, node.name, error, expected))
            continue
        if not f.rdma:
            out.append(Finding(CHECK, "fail", "no RDMA port reported: the lane's ranks cannot reach each other",
                               "check the ConnectX driver and `ibdev2netdev` on the node", node=node.name,
                               observed=part_error(f, "ibdev2netdev") or "no ports", expected=expected))
            continue
        right = right_index(node, f)
        if right is None:
            seen = "; ".join(f"{p.hca}/{p.port} {p.netdev or '?'}: "
                             + (", ".join(f"{g.index} {g.type or '?'} {g.ipv4 or g.gid}" for g in p.gids) or "no GIDs")
                             for p in f.rdma)
            out.append(Finding(CHECK, "fail", f"no RoCE v2 IPv4 GID entry on {iface}",
                               f"give {iface} its fabric address ({node.fabric_ip or 'fabric_ip'}) and check the "
                               "port is up (`ibdev2netdev`, `show_gids`) (INV-23)", node=node.name,
                               observed=seen, expected=expected))
            continue
        entry = describe(node, f, right)
        if configured == "auto":
            out.append(Finding(CHECK, "ok", f"gid_index auto resolves to {right}", node=node.name,
                               observed=entry, expected=expected))
        elif int(configured) == right:
            out.append(Finding(CHECK, "ok", f"gid_index {configured} is the RoCE v2 IPv4 entry", node=node.name,
                               observed=entry, expected=expected))
        else:
            out.append(Finding(CHECK, "fail", f"gid_index {configured} is not this node's RoCE v2 IPv4 entry; "
                               f"the right index is {right}",
                               f"set nodes.{node.name}.rdma.gid_index: {right} (or auto) in the inventory "
                               "(INV-23: not always 3)", node=node.name,
                               observed=f"configured {configured}; {entry}", expected=expected))
        out.extend(launch_gids(ctx, r.rank, node, right, entry))
    return out


def launch_gids(ctx: CheckContext, rank: int, node: Node, right: int, entry: str) -> list[Finding]:
    """A fixed index in a GID variable of the rank's launch (the engine adapter names them: NCCL_IB_GID_INDEX,
    TensorFold's GID_INDEX...) that is not the node's RoCE v2 entry fails: NCCL hangs or talks over the wrong
    address (INV-23: not always 3). `auto` (or a value sparkfleet resolves later) is not judged here."""
    assert node.rdma is not None
    launch = ctx.launch(node.name)
    if launch is None:
        return []
    hcas = ",".join(node.rdma.hcas)
    out = []
    for var in engine_for(ctx.profile.engine).gid_env:
        given = str(launch.env.get(var, "")).strip()
        if not given.isdigit() or int(given) == right:
            continue
        out.append(Finding(CHECK, "fail", f"rank {rank}: {var}={given} on HCA {hcas} is not this node's RoCE v2 "
                           f"IPv4 entry for {node.fabric_ip or node.rdma.fabric_iface}; the right index is {right}",
                           f"set {var} to {right} for {node.name}, or leave it to sparkfleet (the index differs "
                           "per node: INV-23, not always 3); nothing was started", node=node.name,
                           observed=f"{var}={given}; {entry}", expected=f"{var}={right}"))
    return out
