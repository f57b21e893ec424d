"""`ibdev2netdev`: the node's RDMA ports and their netdevs.

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.
"""

from __future__ import annotations

from pathlib import Path

from .state import load


def ibdev2netdev(argv: list[str], root: Path) -> int:
    node = load(root, "node.json")
    for port in node["rdma"]:
        up = "Up" if "ACTIVE" in port["state"] else "Down"
        print(f"{port['hca']} port {port['port']} ==> {port['netdev']} ({up})")
    return 0
