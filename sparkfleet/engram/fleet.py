"""Fleet mode: each rank's copy on its own node, in parallel, through the node-side helper; then the checks.

The copy runs as `engram_copy.py` (shipped by sparkfleet.fleet.ship with a sha256 check), one run
per node, the request as JSON on stdin. While the copies run, the controller polls each node's
status file (written by the helper about twice a second) for its progress line. Afterwards the
helper's cheap `status` op returns each manifest, and `judge_rank` (the one Engram rule) says which ranks will read
node-local rows and which fall back to NFS.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkfleet.engines.base import LaneContext
from sparkfleet.engines.registry import engine_for
from sparkfleet.engram import ranges
from sparkfleet.engram.manifest import judge_lane, judge_rank
from sparkfleet.engram.ranges import Harvest, Ranges
from sparkfleet.findings import Finding
from sparkfleet.fleet.nodeside.engram_copy import STATUS
from sparkfleet.fleet.op import OpGen, run_commands, run_ops, while_running
from sparkfleet.fleet.ops import ReadFile, on
from sparkfleet.fleet.ship import helper_ops, run_helper
from sparkfleet.fleet.transport import Result, Transport
from sparkfleet.naming import engram_manifest_path
from sparkfleet.placement import Rank
from sparkfleet.schema.errors import UserError
from sparkfleet.schema.inventory import Node
from sparkfleet.schema.profile import Profile

HELPER = "engram_copy.py"
COPY_TIMEOUT_S = 4 * 3600.0  # 47 GiB at the seeds' 150 MB/s is ~6 min; a slow NFS day is not a hang
POLL_S = 2.0

# Prints the status file, or nothing when there is none.
@dataclass
class Job:
    """One rank's copy on its node."""

    rank: int
    node: Node
    source: str
    dest: str
    request: dict
    ranges: Ranges = field(default_factory=dict)


def source_dir(profile: Profile, node: Node) -> str:
    """The checkpoint snapshot dir on this node: <model_root>/<repo_dir>/snapshots/<snapshot or revision>."""
    model = profile.model
    if model is None:
        raise UserError(f"profile {profile.name!r} has no model")
    base = posixpath.join(node.storage.model_root, model.repo_dir)
    snap = model.snapshot or model.revision
    return posixpath.join(base, "snapshots", snap) if snap else base


def copy_dir(profile: Profile, node: Node) -> str | None:
    """Where this node keeps the lane's copy: <engram_local_dir>/<revision or repo_dir> (engines/docker.py
    mounts the same directory; copies are per checkpoint, ENG-26)."""
    root = node.storage.engram_local_dir
    name = profile.engram_copy_name()
    if root is None or name is None:
        return None
    return posixpath.join(root, name)


