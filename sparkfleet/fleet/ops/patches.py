"""A patch set's files on the nodes: their sha256 (one read per node), and copying the ones that differ (one
write per node): the two operations, and `inspect_ops`/`push_ops` that drive them (`patches verify|push`, up's
patches step, restore), with the findings on what they found.

The hash runs on the node with plain python3: the JSON list of paths on its stdin, one JSON object out, each
path's sha256 or null when it cannot be read (missing).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from sparkfleet.findings import Finding
from sparkfleet.fleet.op import OpGen, run_ops
from sparkfleet.fleet.ops.base import Op, on
from sparkfleet.fleet.transport import Result, Transport
from sparkfleet.patches.manifest import PatchManifest, set_dir
from sparkfleet.schema.inventory import Node

# Runs on the node with plain python3: sha256 of each path on stdin (JSON list), null when missing.
HASH_SCRIPT = (
    "import hashlib,json,sys\n"
    "out={}\n"
    "for p in json.load(sys.stdin):\n"
    "    try:\n"
    "        h=hashlib.sha256()\n"
    "        with open(p,'rb') as f:\n"
    "            for b in iter(lambda: f.read(1<<20), b''): h.update(b)\n"
    "        out[p]=h.hexdigest()\n"
    "    except OSError:\n"
    "        out[p]=None\n"
    "print(json.dumps(out))\n"
)


@dataclass
class PatchState:
    """A patch set on one node: what is missing, what differs, what was pushed."""

    node: str
    reachable: bool
    message: str = ""
    missing: list[str] = field(default_factory=list)  # sources
    wrong: list[str] = field(default_factory=list)
    pushed: list[str] = field(default_factory=list)
    found: dict[str, str | None] = field(default_factory=dict)  # source -> sha256 on the node (None: missing)
    paths: dict[str, str] = field(default_factory=dict)  # source -> its path on the node

    @property
    def ok(self) -> bool:
        return self.reachable and not self.missing and not self.wrong


def patch_path(patch_root: str, manifest: PatchManifest, source: str) -> str:
    """Where a patch file is on a node whose patch root is `patch_root`."""
    return posixpath.join(patch_root, manifest.name, source)


@dataclass(frozen=True)
class HashPatchSet(Op[PatchState]):
    """The sha256 of each of the set's files on a node (whose patch root is `patch_root`), against the
    manifest's: the paths go on stdin (`stdin()`)."""

    manifest: PatchManifest
    patch_root: str

    def paths(self) -> list[str]:
        return [patch_path(self.patch_root, self.manifest, f.source) for f in self.manifest.files]

    def stdin(self) -> str:
        return json.dumps(self.paths())

    def command(self) -> str:
        return f"python3 -c {shlex.quote(HASH_SCRIPT)}"

    def parse(self, result: Result) -> PatchState:
        """Per file: missing (no hash), wrong (another hash) or fine; unreachable with why when the node did not
        answer or answered something else than the JSON object."""
        if not result.ok:
            return PatchState(result.node, False, result.message or result.stderr.strip())
        try:
            got = json.loads(result.stdout)
        except ValueError:
            return PatchState(result.node, False, f"unexpected answer: {result.stdout[:200]!r}")
        st = PatchState(result.node, True)
        for f in self.manifest.files:
            st.paths[f.source] = patch_path(self.patch_root, self.manifest, f.source)
            h = got.get(st.paths[f.source])
            st.found[f.source] = h
            if h is None:
                st.missing.append(f.source)
            elif h != f.sha256:
                st.wrong.append(f.source)
        return st


@dataclass(frozen=True)
class CopyPatchFiles(Op[str | None]):
    """Write patch files on a node (path -> content, `files()`); the command itself only answers once they are
    written. Its answer: None when copied, else why not."""

    writes: tuple[tuple[str, bytes], ...]
    changes = True

    def files(self) -> dict[str, bytes]:
        return dict(self.writes)

    def command(self) -> str:
        return "true"

    def parse(self, result: Result) -> str | None:
        return None if result.ok else f"copying failed: {result.message or result.stderr.strip()}"


