"""Building an engine on every rank, pinning what was built, and checking the pin before a lane serves.

`build_ops` runs the adapter's published commands (sparkfleet/engines/build.py) on every rank at once, in a
staging dir beside the built dir; only when every rank built and every rank's artefact has the same
bytes is each stage moved into place and the pin written (`<state dir>/builds/<engine>-<key>.json`, key =
the build's inputs: what is on the fleet's nodes is fleet state, like runs and restore points, not a
setting of the ops dir). A failed build removes every stage and leaves the built dirs and the pin as
they were: nothing half-built is claimed. `verify_ops` (up's and restore's `engine_build` step) hashes
each rank's artefact and compares it with the pin.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sparkfleet.engines.build import EngineBuild
from sparkfleet.findings import Finding
from sparkfleet.fleet.op import NodeCommands, OpGen, query
from sparkfleet.root import state_dir
from sparkfleet.schema.errors import UserError
from sparkfleet.schema.inventory import Node

BUILDS = "builds"  # in the state dir, beside runs/ and restore/
MARK = "sparkfleet-build:"  # the lines the build script prints between the programs' own output
TAIL_LINES = 12  # of a failed step's output, in the finding
BUILD_TIMEOUT_S = 3600.0  # a bound, not an estimate: the seeds give no build time

# Runs on the node with plain python3: sha256 of every file under the dir on stdin (JSON), or missing.
TREE_HASH_SCRIPT = (
    "import hashlib,json,os,sys\n"
    "top=sys.stdin.read().strip()\n"
    "out={}\n"
    "for d,dirs,files in os.walk(top):\n"
    "    dirs.sort()\n"
    "    for f in sorted(files):\n"
    "        p=os.path.join(d,f)\n"
    "        h=hashlib.sha256()\n"
    "        if os.path.islink(p):\n"
    "            h.update(os.readlink(p).encode())\n"
    "        else:\n"
    "            with open(p,'rb') as fh:\n"
    "                for b in iter(lambda: fh.read(1<<20), b''): h.update(b)\n"
    "        out[os.path.relpath(p,top)]=h.hexdigest()\n"
    f"print({MARK!r}, 'artefact', json.dumps({{'dir':top,'exists':os.path.isdir(top),'files':out}}))\n"
)


def tree_digest(files: dict[str, str]) -> str:
    """One sha256 for a tree: over `sha256sum`-style lines (`<sha256>  <path>`), sorted by path."""
    text = "".join(f"{files[p]}  {p}\n" for p in sorted(files))
    return hashlib.sha256(text.encode()).hexdigest()


def hash_command() -> str:
    return f"python3 -c {shlex.quote(TREE_HASH_SCRIPT)}"


def build_script(b: EngineBuild) -> str:
    """The shell a rank runs: each published command in turn (its name printed first, so a failure is
    reported under it), stopping at the first that fails; then the staged artefact's hashes."""
    q = shlex.quote
    parent = posixpath.dirname(b.stage)
    # the build dir's parent (TensorFold: the recipe dir) must be there: a build is never put where nothing
    # would serve it
    missing = f"{parent}: no such directory on this node (the parent of the build dir {b.dir})"
    lines = ["exec 2>&1", f"printf '%s\\n' {q(MARK + ' step prepare')}",
             f"[ -d {q(parent)} ] || {{ printf '%s\\n' {q(missing)}; exit 1; }}",
             f"rm -rf -- {q(b.stage)} && cd -- {q(parent)} || exit 1",
             f"printf '%s\\n' {q(MARK + ' step ' + b.fetch.name)}", f"{b.fetch.command} || exit 1",
             f"cd -- {q(b.stage)} || exit 1"]
    for s in b.steps:
        lines += [f"printf '%s\\n' {q(MARK + ' step ' + s.name)}", f"{s.command} || exit 1"]
    lines += [f"printf '%s\\n' {q(MARK + ' step hash the artefact')}",
              f"printf '%s' {q(posixpath.join(b.stage, b.artefact))} | {hash_command()} || exit 1"]
    return "\n".join(lines)


