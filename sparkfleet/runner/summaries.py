"""Run records (state_dir()/runs/*.json) read back: one small summary per run, for the exporter (metrics/)
and watch (its restart budget and evidence).

A record is the typed model the runner writes (record.py RunRecord), written once, atomically,
when its run ends, so a summary is parsed once per file and kept while the file's size and mtime stay
the same; a poll only parses new records.
Records of other inventories are left out (one exporter, or one watch, reads one inventory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkfleet.runner.record import RecordError, RunRecord, read_record

STATUS_RANK = {"ok": 0, "warn": 1, "unknown": 2, "fail": 3}  # worst wins per (node, check)


@dataclass(frozen=True)
class RunSummary:
    """What the exporter and watch read from one run record."""

    run_id: str
    playbook: str
    profile: str
    inventory: str
    outcome: str
    started: float
    finished: float | None
    duration_s: float | None
    checks: dict[tuple[str, str], str] | None = None  # (node, check) -> worst status, when checks ran
    checks_at: float | None = None
    gates: dict[str, str] | None = None  # gate -> pass | fail | skip, when gates ran
    gates_at: float | None = None
    engram: dict[int, str] | None = None  # rank -> node-local | nfs (the engram step's verdict)
    rank_nodes: dict[int, str] = field(default_factory=dict)  # rank -> node, from the launches
    patches: dict[str, Any] | None = None  # {"set": name, "nodes": {node: ok}}
    fabric: list[dict[str, Any]] | None = None  # the fabric probe's links, each with "ok" from its verdict
    fabric_at: float | None = None
    startup: dict[str, float] | None = None  # point -> seconds from the head's start (the run's startup receipt)


def _step_ends(rec: RunRecord) -> dict[str, float]:
    """When each step ended: the run's start plus the durations of the steps up to it (steps run in order)."""
    t = rec.started
    out: dict[str, float] = {}
    for st in rec.steps:
        t += st.elapsed_s
        out[st.step] = t
    return out


def summarise(doc: dict[str, Any]) -> RunSummary:
    """The parts of a record the exporter uses (the typed model the runner writes; RecordError if it is not one)."""
    rec = read_record(doc)
    data = rec.data
    ends = _step_ends(rec)
    checks = None
    if data.findings is not None:
        checks = {}
        for f in data.findings:
            key = (f.node or "", f.check)
            if STATUS_RANK.get(f.status, 0) >= STATUS_RANK.get(checks.get(key, "ok"), 0):
                checks[key] = f.status
    gates = {r.name: r.status for r in data.gates.results} if data.gates is not None else None
    rank_nodes = {x.rank: x.node for x in data.launches or []}
    patches = None
    if data.patches is not None:
        patches = {"set": data.patches.set, "nodes": {n: v.ok for n, v in data.patches.nodes.items()}}
    fabric = fabric_links(getattr(data, "fabric_probe", None))
    startup = None
    if data.startup is not None:
        got = {"port_open": data.startup.port_open_s, "health": data.startup.health_s, "ready": data.startup.ready_s,
               "first_token": data.startup.first_token_s}
        startup = {point: s for point, s in got.items() if s is not None}
    return RunSummary(
        run_id=rec.run_id, playbook=rec.playbook, profile=rec.profile, inventory=rec.inventory,
        outcome=rec.outcome, started=rec.started, finished=rec.finished, duration_s=rec.duration_s,
        checks=checks, checks_at=ends.get("check") if checks is not None else None,
        gates=gates, gates_at=ends.get("gates") if gates is not None else None,
        engram=dict(data.engram) if data.engram is not None else None, rank_nodes=rank_nodes, patches=patches,
        fabric=fabric, fabric_at=ends.get("fabric_probe") if fabric is not None else None, startup=startup)



def fabric_links(probe: Any) -> list[dict[str, Any]] | None:
    """The fabric probe's links from a record, each marked ok unless a failed finding names it."""
    if not isinstance(probe, dict) or not isinstance(probe.get("links"), list):
        return None
    failed = [str(f.get("message", "")) for f in probe.get("findings") or [] if f.get("status") == "fail"]
    out = []
    for x in probe["links"]:
        name = str(x["name"])
        out.append({"name": name, "a": str(x["a"]), "b": str(x["b"]), "a_to_b_bps": x.get("a_to_b_bps"),
                    "b_to_a_bps": x.get("b_to_a_bps"), "rtt_s": dict(x.get("rtt_s") or {}),
                    "ok": not any(m.startswith(name + ":") for m in failed)})
    return out


class RunIndex:
    """The run records of one inventory, re-read only where a file is new or changed."""

    def __init__(self, runs_dir: Path, inventory: str) -> None:
        self.runs_dir = runs_dir
        self.inventory = inventory
        self._cache: dict[Path, tuple[tuple[int, int], RunSummary | None]] = {}
        self.unreadable: list[str] = []  # files that are not run records (named, not fatal)

    def refresh(self) -> list[RunSummary]:
        """Every run of this inventory, oldest first."""
        seen: dict[Path, tuple[tuple[int, int], RunSummary | None]] = {}
        bad: list[str] = []
        try:
            paths = sorted(self.runs_dir.glob("*.json"))
        except OSError:
            paths = []
        for path in paths:
            try:
                st = path.stat()
            except OSError:
                continue  # removed while listing
            key = (st.st_mtime_ns, st.st_size)
            cached = self._cache.get(path)
            if cached is not None and cached[0] == key:
                seen[path] = cached
            else:
                try:
                    summary: RunSummary | None = summarise(json.loads(path.read_text()))
                except (OSError, ValueError, RecordError):
                    summary = None
                seen[path] = (key, summary)
            if seen[path][1] is None:
                bad.append(path.name)
        self._cache = seen
        self.unreadable = bad
        runs = [s for _, s in seen.values() if s is not None and s.inventory == self.inventory]
        return sorted(runs, key=lambda s: (s.started, s.run_id))