def remote_path(node: Node, manifest: PatchManifest, source: str) -> str:
    return patch_path(node.storage.patch_root, manifest, source)


def inspect_ops(nodes: list[Node], manifest: PatchManifest,
                timeout_s: float = 30.0) -> OpGen[dict[str, PatchState] | None]:
    """Which files each node lacks or has with a different hash (one read per node); None under --dry-run."""
    hashes = {n.name: HashPatchSet(manifest, n.storage.patch_root) for n in nodes}
    results = yield on(f"hash patch set {manifest.name!r}", hashes, timeout_s,
                       stdin={n: op.stdin() for n, op in hashes.items()})
    if results is None:
        return None
    return {n.name: hashes[n.name].parse(results[n.name]) for n in nodes}


def inspect(transport: Transport, nodes: list[Node], manifest: PatchManifest,
            timeout_s: float = 30.0) -> dict[str, PatchState]:
    """inspect_ops run now."""
    return run_ops(transport, nodes, inspect_ops(nodes, manifest, timeout_s)) or {}


def push_ops(nodes: list[Node], manifest: PatchManifest, root: Path) -> OpGen[dict[str, PatchState] | None]:
    """Copy only the files whose hash differs (one write per node), then verify every node again. Under
    --dry-run the hashes are not read, so every file of the set is shown as it would be written."""
    before = yield from inspect_ops(nodes, manifest)
    base = set_dir(root, manifest.name)
    todo: dict[str, list[str]] = {}
    for node in nodes:
        st = before.get(node.name) if before is not None else None
        if st is None or st.reachable:
            todo[node.name] = (st.missing + st.wrong) if st else [f.source for f in manifest.files]
    by_name = {n.name: n for n in nodes}
    writes = {n: {remote_path(by_name[n], manifest, src): (base / src).read_bytes() for src in srcs}
              for n, srcs in todo.items() if srcs}
    if writes:
        copies = {n: CopyPatchFiles(tuple(w.items())) for n, w in writes.items()}
        done = yield on(f"copy patch set {manifest.name!r} files that differ", copies, 120.0,
                        files={n: op.files() for n, op in copies.items()})
        if done is None or before is None:
            return None
        for n, op in copies.items():
            st = before[n]
            failed = op.parse(done[n])
            if failed is None:
                st.pushed = list(todo[n])
            else:
                st.message = failed
    elif before is None:
        return None
    after = yield from inspect_ops([n for n in nodes if before[n.name].reachable], manifest)
    for name, st in (after or {}).items():
        st.pushed = before[name].pushed
        if before[name].message:
            st.message = before[name].message
    return {**before, **(after or {})}


def push(transport: Transport, nodes: list[Node], manifest: PatchManifest, root: Path) -> dict[str, PatchState]:
    """push_ops run now."""
    return run_ops(transport, nodes, push_ops(nodes, manifest, root)) or {}


def findings(states: dict[str, PatchState], manifest: PatchManifest) -> list[Finding]:
    out = []
    for name, st in states.items():
        if not st.reachable:
            out.append(Finding("patches", "fail", f"cannot check patch set {manifest.name!r}: {st.message}",
                               "bring the node back, then run again", node=name))
            continue
        remedy = f"sparkfleet patches push --profile ... (set {manifest.name!r})"
        for f in manifest.files:
            if f.source not in st.missing and f.source not in st.wrong:
                continue
            found = st.found.get(f.source)
            out.append(Finding("patches", "fail",
                               f"{st.paths[f.source]}: expected sha256 {f.sha256}, found {found or 'no file'}",
                               remedy, node=name, observed=found or "missing", expected=f.sha256))
        if st.ok:
            pushed = f"; pushed {len(st.pushed)} file(s)" if st.pushed else ""
            out.append(Finding("patches", "ok", f"{len(manifest.files)} file(s) verified{pushed}", node=name))
    return out
