"""The simulated lab's networks (root only, ssh mode): one network namespace per node, wired like the lab.

- management: a bridge `sfsim0` on this machine (10.78.0.1/24); each node's `mgmt0` holds 10.78.0.(11+i)
  and its sshd listens there on port 22, as a node's management address would;
- fabric: a bridge `sfsimfab` inside a namespace of its own (`sfsim-fabric`, so this machine's own
  network never carries it); each node's fabric interface, named as the inventory's rdma.fabric_iface,
  holds the node's fabric IP (/24) with the lab's jumbo MTU, so a process on one node reaches another
  node's fabric IP. Faults change these links for real (tc tbf for slow-link, the MTU for mtu-mismatch).
  A node with a fabric IP and no RDMA (the Station: a TCP port on the fabric) gets the same link, its
  interface named values.PLAIN_FABRIC_IFACE (its inventory names none).

Names are fixed (one simulated lab per machine); `remove` deletes exactly these names, and only those its own
state dir's lab made (a `sim down` under another state dir leaves a running lab's network alone).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path

from sparkfleet.schema.errors import UserError
from sparkfleet.schema.inventory import Inventory, Node
from sparkfleet.sim import paths, values

PREFIX = "sfsim"
MGMT_BRIDGE = "sfsim0"
MGMT_NET = ipaddress.IPv4Network("10.78.0.0/24")
FABRIC_NS = "sfsim-fabric"
FABRIC_BRIDGE = "sfsimfab"
FABRIC_MTU = 9000  # the lab's RoCE links run jumbo frames (the MTU the mtu-mismatch fault departs from)
# The first `ip netns add` on a machine makes /run/netns a mount (a bind onto itself, made shared: iproute2's
# ip/ipnetns.c netns_add, "Upgrade NETNS_RUN_DIR to a mount point") and leaves it there. The lab takes that
# mount back when it made it.
NETNS_RUN = Path("/run/netns")


def _made_file() -> Path:
    """Written in the lab's dir before its first link: what `remove` may take away is this lab's. The names
    are fixed, so without it a `sim down` under another state dir would cut a running lab's network."""
    return paths.sim_dir() / "networks.json"


def _mounted(path: Path) -> bool:
    """Whether `path` is a mount point (a bind onto itself has the parent's st_dev, so os.path.ismount misses
    it: read the mount table)."""
    table = Path("/proc/self/mountinfo").read_text().splitlines()
    return any(len(f := line.split()) > 4 and f[4] == str(path) for line in table)


def netns_name(node: str) -> str:
    return f"{PREFIX}-{node}"


def mgmt_ip(index: int) -> str:
    return str(MGMT_NET.network_address + 11 + index)