def plan_jobs(profile: Profile, ranks: list[Rank], *, harvest: Harvest | None, pattern: str | None,
              whole_shards: bool, verify: bool = True, node: str | None = None, source: str | None = None,
              dest: str | None = None, force: bool = False) -> tuple[list[Job], list[Finding]]:
    """One Job per rank that gets a copy; findings for the ranks that read NFS by design or cannot copy."""
    e = profile.engram
    if e is None or e.mode != "disk":
        raise UserError(f"lane {profile.name!r} does not read Engram rows from disk (engram.mode: "
                        f"{e.mode if e else 'unset'}): there is nothing to copy")
    if node is not None and node not in {r.node.name for r in ranks}:
        raise UserError(f"node {node!r} runs no rank of {profile.name} "
                        f"(ranks: {', '.join(f'{r.rank} {r.node.name}' for r in ranks)})")
    if whole_shards and not e.shards:
        raise UserError(f"lane {profile.name!r} lists no engram.shards to copy whole")
    if not whole_shards and not pattern:
        raise UserError(f"lane {profile.name!r} has no engram.tensor_pattern: name the Engram tensors with "
                        "--tensors PATTERN (a glob with {layer}, e.g. 'model.layers.{layer}.engram.*')")
    why_source = engine_for(profile.engine).engram_source_needed
    if why_source and source is None:
        raise UserError(f"{why_source}: give that checkpoint's directory with --source DIR")
    jobs: list[Job] = []
    findings: list[Finding] = []
    for r in ranks:
        if node is not None and r.node.name != node:
            continue
        if r.rank in e.nfs_ranks:
            findings.append(Finding("engram-copy", "warn", f"rank {r.rank} ({r.node.name}) reads Engram rows over "
                                    "NFS by the profile (engram.nfs_ranks): no copy made",
                                    "drop it from engram.nfs_ranks to give it a copy", node=r.node.name))
            continue
        target = dest or copy_dir(profile, r.node)
        if target is None:
            findings.append(Finding("engram-copy", "fail", f"rank {r.rank} ({r.node.name}) has no "
                                    "storage.engram_local_dir in the inventory: it reads over NFS",
                                    "set storage.engram_local_dir for the node", node=r.node.name))
            continue
        ranges: Ranges = {}
        if not whole_shards:
            assert harvest is not None
            if r.rank not in harvest.ranks:
                findings.append(Finding("engram-copy", "fail", f"rank {r.rank} ({r.node.name}) has no harvested "
                                        "ranges: it reads over NFS", "harvest again after a boot without local rows",
                                        node=r.node.name))
                continue
            ranges = harvest.ranks[r.rank]
            missing = sorted(set(e.layers) - set(ranges))
            if missing:
                findings.append(Finding("engram-copy", "warn", f"rank {r.rank} ({r.node.name}): no harvested range "
                                        f"for layer(s) {', '.join(map(str, missing))} of engram.layers",
                                        "harvest again", node=r.node.name))
        src = source or source_dir(profile, r.node)
        request = {"op": "copy", "source": src, "dest": target,
                   "ranges": {str(k): list(v) for k, v in ranges.items()}, "tensors": pattern,
                   "shards": list(e.shards), "whole_shards": whole_shards, "layers": list(e.layers),
                   "revision": profile.model.revision if profile.model and source is None else None,
                   "tp": profile.tp, "rank": r.rank, "verify": verify, "force": force}
        jobs.append(Job(r.rank, r.node, src, target, request, ranges))
    return jobs, findings


def _last_event(r: Result) -> dict | None:
    for line in reversed(r.stdout.strip().splitlines()):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and "event" in e:
            return e
    return None


def copy_requests(jobs: list[Job]) -> dict[str, str]:
    """What each node's copier reads on stdin."""
    return {j.node.name: json.dumps(j.request) for j in jobs}


def copy_ops(jobs: list[Job]) -> OpGen[dict[str, Result]]:
    """The copies as node operations (what --dry-run shows)."""
    return helper_ops(HELPER, [j.node for j in jobs], copy_requests(jobs), COPY_TIMEOUT_S, changes=True)


def run_copies(transport: Transport, jobs: list[Job], *, on_progress: Callable[[Job, dict], None] | None = None,
               timeout_s: float = COPY_TIMEOUT_S, poll_s: float = POLL_S) -> dict[int, tuple[Result, dict | None]]:
    """Run every job's copy at once, its progress read every `poll_s` while it runs (the executor runs both:
    the copies in the background); returns rank -> (the node's Result, its final JSON event)."""
    by_node: dict[str, Job] = {}
    for j in jobs:
        if j.node.name in by_node:
            raise UserError(f"two ranks on node {j.node.name}: one copy per node and lane")
        by_node[j.node.name] = j
    seen: dict[str, str] = {}
    nodes = [j.node for j in jobs]
    results = run_ops(transport, nodes, while_running(
        helper_ops(HELPER, nodes, copy_requests(jobs), timeout_s, changes=True), poll_s,
        (lambda: _progress(jobs, on_progress, seen)) if on_progress is not None else None))
    out: dict[int, tuple[Result, dict | None]] = {}
    for j in jobs:
        r = results[j.node.name]
        event = _last_event(r)
        if on_progress is not None and event is not None:
            on_progress(j, event)
        out[j.rank] = (r, event)
    return out


