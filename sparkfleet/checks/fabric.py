"""The fabric links of a lane's ranks: up, RDMA port ACTIVE, one MTU everywhere, the class's speed.

Each TP decode step is about eighty all-reduces over RoCE (INV-28): one link down, at a
smaller MTU or negotiated below its rate slows (or stops) every token. NVIDIA's multi-Spark playbooks
validate link speed (200G), MTU and an NCCL test before serving; these are the first two, from the
facts (the probe and `check --nccl` measure). An inventory interface the node does not have fails
here, naming the node and the interface.
"""

from __future__ import annotations

from sparkfleet.findings import Finding
from sparkfleet.fleet.gather import resolve_gid_indexes
from sparkfleet.fleet.nodefacts import NetLink, NodeFacts, RdmaPort
from sparkfleet.schema.inventory import Node

from .context import CheckContext, part_error, unread
from .drift import listing, odd_ones

CHECK = "fabric"


def port_of(node: Node, f: NodeFacts) -> RdmaPort | None:
    """The RDMA port whose netdev is the node's fabric interface."""
    assert node.rdma is not None
    iface = node.rdma.fabric_iface
    return next((p for p in f.rdma if p.netdev == iface or any(g.netdev == iface for g in p.gids)), None)


def gid_in_use(node: Node, f: NodeFacts) -> str:
    """'GID 3 ::ffff:192.168.192.11 RoCE v2': the entry the launch will use (auto resolved as the launch does)."""
    index = resolve_gid_indexes([node], {node.name: f}).get(node.name)
    if index is None:
        return "no GID entry resolved"
    port = port_of(node, f)
    for g in (port.gids if port else [g for p in f.rdma for g in p.gids]):
        if g.index == index:
            return f"GID {index} {g.ipv4 or g.gid} {g.type or '?'}"
    return f"GID {index} (not in the table)"


def describe(link: NetLink, port: RdmaPort | None) -> str:
    parts = [f"{link.name} {link.operstate or '?'}",
             f"carrier {link.carrier if link.carrier is not None else '?'}",
             f"{link.speed_mbps / 1000:g} Gb/s" if link.speed_mbps else "speed ?",
             f"MTU {link.mtu if link.mtu is not None else '?'}"]
    if port is not None:
        parts.append(f"{port.hca}/{port.port} {port.state or '?'} {port.link_layer or '?'}")
    errors = {k: v for k, v in {**link.counters, **(port.counters if port else {})}.items()
              if v and k != "carrier_changes"}
    if errors:
        parts.append("errors " + " ".join(f"{k}={v}" for k, v in sorted(errors.items())))
    return ", ".join(parts)


def check(ctx: CheckContext) -> list[Finding]:
    if len(ctx.plan.ranks) < 2:
        return []  # one rank: nothing crosses the fabric
    out: list[Finding] = []
    mtus: dict[str, int | None] = {}
    ifaces: dict[str, str] = {}
    per_node: dict[str, list[Finding]] = {}
    for r, f in ctx.ranks():
        node = r.node
        if node.rdma is None:
            continue
        mine = per_node.setdefault(node.name, [])
        iface = node.rdma.fabric_iface
        link = f.links.get(iface)
        error = part_error(f, "links") if link is None else None
        if error:
            mine.append(unread(CHECK, node.name, error, f"{iface} up, RDMA port ACTIVE"))
            continue
        if link is None:
            mine.append(Finding(CHECK, "warn", f"no link facts for {iface}: not judged",
                                "a helper from another sparkfleet version? run `sparkfleet facts --node "
                                f"{node.name}`", node=node.name, expected=f"{iface} up, RDMA port ACTIVE"))
            continue
        if not link.exists:
            mine.append(Finding(CHECK, "fail", f"the inventory's fabric interface {iface} does not exist on "
                                f"{node.name}", f"set nodes.{node.name}.rdma.fabric_iface to the node's "
                                "ConnectX interface (`ibdev2netdev` lists them)", node=node.name,
                                observed=f"no /sys/class/net/{iface}", expected=f"interface {iface}"))
            continue
        port = port_of(node, f)
        seen = describe(link, port) + "; " + gid_in_use(node, f)
        hw = ctx.hardware(node)
        expected = f"{iface} up with carrier, RDMA port ACTIVE" + (
            f", >= {hw.fabric_speed_gbps:g} Gb/s" if hw.fabric_speed_gbps else "")
        mtus[node.name], ifaces[node.name] = link.mtu, iface
        before = len(mine)
        if link.operstate != "up" or link.carrier == 0:
            mine.append(Finding(CHECK, "fail", f"fabric link {iface} is down", "bring the link up (cable, "
                                f"switch port, `ip link set {iface} up`) before launching", node=node.name,
                                observed=seen, expected=expected))
        rdma_error = part_error(f, "rdma", *(f"rdma {hca}" for hca in node.rdma.hcas)) if port is None else None
        if rdma_error:
            mine.append(unread(CHECK, node.name, rdma_error, expected))  # its port was not read, not unbound
        elif port is None:
            mine.append(Finding(CHECK, "fail", f"no RDMA port is bound to {iface}", "check the ConnectX driver "
                                "and `ibdev2netdev`; NCCL would fall back to sockets", node=node.name,
                                observed=seen, expected=expected))
        elif (port.state or "").upper() != "ACTIVE":
            mine.append(Finding(CHECK, "fail", f"RDMA port {port.hca}/{port.port} is {port.state or 'unknown'}, "
                                "not ACTIVE", "check the link and the subnet/RoCE configuration "
                                "(`ibstat`, `ibdev2netdev`)", node=node.name, observed=seen, expected=expected))
        if hw.fabric_speed_gbps and len(mine) == before:
            if link.speed_mbps is None:
                mine.append(Finding(CHECK, "warn", f"the link rate of {iface} is unknown: not judged",
                                    "check it with `ethtool` on the node", node=node.name, observed=seen,
                                    expected=expected))
            elif link.speed_mbps < hw.fabric_speed_gbps * 1000:
                mine.append(Finding(CHECK, "warn", f"{iface} runs at {link.speed_mbps / 1000:g} Gb/s, below the "
                                    f"class's {hw.fabric_speed_gbps:g} Gb/s", "check the cable/transceiver and "
                                    "the switch port; or set hardware_classes."
                                    f"{node.hardware}.fabric_speed_gbps in the inventory", node=node.name,
                                    observed=seen, expected=expected))
        if len(mine) == before:
            mine.append(Finding(CHECK, "ok", f"{iface} up, RDMA port ACTIVE", node=node.name, observed=seen,
                                expected=expected))
    known = {n: v for n, v in mtus.items() if v is not None}
    odd = odd_ones(known)
    for n in odd:
        per_node[n].append(Finding(CHECK, "fail", f"MTU {known[n]} on {ifaces[n]} differs from the lane's other "
                                   "ranks", "set one MTU on every rank's fabric "
                                   "interface (e.g. `ip link set IFACE mtu 9000`, and the switch ports)", node=n,
                                   observed=listing(mtus), expected="one MTU on every rank"))
    for r in ctx.plan.ranks:
        out += per_node.get(r.node.name, [])
    return out