def fabric_iface(node: Node) -> str | None:
    """The node's fabric interface in the lab: the inventory's rdma.fabric_iface, or for a node with a fabric
    IP and no RDMA the sim's name for it; None when the node has no fabric IP."""
    if not node.fabric_ip:
        return None
    return node.rdma.fabric_iface if node.rdma else values.PLAIN_FABRIC_IFACE


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise UserError(f"sim network: `ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def ours() -> list[str]:
    """The lab's namespaces that exist now."""
    out = _ip("netns", "list", check=False).stdout.splitlines()
    return [line.split()[0] for line in out if line.split() and line.split()[0].startswith(PREFIX + "-")]


def check_free() -> None:
    """Refuse to build over a management subnet somebody else routes."""
    routes = _ip("-4", "route", "show", check=False).stdout
    if str(MGMT_NET) in routes and MGMT_BRIDGE not in routes:
        raise UserError(f"sim network: {MGMT_NET} is already routed on this machine; nothing was created")


def create(inv: Inventory, names: list[str]) -> None:
    """Namespaces, bridges and veth pairs for every node (see the module docstring)."""
    _made_file().write_text(json.dumps({"netns_run_mount": not _mounted(NETNS_RUN)}) + "\n")
    _ip("link", "add", MGMT_BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{MGMT_NET.network_address + 1}/{MGMT_NET.prefixlen}", "dev", MGMT_BRIDGE)
    _ip("link", "set", MGMT_BRIDGE, "up")
    _ip("netns", "add", FABRIC_NS)
    _ip("-n", FABRIC_NS, "link", "add", FABRIC_BRIDGE, "type", "bridge")
    _ip("-n", FABRIC_NS, "link", "set", FABRIC_BRIDGE, "mtu", str(FABRIC_MTU))
    _ip("-n", FABRIC_NS, "link", "set", FABRIC_BRIDGE, "up")
    for i, name in enumerate(names):
        ns = netns_name(name)
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        host_end = f"{PREFIX}m{i}"
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "mgmt0", "netns", ns)
        _ip("link", "set", host_end, "master", MGMT_BRIDGE, "up")
        _ip("-n", ns, "addr", "add", f"{mgmt_ip(i)}/{MGMT_NET.prefixlen}", "dev", "mgmt0")
        _ip("-n", ns, "link", "set", "mgmt0", "up")
        n = inv.nodes[name]
        iface = fabric_iface(n)
        if iface is None:
            continue
        fab_end = f"{PREFIX}f{i}"
        _ip("-n", FABRIC_NS, "link", "add", fab_end, "type", "veth", "peer", "name", iface, "netns", ns)
        _ip("-n", FABRIC_NS, "link", "set", fab_end, "mtu", str(FABRIC_MTU), "master", FABRIC_BRIDGE, "up")
        _ip("-n", ns, "link", "set", iface, "mtu", str(FABRIC_MTU))
        _ip("-n", ns, "addr", "add", f"{n.fabric_ip}/24", "dev", iface)
        _ip("-n", ns, "link", "set", iface, "up")


def remove() -> bool:
    """Delete the lab's namespaces (their veths go with them) and the management bridge, when this state dir's
    lab made them. True if any existed."""
    made = _made_file()
    if not made.exists():
        return False
    for ns in ours():
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:  # processes left in a namespace (the node's init ended them already)
            subprocess.run(["kill", "-9", pid], capture_output=True)
        _ip("netns", "del", ns, check=False)
    if _ip("link", "show", MGMT_BRIDGE, check=False).returncode == 0:
        _ip("link", "del", MGMT_BRIDGE, check=False)
    # iproute2's mount of /run/netns, ours to take back once no namespace (anybody's) is pinned under it
    if json.loads(made.read_text()).get("netns_run_mount") and _mounted(NETNS_RUN) and not any(NETNS_RUN.iterdir()):
        subprocess.run(["umount", str(NETNS_RUN)], capture_output=True)
    made.unlink()
    return True


def exec_argv(node: str) -> list[str]:
    """Run a command in the node's namespace from this machine (tc, ip for faults)."""
    return ["ip", "netns", "exec", netns_name(node)]


def rx_bytes(node: str) -> dict[str, int]:
    """Bytes each of the node's interfaces has received, from the kernel's counters in its namespace."""
    return _counters(node, "rx")


def tx_bytes(node: str) -> dict[str, int]:
    """Bytes each of the node's interfaces has sent, from the kernel's counters in its namespace."""
    return _counters(node, "tx")


def _counters(node: str, way: str) -> dict[str, int]:
    links = json.loads(_ip("-n", netns_name(node), "-s", "-j", "link", "show").stdout)
    return {link["ifname"]: int(link["stats64"][way]["bytes"]) for link in links}


def fabric_peer(node: str, iface: str) -> str:
    """The fabric bridge's end (in FABRIC_NS) of the node's fabric veth: its egress is what the node receives."""
    (me,) = json.loads(_ip("-n", netns_name(node), "-j", "link", "show", "dev", iface).stdout)
    links = json.loads(_ip("-n", FABRIC_NS, "-j", "link", "show").stdout)
    return next(link["ifname"] for link in links if link["ifindex"] == me["link_index"])
