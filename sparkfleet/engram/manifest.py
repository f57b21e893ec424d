"""What `up` checks before launch: does a rank's node-local copy serve that rank, or will it read NFS?

The engine uses a node-local copy only when its manifest matches the lane's checkpoint and format
and covers the rank's rows; otherwise it silently falls back to the model directory over NFS
(docs/failure-modes.md FM-24, FM-62; ENG-25). sparkfleet says so before launch. The manifest schema (OQ-20) is in
docs/engram-local.md; the copy that writes it is sparkfleet/fleet/nodeside/engram_copy.py.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import TYPE_CHECKING

from sparkfleet.engram.ranges import Harvest, Ranges
from sparkfleet.findings import Finding
from sparkfleet.fleet.nodeside.engram_copy import MANIFEST, MANIFEST_SCHEMA

if TYPE_CHECKING:
    from sparkfleet.fleet.transport import Result
    from sparkfleet.placement import Rank
    from sparkfleet.schema.profile import Profile

__all__ = ["MANIFEST", "MANIFEST_SCHEMA", "check_rank", "falls_back", "judge_lane", "judge_rank"]

CHECK = "engram-copy"


def judge_rank(manifest: dict | None, *, profile: Profile, rank: int, node: str, dest: str,
               harvest: Harvest | None = None, whole_shards: bool = False, problem: str | None = None,
               source_changed: list[str] | None = None) -> list[Finding]:
    """THE Engram rule, as `up`, `engram-local` fleet mode, `check` and the exporter apply it: one rank's
    copy judged against the lane (its checkpoint revision, table format, TP size and Engram layers) and
    the rows the rank reads: the lane's harvested ranges when known (`harvest`), else the manifest's own
    record of what it covers, held against the rank's place in the TP geometry."""
    e = profile.engram
    ranges = harvest.ranks.get(rank) if harvest is not None else None
    return check_rank(manifest, rank=rank, node=node, dest=dest,
                      revision=profile.model.revision if profile.model else None,
                      fmt=e.format if e else None, ranges=ranges, whole_shards=whole_shards, problem=problem,
                      source_changed=source_changed, tp=profile.tp, layers=list(e.layers) if e else None,
                      lane=profile.name)


