"""What every check reads: the lane (plan + profile), the inventory, and the facts gathered once per node."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sparkfleet.engines.base import Launch
from sparkfleet.fleet.facts import NodeFacts
from sparkfleet.placement import Rank
from sparkfleet.plan import Plan
from sparkfleet.schema.inventory import HardwareClass, Inventory, Node
from sparkfleet.schema.profile import Profile

from .seeds import GB, GiB


@dataclass
class CheckContext:
    plan: Plan
    profile: Profile
    inventory: Inventory
    facts: dict[str, NodeFacts]  # only the nodes that answered; the others have a 'reach' finding
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)  # clock probe output per node
    caches_dropped: dict[str, bool | str] = field(default_factory=dict)  # True, or why dropping failed

    def ranks(self) -> Iterator[tuple[Rank, NodeFacts]]:
        """The lane's ranks in rank order, with their node's facts (unreachable nodes skipped)."""
        for r in self.plan.ranks:
            f = self.facts.get(r.node.name)
            if f is not None:
                yield r, f

    def hardware(self, node: Node) -> HardwareClass:
        return self.inventory.hardware(node)

    def launch(self, node: str) -> Launch | None:
        return next((x for x in self.plan.launches if x.node == node), None)

    @property
    def head(self) -> Node:
        return self.plan.ranks[0].node


def role_value(table: dict[str, float], rank: Rank) -> tuple[str, float] | None:
    """A per-role profile value (keys head / workers; 'worker' accepted), with the key it came from."""
    keys = ("head",) if rank.role == "head" else ("workers", "worker")
    for key in keys:
        if key in table:
            return key, table[key]
    return None


def gb(n: float | None) -> str:
    return "?" if n is None else f"{n / GB:.1f} GB"


def gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f} GiB"
