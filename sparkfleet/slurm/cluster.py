"""What the Slurm cluster says about itself (`scontrol -o show partition|node`), parsed, and the refusals
made from it before anything is submitted: no partition, an account the partition does not allow, a lane
node Slurm does not know (or that is not in the partition). Parsers and checks are pure; the commands are
controller-side operations of the one executor (slurm/ops.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sparkfleet.findings import Finding
from sparkfleet.schema.inventory import Inventory

_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_:/.]*=")


def fields(line: str) -> dict[str, str]:
    """One `scontrol -o` record: `Key=value` tokens; a token that is not `Key=...` continues the value before
    it (values such as OS= and Reason= hold spaces)."""
    out: dict[str, str] = {}
    last = None
    for token in line.split(" "):
        if _KEY.match(token):
            last, _, value = token.partition("=")
            out[last] = value
        elif last is not None and token:
            out[last] += " " + token
    return out


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    state: str
    allow_accounts: list[str] | None  # None: ALL
    deny_accounts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str
    partitions: list[str]


def _names(value: str | None) -> list[str]:
    return [v for v in (value or "").split(",") if v and v != "(null)"]


def parse_partitions(text: str) -> dict[str, Partition]:
    """`scontrol -o show partition`, by name."""
    out = {}
    for line in text.splitlines():
        f = fields(line.strip())
        if "PartitionName" not in f:
            continue
        allow = f.get("AllowAccounts", "ALL")
        out[f["PartitionName"]] = Partition(f["PartitionName"], f.get("Default") == "YES", f.get("State", ""),
                                            None if allow == "ALL" else _names(allow), _names(f.get("DenyAccounts")))
    return out


def parse_nodes(text: str) -> dict[str, SlurmNode]:
    """`scontrol -o show node`, by name."""
    out = {}
    for line in text.splitlines():
        f = fields(line.strip())
        if "NodeName" in f:
            out[f["NodeName"]] = SlurmNode(f["NodeName"], f.get("State", ""), _names(f.get("Partitions")))
    return out


def refusals(inv: Inventory, lane_nodes: list[str], partitions: dict[str, Partition],
             nodes: dict[str, SlurmNode]) -> list[Finding]:
    """Why this lane must not be submitted (empty: it may)."""
    s = inv.slurm
    assert s is not None
    out: list[Finding] = []
    known = ", ".join(sorted(partitions)) or "none"
    if s.partition is None:
        default = next((p for p in partitions.values() if p.default), None)
        if default is None:
            return [Finding("slurm-partition", "fail", f"no partition: slurm.partition is not set and the cluster "
                            f"has no default partition (partitions: {known})", "set slurm.partition in the inventory",
                            field="slurm.partition")]
        part = default
    elif s.partition not in partitions:
        return [Finding("slurm-partition", "fail", f"partition {s.partition!r} is not a partition of this cluster "
                        f"(partitions: {known})", "set slurm.partition to one of them", field="slurm.partition")]
    else:
        part = partitions[s.partition]
    if s.account is not None:
        denied = s.account in part.deny_accounts
        if denied or (part.allow_accounts is not None and s.account not in part.allow_accounts):
            allowed = "denies it" if denied else f"allows {', '.join(part.allow_accounts or []) or 'none'}"
            out.append(Finding("slurm-account", "fail", f"account {s.account!r} may not use partition "
                               f"{part.name!r} (it {allowed})", "set slurm.account to an account the partition "
                               "allows", field="slurm.account"))
    for name in lane_nodes:
        if name not in nodes:
            out.append(Finding("slurm-node", "fail", f"node {name} is not a node of this Slurm cluster "
                               f"(scontrol knows: {', '.join(sorted(nodes)) or 'none'})",
                               "the inventory's node names must be Slurm's NodeNames", node=name))
        elif part.name not in nodes[name].partitions:
            out.append(Finding("slurm-node", "fail", f"node {name} is not in partition {part.name!r} "
                               f"(it is in: {', '.join(nodes[name].partitions) or 'none'})",
                               "choose a partition that holds every node of the lane", node=name))
    return out
