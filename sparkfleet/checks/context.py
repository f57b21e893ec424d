"""What every check reads: the lane (plan + profile), the inventory, and the facts gathered once per node."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sparkfleet.engines.base import Launch
from sparkfleet.findings import Finding
from sparkfleet.fleet.nodefacts import NodeFacts
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


def part_error(f: NodeFacts, *parts: str) -> str | None:
    """Why the node could not read one of these facts parts, or None when it read them all.

    The helper (fleet/nodeside/facts.py) reports a part it could not read as an empty default plus an error
    line "PART: why" in `errors` ("listening: cannot read /proc/net/tcp", "mounts: Permission denied",
    "path /x: helper failed: ..."); a part here is that line's name before the first ": ".
    """
    lines = [e for e in f.errors if e.split(": ", 1)[0] in parts]
    return "; ".join(lines) or None


def unread(check: str, node: str, error: str, expected: str | None = None) -> Finding:
    """The one finding a check gives when a part it reads could not be read: unknown, never ok or a guess.

    `up` stops on it as on a failure unless the operator passes --accept-unknown (runner/steps/preflight.py)."""
    return Finding(check, "unknown", f"could not judge, because {error}",
                   f"make it readable on {node} (`sparkfleet facts --node {node}` shows the facts' errors) and "
                   "check again; `up --accept-unknown` goes on without it", node=node, observed=error,
                   expected=expected, unread=error.split(": ", 1)[0])  # the part (part_error's line names it)


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