def _progress(jobs: list[Job], on_progress: Callable[[Job, dict], None], seen: dict[str, str]) -> OpGen[None]:
    """One status read on every copying node at once (each node its own copy's file); a node that does not
    answer now simply shows no new progress."""
    # a copy that has not written its status file yet: cat fails, no progress
    reads = {j.node.name: ReadFile(posixpath.join(j.dest, STATUS)) for j in jobs}
    try:
        answers = yield on("read the copies' progress", reads, 10.0)
    except Exception:  # noqa: BLE001 - progress is best effort; the copy's own result decides
        return
    for j in jobs:
        r = (answers or {}).get(j.node.name)
        if r is None or not r.ok or not r.stdout.strip() or seen.get(j.node.name) == r.stdout:
            continue
        seen[j.node.name] = r.stdout
        try:
            event = json.loads(r.stdout)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") in ("plan", "progress"):
            on_progress(j, event)


def statuses(transport: Transport, jobs: list[Job]) -> dict[int, tuple[Result, dict | None]]:
    """Each job's manifest (without chunk hashes) and whether its source headers still match."""
    results = run_helper(transport, [j.node for j in jobs], HELPER,
                         {j.node.name: json.dumps({"op": "status", "dest": j.dest, "source": j.source})
                          for j in jobs}, timeout_s=60.0)
    return {j.rank: (results[j.node.name], _last_event(results[j.node.name])) for j in jobs}


def check(profile: Profile, jobs: list[Job], answers: dict[int, tuple[Result, dict | None]],
          whole_shards: bool, harvest: Harvest | None = None) -> list[Finding]:
    """What `up` will check, per rank (the one Engram rule, judge_rank): node-local, or why it falls back
    to NFS; `harvest` the ranges the copies were made from (None for whole shards)."""
    findings: list[Finding] = []
    for j in jobs:
        result, event = answers[j.rank]
        if event is None or event.get("event") != "status":
            findings.append(Finding("engram-copy", "fail", f"rank {j.rank} ({j.node.name}): cannot read the copy's "
                                    f"manifest: {result.message or 'no answer'}", "check the node and run again",
                                    node=j.node.name, where=j.dest))
            continue
        findings += judge_rank(event.get("manifest"), profile=profile, rank=j.rank, node=j.node.name, dest=j.dest,
                               harvest=harvest, whole_shards=whole_shards, problem=event.get("problem"),
                               source_changed=event.get("source_changed"))
    return findings


def copy_dirs(profile: Profile, inventory, ranks: list[Rank], templates) -> dict[str, tuple[int, str]]:
    """node -> (rank, node-local Engram copy dir) for the ranks that read a node-local copy (the dir the
    engine adapter mounts): what `up`'s engram step and `check` read each manifest from."""

    lane = LaneContext(profile, inventory, ranks, templates)
    engine = engine_for(profile.engine)
    dirs = {r.node.name: (r.rank, engine.engram_copy_dir(lane, r)) for r in ranks}
    return {n: (rank, d) for n, (rank, d) in dirs.items() if d}


def manifest_reads(dirs: dict[str, tuple[int, str]]) -> dict[str, str]:
    """node -> the command that prints its rank's engram-manifest.json (what judge_lane judges)."""

    return {n: ReadFile(engram_manifest_path(d)).command() for n, (_, d) in dirs.items()}


def lane_findings(transport: Transport, profile: Profile, inventory, ranks: list[Rank], templates,
                  timeout_s: float = 30.0) -> list[Finding]:
    """`check`'s Engram findings: each rank's manifest read on its node, judged by the one rule
    (manifest.judge_lane, as `up`'s engram step judges it). Empty for a lane without node-local rows."""
    e = profile.engram
    if e is None or not e.node_local:
        return []
    harvest = ranges.stored(profile)
    dirs = copy_dirs(profile, inventory, ranks, templates)
    nodes = {r.node.name: r.node for r in ranks if r.node.name in dirs}
    reads = {n: ReadFile(engram_manifest_path(d)) for n, (_, d) in dirs.items() if n in nodes}
    answers = run_commands(transport, list(nodes.values()), on("read each rank's Engram manifest", reads, timeout_s))
    reach = [n for n, r in answers.items() if not r.ok and r.error not in ("exit", None)]
    findings, _, _ = judge_lane(profile, [r for r in ranks if r.node.name not in reach], dirs, answers, harvest)
    return findings