def check_rank(manifest: dict | None, *, rank: int, node: str, dest: str, revision: str | None,
               fmt: str | None, ranges: Ranges | None, whole_shards: bool = False,
               problem: str | None = None, source_changed: list[str] | None = None,
               tp: int | None = None, layers: list[int] | None = None, lane: str = "<lane>") -> list[Finding]:
    """Findings for one rank's copy: ok (node-local) or fail (this rank falls back to NFS), plus warnings.
    Callers go through judge_rank, which derives the lane's side from the profile.

    `manifest` is the manifest as the node-side `status` returns it (None when there is none, with
    `problem` saying why); `ranges` the rows this rank reads per layer (None: not known, then the copy's
    own record is held against `tp` and `layers`: made for this rank of this TP size, every layer in it);
    `source_changed` the shards whose header differs from the one copied."""
    who = f"rank {rank} ({node})"
    nfs = "falls back to reading the model directory over NFS (6-8 ms a step against 3, ENG-16)"

    def fail(msg: str, remedy: str, observed: str | None = None, expected: str | None = None) -> Finding:
        return Finding(CHECK, "fail", f"{who}: {msg}: {nfs}", remedy, node=node, where=dest,
                       observed=observed, expected=expected)

    redo = f"sparkfleet engram-local --profile {lane} --node {node}"
    if manifest is None:
        return [fail(problem or "no engram-manifest.json: the copy is missing or incomplete",
                     f"make (or resume) the copy: {redo}")]
    if manifest.get("schema") != MANIFEST_SCHEMA or not manifest.get("complete"):
        return [fail(f"the manifest is not a complete {MANIFEST_SCHEMA} manifest", f"copy again: {redo}")]
    out: list[Finding] = []
    have_rev = (manifest.get("source") or {}).get("revision")
    if revision and have_rev != revision:
        out.append(fail(f"the copy is of checkpoint {have_rev or 'unknown'}, the lane runs {revision} "
                        "(docs/failure-modes.md FM-62)",
                        f"copies are per checkpoint: {redo}", have_rev, revision))
    elif not revision:
        out.append(Finding(CHECK, "warn", f"{who}: the lane has no model.revision, so the copy's checkpoint "
                           f"({have_rev or 'unknown'}) cannot be checked", "set model.revision in the profile",
                           node=node, where=dest))
    if source_changed:
        out.append(fail("the checkpoint's shards changed since the copy (" + "; ".join(source_changed) + ")",
                        f"copy again: {redo}"))
    if fmt and manifest.get("format") != fmt:
        out.append(fail(f"the copy holds {manifest.get('format') or 'an unknown'} Engram tables, the lane reads {fmt} "
                        "(docs/failure-modes.md FM-24)", f"copies are per format: {redo}", manifest.get("format"), fmt))
    mode = manifest.get("mode")
    if whole_shards:
        if mode != "whole-shards":
            out.append(fail(f"the copy holds rows ({mode}), the lane needs whole shards", f"{redo} --whole-shards"))
    elif mode != "rows" and mode != "whole-shards":
        out.append(fail(f"unknown copy mode {mode!r}", f"copy again: {redo}"))
    elif mode == "rows":
        have = {int(k): (v["start"], v["end"]) for k, v in (manifest.get("layers") or {}).items()}
        if ranges is None:  # no harvested ranges: the copy's own record against the rank's place
            made = manifest.get("tp") or {}
            if tp is not None and (made.get("size"), made.get("rank")) != (tp, rank):
                got = f"rank {made.get('rank')} of TP{made.get('size')}" if made else "an unrecorded rank and TP"
                out.append(fail(f"the copy holds the rows of {got}, this is rank {rank} of TP{tp}",
                                f"copy again for this rank: {redo}", got, f"rank {rank} of TP{tp}"))
            out += [fail(f"layer {layer} is not in the copy", f"copy again: {redo}", None, f"layer {layer}")
                    for layer in (layers or []) if layer not in have]
        for layer, (start, end) in sorted((ranges or {}).items()):
            got = have.get(layer)
            if got is None:
                out.append(fail(f"layer {layer} is not in the copy", f"copy again with the harvested ranges: {redo}",
                                None, f"[{start}, {end})"))
            elif not (got[0] <= start and end <= got[1]):
                out.append(fail(f"layer {layer}: the copy holds rows [{got[0]}, {got[1]}), the rank reads "
                                f"[{start}, {end})", f"copy again with the harvested ranges: {redo}",
                                f"[{got[0]}, {got[1]})", f"[{start}, {end})"))
    if not manifest.get("verified"):  # an unread copy may hold torn rows: the engine would serve them
        out.append(fail("the copy was never verified (made with --no-verify, or its read-back failed)",
                        f"verify it: sparkfleet engram-local verify --dest {dest}"))
    if not any(f.status == "fail" for f in out):
        layers = ", ".join(f"{k} [{v['start']}, {v['end']})" for k, v in (manifest.get("layers") or {}).items())
        what = "whole shards" if mode == "whole-shards" else f"rows {layers}"
        out.insert(0, Finding(CHECK, "ok", f"{who}: node-local {manifest.get('format') or ''} copy of {what} "
                              f"(checkpoint {have_rev or 'unknown'}, completed {manifest.get('completed_at')})",
                              node=node, where=dest))
    return out


def falls_back(findings: list[Finding]) -> bool:
    """True when this rank will read its Engram rows over NFS."""
    return any(f.check == CHECK and f.status == "fail" for f in findings)


