"""Preflight checks: pure functions from (plan, profile, inventory, gathered facts) to findings.

A check never opens a socket; it reads the facts gathered once per node (DESIGN rule 1). One module
per check: memory, earlyoom, clock (and slow state), rdma, fabric, storage, image, drift, mounts,
conflicts; the lane's own sizing (kv_sizing, graphs, long_context: profile only, reported on the head);
its chat template (chat_template). Every finding names its node and check, with what was observed, what
was expected and what to do.

The check modules are imported inside `run_checks`, not here: this package must stay importable
with the standard library alone, so `python3 -m sparkfleet.checks.probe` runs on a GPU machine that
has a copy of the repository but none of sparkfleet's dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sparkfleet.findings import Finding

if TYPE_CHECKING:
    from sparkfleet.fleet.nodefacts import NodeFacts
    from sparkfleet.fleet.transport import Result
    from sparkfleet.plan import Plan
    from sparkfleet.schema.inventory import Inventory
    from sparkfleet.schema.profile import Profile

# The modules, in the order their findings are listed for each node.
MODULES = ("memory", "earlyoom", "clock", "rdma", "fabric", "storage", "image", "drift", "mounts", "conflicts",
           "kv_sizing", "graphs", "long_context", "chat_template")
# Check names in display order (a module may emit more than one: clock also emits slow-state).
ORDER = ("reach", "facts", "drop-caches", "memory", "earlyoom", "clock", "slow-state", "rdma", "fabric",
         "fabric-probe", "storage", "image", "drift", "mounts", "conflicts", "kv-sizing", "graph-memory",
         "long-context", "chat-template")


def run_checks(plan: Plan, inventory: Inventory, facts: dict[str, NodeFacts | Result], *,
               profile: Profile | None = None, probes: dict[str, dict[str, Any]] | None = None,
               caches_dropped: dict[str, bool | str] | None = None) -> list[Finding]:
    """Every check over every rank's node, in a stable order: nodes in rank order, checks in ORDER.

    `facts` holds each node's NodeFacts or the failed transport Result (a 'reach' fail; the other nodes
    are still checked). `profile` is the lane the plan was made from: pass it, because a Plan carries
    only the lane's name; without it the lane is loaded by that name from the default ops directory
    ($SPARKFLEET_ROOT or this checkout). `probes` holds the clock probe's parsed output per node
    (`check --probe`); `caches_dropped` says per node whether the page cache was dropped before the
    facts were gathered (True) or why dropping failed (a message).
    """
    # inside the function: the clock probe's entry point (sparkfleet.checks.probe, run in the lane's image)
    # imports this package and must need nothing beyond the standard library
    from sparkfleet.fleet.nodefacts import NodeFacts

    from .context import CheckContext

    if profile is None:  # the same reason: the spec loader is not standard library
        from sparkfleet.opsdir import Spec
        from sparkfleet.root import find_root

        profile = Spec(find_root()).profile(plan.profile).profile
    caches_dropped = caches_dropped or {}
    found: list[Finding] = []
    answered: dict[str, NodeFacts] = {}
    for r in plan.ranks:
        name = r.node.name
        got = facts.get(name)
        if isinstance(got, NodeFacts):
            answered[name] = got
            if got.errors:
                found.append(Finding("facts", "warn", f"the node could not report everything ({len(got.errors)} "
                                     "part(s)); checks that need them say unknown", "see `sparkfleet facts "
                                     f"--node {name}`", node=name, observed="; ".join(got.errors)))
        elif got is None:
            found.append(Finding("reach", "fail", "no facts were gathered from this node",
                                 "gather again; `sparkfleet facts --node " + name + "` shows why", node=name,
                                 observed="no answer", expected="facts from the node"))
        else:
            found.append(Finding("reach", "fail", got.message or f"{got.error or 'failed'}: the node did not answer",
                                 _reach_remedy(got.error, name), node=name,
                                 observed=got.error or f"exit {got.exit_code}", expected="facts from the node"))
        why = caches_dropped.get(name)
        if isinstance(why, str):
            found.append(Finding("drop-caches", "warn", f"could not drop the page cache: {why}",
                                 "run as root on the node (inventory ssh.user), or drop it there yourself: "
                                 "`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`", node=name,
                                 observed=why, expected="page cache dropped"))
    ctx = CheckContext(plan, profile, inventory, answered, dict(probes or {}), caches_dropped)
    for module in MODULES:
        found += importlib.import_module(f"{__name__}.{module}").check(ctx)
    return ordered(plan, found)


def _reach_remedy(error: str | None, node: str) -> str:
    return {
        "hostkey-unknown": f"pin the node's host key: `sparkfleet trust {node}`",
        "hostkey-changed": f"the host key of {node} changed: verify it, then `sparkfleet trust {node}`",
        "auth": "check the inventory's ssh user and key for the node",
        "timeout": "the node answered too slowly: check its load and network",
    }.get(error or "", "check the node is up and reachable (inventory ssh host/port)")


def ordered(plan: Plan, findings: list[Finding]) -> list[Finding]:
    """Nodes in rank order (others last), then checks in ORDER; findings of one check keep their order."""
    rank = {r.node.name: i for i, r in enumerate(plan.ranks)}
    return sorted(findings, key=lambda f: (rank.get(f.node or "", len(rank)),
                                          ORDER.index(f.check) if f.check in ORDER else len(ORDER)))


__all__ = ["MODULES", "ORDER", "ordered", "run_checks"]
