"""Which node runs which rank: the profile's rank order over its inventory group."""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.spec.errors import SpecError
from sparkfleet.spec.inventory import Inventory, Node
from sparkfleet.spec.load import Loaded
from sparkfleet.spec.yamlsrc import locate


@dataclass(frozen=True)
class Rank:
    rank: int
    node: Node

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


def place(loaded: Loaded, inventory: Inventory) -> list[Rank]:
    """Ranks in rank order; refuses a group that is missing, empty or too small for the lane."""
    p = loaded.profile
    file, line = locate(loaded.marks, ("group",))
    if p.group not in inventory.groups:
        raise SpecError(f"group {p.group!r} is not in inventory {inventory.name!r} "
                        f"(groups: {', '.join(inventory.groups)})", file, line, "group")
    members = inventory.groups[p.group]
    if p.ranks is not None:
        file, line = locate(loaded.marks, ("ranks",))
        for name in p.ranks:
            if name not in members:
                raise SpecError(f"node {name!r} is not in group {p.group!r} ({', '.join(members)})",
                                file, line, "ranks")
        if len(set(p.ranks)) != len(p.ranks):
            raise SpecError("a node appears twice in the rank order", file, line, "ranks")
        order = p.ranks
    else:
        order = members
    if len(order) < p.world_size:
        # blame the tp (its file:line, or the -o that set it); the group or ranks: line is said in the message
        tfile, tline = locate(loaded.marks, ("tp",))
        what = "ranks lists" if p.ranks is not None else f"group {p.group!r} has"
        raise SpecError(f"the lane needs {p.world_size} ranks (tp: {p.tp}) but {what} {len(order)} node(s) "
                        f"({file}:{line})", tfile, tline, "tp")
    if p.ranks is not None and len(order) > p.world_size:
        raise SpecError(f"ranks lists {len(order)} nodes for {p.world_size} ranks (tp: {p.tp})",
                        file, line, "ranks")
    return [Rank(i, inventory.nodes[name]) for i, name in enumerate(order[: p.world_size])]


def loopback_bound(host: str | None) -> bool:
    """Whether a lane's API binds to the head's loopback only (reachable from here only through SSH)."""
    return host in ("127.0.0.1", "localhost", "::1")


def endpoint(head: Node, port: int | None) -> str:
    """The lane's OpenAI-compatible base URL as seen from this machine: the head's SSH address (this
    machine itself for a local-transport node) and the lane's port."""
    host = "127.0.0.1" if head.transport == "local" else head.ssh.host
    return f"http://{host}:{port}"