def install_script(b: EngineBuild) -> str:
    """Move the stage into place (the previous build aside first, removed once the new one is there)."""
    q = shlex.quote
    old = b.dir + ".sparkfleet-old"
    return (f"rm -rf -- {q(old)} && {{ [ ! -e {q(b.dir)} ] || mv -- {q(b.dir)} {q(old)}; }} && "
            f"mv -- {q(b.stage)} {q(b.dir)} && rm -rf -- {q(old)}")


def cleanup_script(b: EngineBuild) -> str:
    return f"rm -rf -- {shlex.quote(b.stage)}"


@dataclass
class RankBuild:
    """One node's build: the artefact's files, or the step that failed and its last lines."""

    node: str
    ok: bool
    files: dict[str, str] = field(default_factory=dict)
    step: str = ""
    tail: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def digest(self) -> str | None:
        return tree_digest(self.files) if self.ok else None


def parse_build(node: str, stdout: str, ok: bool, message: str, elapsed: float) -> RankBuild:
    """What the build script printed: the artefact line, or the last step named and what followed it."""
    step, after, artefact = "", [], None
    for line in stdout.splitlines():
        if line.startswith(MARK + " step "):
            step, after = line[len(MARK + " step "):], []
        elif line.startswith(MARK + " artefact "):
            artefact = json.loads(line[len(MARK + " artefact "):])
        else:
            after.append(line)
    if ok and artefact is not None:
        if not artefact["files"]:
            return RankBuild(node, False, step="hash the artefact", seconds=elapsed,
                             tail=[f"the build installed nothing under {artefact['dir']}"])
        return RankBuild(node, True, files=artefact["files"], seconds=elapsed)
    tail = [ln for ln in after if ln.strip()][-TAIL_LINES:] or ([message] if message else [])
    return RankBuild(node, False, step=step or "reach the node", tail=tail, seconds=elapsed)


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
    script = build_script(b)
    results = yield NodeCommands(f"build {b.engine} in {b.stage}", {n.name: script for n in nodes},
                                 timeout_s=BUILD_TIMEOUT_S)
    if results is None:
        yield NodeCommands(f"move the build into {b.dir}", {n.name: install_script(b) for n in nodes})
        return None
    ranks = {n: parse_build(n, r.stdout, r.ok, r.message or r.stderr.strip(), r.elapsed_s)
             for n, r in results.items()}
    findings = [Finding("engine-build", "fail", f"{r.step} failed: " + " | ".join(r.tail[-3:]),
                        "fix what the step's output says on that node, then build again", node=n,
                        observed="\n".join(r.tail)) for n, r in sorted(ranks.items()) if not r.ok]
    if not findings:
        findings = _disagree(ranks)
    if findings:
        reachable = [n for n in nodes if results[n.name].error in (None, "exit")]  # a node that answered
        if reachable:
            yield NodeCommands(f"remove the failed build's {b.stage}", {n.name: cleanup_script(b) for n in reachable})
        return BuildOutcome(ranks, findings, seconds=time.monotonic() - started)
    moved = yield NodeCommands(f"move the build into {b.dir}", {n.name: install_script(b) for n in nodes})
    assert moved is not None
    bad = [Finding("engine-build", "fail", f"could not move {b.stage} to {b.dir}: "
                   f"{(r.stderr or r.stdout or r.message).strip()[-300:]}",
                   "fix the node's disk or permissions, then build again", node=n)
           for n, r in sorted(moved.items()) if not r.ok]
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
    results = yield query(f"hash the built {b.engine} under {b.artefact_dir}", {n.name: hash_command() for n in nodes},
                          60, {n.name: b.artefact_dir for n in nodes})
    if results is None:
        return None
    out: dict[str, dict | str] = {}
    for n, r in results.items():
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith(MARK + " artefact ")), None)
        out[n] = json.loads(line[len(MARK + " artefact "):]) if r.ok and line else (
            r.message or r.stderr.strip() or "no answer")
    return out


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
