"""Building an engine on every rank, pinning what was built, and checking the pin before a lane serves.

`build_ops` runs the adapter's published commands (sparkfleet/engines/build_recipe.py) on every rank at once, in a
staging dir beside the built dir; only when every rank built and every rank's artefact has the same
bytes is each stage moved into place and the pin written (`<state dir>/builds/<engine>-<key>.json`, key =
the build's inputs: what is on the fleet's nodes is fleet state, like runs and restore points, not a
setting of the ops dir). A failed build removes every stage and leaves the built dirs and the pin as
they were: nothing half-built is claimed. `verify_ops` (up's and restore's `engine_build` step) hashes
each rank's artefact and compares it with the pin.
"""

from __future__ import annotations

import json
import posixpath
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sparkfleet.engines.build_recipe import EngineBuild
from sparkfleet.findings import Finding
from sparkfleet.fleet.op import OpGen
from sparkfleet.fleet.ops.base import on
from sparkfleet.fleet.ops.rank_build import (
    BuildEngine,
    HashArtefact,
    InstallBuild,
    RankBuild,
    RemoveStage,
    tree_digest,
)
from sparkfleet.root import state_dir
from sparkfleet.schema.errors import UserError
from sparkfleet.schema.inventory import Node

BUILDS = "builds"  # in the state dir, beside runs/ and restore/


# -- the pin -----------------------------------------------------------------------------------------------

def pin_path(b: EngineBuild) -> Path:
    return state_dir() / BUILDS / f"{b.engine}-{b.key}.json"


def load_pin(b: EngineBuild) -> dict | None:
    """The pin of this build's inputs, or None when it was never built (or the inputs changed since)."""
    path = pin_path(b)
    if not path.is_file():
        return None
    try:
        pin = json.loads(path.read_text())
    except ValueError as exc:
        raise UserError(f"{path}: not JSON ({exc}): build again (sparkfleet build --profile ...)") from exc
    if not isinstance(pin, dict) or not isinstance(pin.get("files"), dict) or pin.get("digest") != tree_digest(
            pin["files"]):
        raise UserError(f"{path}: 'digest' does not match its 'files': build again (sparkfleet build --profile ...)")
    return pin