def read_manifest(res: Result) -> tuple[dict | None, str | None]:
    """A rank's engram-manifest.json as `cat` read it on its node, or why there is none."""
    if not res.ok:
        return None, "no engram-manifest.json: the copy is missing or incomplete"
    try:
        m = json.loads(res.stdout)
    except ValueError:
        return None, "engram-manifest.json is not JSON"
    return (m, None) if isinstance(m, dict) else (None, "engram-manifest.json is not a JSON object")


def no_copy_remedy(profile: Profile) -> str:
    """What an operator does about a rank without a copy in a lane that expects node-local rows."""
    lane = profile.name
    tensors = "" if profile.engram and profile.engram.tensor_pattern else " --tensors PATTERN"
    return (f"make the copies: boot once reading NFS on purpose (sparkfleet up --profile {lane} "
            f"-o expect.engram_node_local=false), then sparkfleet engram-local harvest --profile {lane} and "
            f"sparkfleet engram-local --profile {lane}{tensors}; or keep serving from NFS with that -o")


def judge_lane(profile: Profile, ranks: list[Rank], dirs: dict[str, tuple[int, str]],
               answers: dict[str, Result], harvest: Harvest | None
               ) -> tuple[list[Finding], dict[int, str], dict[str, str]]:
    """Every rank of a lane by the one rule, as `up`'s engram step and `check` say it before launch:
    findings, rank -> "node-local" | "nfs", and rank -> sha256 of each qualifying manifest (a restore pin).

    `dirs` is node -> (rank, copy dir) for the ranks that read a node-local copy, `answers` each such
    node's `cat` of its manifest. A copy that does not serve its rank falls back to NFS: a warning, unless
    the lane expects node-local rows (expect.engram_node_local) for a rank not in engram.nfs_ranks: then
    any rank without a qualifying copy (none at all, no engram_local_dir, or one that does not qualify)
    is a failure, before anything starts."""
    e = profile.engram
    assert e is not None
    must = profile.expect.engram_node_local
    findings: list[Finding] = []
    per_rank: dict[int, str] = {}
    shas: dict[str, str] = {}
    for r in ranks:
        name = r.node.name
        if name not in dirs and r.rank in e.nfs_ranks and r.node.storage.model_local:
            per_rank[r.rank] = "node-local"  # the node holding the checkpoint reads its rows from local disk
            findings.append(Finding("engram", "ok", f"rank {r.rank}: rows from the local checkpoint", node=name))
            continue
        if name not in dirs:
            per_rank[r.rank] = "nfs"
            if must and r.rank not in e.nfs_ranks:
                findings.append(Finding(CHECK, "fail", f"rank {r.rank} ({name}): the node has no "
                                        "storage.engram_local_dir, so the rank reads Engram rows over NFS, and the "
                                        "lane expects node-local rows (expect.engram_node_local)",
                                        "set storage.engram_local_dir for the node in the inventory, then "
                                        + no_copy_remedy(profile), node=name))
                continue
            findings.append(Finding("engram", "warn", f"rank {r.rank} reads Engram rows over NFS "
                                    "(listed in engram.nfs_ranks or no engram_local_dir)", node=name,
                                    remedy="sparkfleet engram-local --profile ... (6-8 ms a step over NFS vs 3)"))
            continue
        res = answers[name]
        manifest, problem = read_manifest(res)
        verdicts = judge_rank(manifest, profile=profile, rank=r.rank, node=name, dest=dirs[name][1],
                              harvest=harvest, problem=problem)
        nfs = falls_back(verdicts)
        per_rank[r.rank] = "nfs" if nfs else "node-local"
        if not nfs:
            shas[str(r.rank)] = hashlib.sha256(res.stdout.encode()).hexdigest()
        if not (must and r.rank not in e.nfs_ranks):
            verdicts = [replace(f, status="warn") if f.status == "fail" else f for f in verdicts]
        elif manifest is None:  # no copy at all: the remedy is to make it (or to boot from NFS on purpose)
            verdicts = [replace(f, remedy=no_copy_remedy(profile)) if f.status == "fail" else f for f in verdicts]
        findings += verdicts
    return findings, per_rank, shas
