"""`plan`: the playbook's steps for one lane, with every launch's node, rank, argv and env. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sparkfleet.engines.base import LaneContext, Launch, bind_gids
from sparkfleet.engines.registry import engine_for
from sparkfleet.findings import Finding, failed
from sparkfleet.patches.manifest import mounts_for
from sparkfleet.placement import Rank, place
from sparkfleet.rules import lint
from sparkfleet.schema.inventory import Inventory
from sparkfleet.schema.load import Loaded
from sparkfleet.schema.playbook import STEPS, Playbook


@dataclass
class Plan:
    profile: str
    playbook: str
    inventory: str
    ranks: list[Rank]
    launches: list[Launch]
    steps: list[dict]
    findings: list[Finding] = field(default_factory=list)
    overrides: dict = field(default_factory=dict)  # -o KEY=VALUE the profile was loaded with, {KEY: value}

    def bind_gids(self, gid_index: dict[str, int]) -> None:
        """Put the GID indexes facts resolved into the launches rendered with their slots (make_plan's
        `late_gids`): the plan a run made before facts becomes the one it launches, rendered once."""
        self.launches = bind_gids(self.launches, gid_index)
        self.steps = bind_gids(self.steps, gid_index)

    @property
    def refused(self) -> bool:
        return failed(self.findings)

    def as_dict(self) -> dict:
        doc = {
            "profile": self.profile,
            "playbook": self.playbook,
            "inventory": self.inventory,
            "ranks": [{"rank": r.rank, "node": r.node.name, "role": r.role} for r in self.ranks],
            "steps": self.steps,
            "findings": [f.as_dict() for f in self.findings],
        }
        if self.overrides:  # only when -o was given, so plans without them read as before
            doc["overrides"] = self.overrides
        return doc


def make_plan(loaded: Loaded, inventory: Inventory, playbook: Playbook, root: Path,
              run_id: str = "plan", gid_index: dict[str, int] | None = None, late_gids: bool = False) -> Plan:
    """Validate the lane, render every rank's launch, and lay them out along the playbook. With `late_gids`
    (a run, before its facts), an `auto` GID index not in `gid_index` is left as a slot for Plan.bind_gids."""
    p = loaded.profile
    ranks = place(loaded, inventory)
    findings = lint(loaded, inventory, ranks)
    patch_mounts, patch_findings = mounts_for(p.patches, root)
    findings += patch_findings
    ctx = LaneContext(p, inventory, ranks, root / "templates", run_id, dict(gid_index or {}), patch_mounts,
                      late_gids)
    launches = engine_for(p.engine).launches(ctx)
    nodes = [r.node.name for r in ranks]
    steps: list[dict] = []
    for step in playbook.steps:
        if step.step != "launch":
            entry = {"step": step.step, "nodes": nodes, "what": STEPS[step.step]}
            if step.args:
                entry["args"] = step.args
            steps.append(entry)
            continue
        want = {"workers": ("worker",), "head": ("head",), "all": ("worker", "head")}[step.role or "all"]
        chosen = [launch for launch in launches if launch.role in want]
        for launch in chosen:
            together = sum(1 for x in chosen if x.wave == launch.wave) > 1
            steps.append({"step": "launch", **launch.as_dict(), "parallel": together})
    return Plan(p.name, playbook.name, inventory.name, ranks, launches, steps, findings,
                {o.key: o.shown for o in loaded.overrides})