def write_pin(b: EngineBuild, files: dict[str, str], ranks: dict[str, RankBuild]) -> Path:
    path = pin_path(b)
    path.parent.mkdir(parents=True, exist_ok=True)
    pin = {"engine": b.engine, "key": b.key, "inputs": b.inputs, "dir": b.dir, "artefact": b.artefact,
           "digest": tree_digest(files), "files": files, "nodes": sorted(ranks),
           "built_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "seconds": {n: round(r.seconds, 2) for n, r in sorted(ranks.items())}}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(pin, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # a reader sees the old pin or the new one, never half of one
    return path


# -- building ----------------------------------------------------------------------------------------------

@dataclass
class BuildOutcome:
    ranks: dict[str, RankBuild]
    findings: list[Finding]
    pin: Path | None = None  # written: every rank built the same artefact and it is in place
    seconds: float = 0.0


def _disagree(ranks: dict[str, RankBuild]) -> list[Finding]:
    """Every rank built, but not the same bytes: name each file that differs, per rank, against the most
    common digest (the controller cannot tell which is right; none is installed)."""
    by_digest: dict[str, list[str]] = {}
    for n, r in ranks.items():
        by_digest.setdefault(r.digest or "", []).append(n)
    if len(by_digest) == 1:
        return []
    common = max(by_digest.items(), key=lambda kv: (len(kv[1]), kv[0]))[1][0]
    out = []
    for n, r in sorted(ranks.items()):
        if r.digest == ranks[common].digest:
            continue
        diff = sorted(set(r.files) ^ set(ranks[common].files) |
                      {p for p in r.files if p in ranks[common].files and r.files[p] != ranks[common].files[p]})
        out.append(Finding("engine-build", "fail", f"built different bytes than {common}: {', '.join(diff)}",
                           "the ranks' sources, patches or toolchains differ: make them the same, then build again",
                           node=n, observed=r.digest, expected=ranks[common].digest))
    return out


def build_ops(nodes: list[Node], b: EngineBuild) -> OpGen[BuildOutcome | None]:
    """Build on every rank; install and pin only if every rank built the same artefact. None under --dry-run
    (every command was shown: build, then install; the cleanup a failure runs is not)."""
    started = time.monotonic()
    build, install = BuildEngine(b), InstallBuild(b)
    results = yield on(f"build {b.engine} in {b.stage}", {n.name: build for n in nodes}, build.timeout_s)
    if results is None:
        yield on(f"move the build into {b.dir}", {n.name: install for n in nodes}, 120.0)
        return None
    ranks = {n: build.parse(r) for n, r in results.items()}
    findings = [Finding("engine-build", "fail", f"{r.step} failed: " + " | ".join(r.tail[-3:]),
                        "fix what the step's output says on that node, then build again", node=n,
                        observed="\n".join(r.tail)) for n, r in sorted(ranks.items()) if not r.ok]
    if not findings:
        findings = _disagree(ranks)
    if findings:
        reachable = [n for n in nodes if results[n.name].error in (None, "exit")]  # a node that answered
        if reachable:
            remove = RemoveStage(b)
            yield on(f"remove the failed build's {b.stage}", {n.name: remove for n in reachable}, 120.0)
        return BuildOutcome(ranks, findings, seconds=time.monotonic() - started)
    moved = yield on(f"move the build into {b.dir}", {n.name: install for n in nodes}, 120.0)
    assert moved is not None
    bad = [Finding("engine-build", "fail", f"could not move {b.stage} to {b.dir}: {why}",
                   "fix the node's disk or permissions, then build again", node=n)
           for n, why in sorted((n, install.parse(r)) for n, r in moved.items()) if why is not None]
    if bad:
        return BuildOutcome(ranks, bad, seconds=time.monotonic() - started)
    files = next(iter(ranks.values())).files
    path = write_pin(b, files, ranks)
    ok = [Finding("engine-build", "ok", f"built {len(files)} file(s) into {b.artefact_dir}, sha256 "
                  f"{tree_digest(files)[:16]}", node=n) for n in sorted(ranks)]
    return BuildOutcome(ranks, ok, pin=path, seconds=time.monotonic() - started)


# -- checking ----------------------------------------------------------------------------------------------

def verify_ops(nodes: list[Node], b: EngineBuild) -> OpGen[dict[str, dict | str] | None]:
    """Each rank's artefact ({exists, files}) or why it could not be read; None under --dry-run."""
    hashes = {n.name: HashArtefact(b) for n in nodes}
    results = yield on(f"hash the built {b.engine} under {b.artefact_dir}", hashes, 60,
                       stdin={n: op.stdin() for n, op in hashes.items()})
    if results is None:
        return None
    return {n: hashes[n].parse(r) for n, r in results.items()}


def verify_findings(found: dict[str, dict | str], b: EngineBuild, pin: dict, profile: str) -> list[Finding]:
    """Per rank: the artefact is the pinned one, file for file."""
    remedy = f"sparkfleet build --profile {profile}"
    out = []
    for n, got in sorted(found.items()):
        if isinstance(got, str):
            out.append(Finding("engine-build", "fail", f"cannot hash {b.artefact_dir}: {got}",
                               "bring the node back, then run again", node=n))
            continue
        if not got["exists"]:
            out.append(Finding("engine-build", "fail", f"{b.artefact_dir} is missing: the engine is not built here",
                               remedy, node=n, observed="missing", expected=pin["digest"]))
            continue
        want, have = pin["files"], got["files"]
        for p in sorted(set(want) | set(have)):
            if want.get(p) != have.get(p):
                out.append(Finding("engine-build", "fail",
                                   f"{posixpath.join(b.artefact_dir, p)}: expected sha256 {want.get(p) or 'no file'}, "
                                   f"found {have.get(p) or 'no file'}", remedy, node=n,
                                   observed=have.get(p) or "missing", expected=want.get(p) or "absent"))
        if want == have:
            out.append(Finding("engine-build", "ok", f"{b.engine} built as pinned (sha256 {pin['digest'][:16]})",
                               node=n))
    return out
