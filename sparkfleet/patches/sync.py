"""Patch sets on the nodes: hash what is there (one round trip per node), push only what differs (the two
operations: fleet/ops/patches.py HashPatchSet, CopyPatchFiles)."""

from __future__ import annotations

from pathlib import Path

from sparkfleet.findings import Finding
from sparkfleet.fleet.op import OpGen, run_ops
from sparkfleet.fleet.ops.base import on
from sparkfleet.fleet.ops.patches import CopyPatchFiles, HashPatchSet, PatchState, patch_path
from sparkfleet.fleet.transport import Transport
from sparkfleet.patches.manifest import PatchManifest, set_dir
from sparkfleet.schema.inventory import Node

NodeState = PatchState  # a patch set on one node


def remote_path(node: Node, manifest: PatchManifest, source: str) -> str:
    return patch_path(node.storage.patch_root, manifest, source)


def inspect_ops(nodes: list[Node], manifest: PatchManifest,
                timeout_s: float = 30.0) -> OpGen[dict[str, NodeState] | None]:
    """Which files each node lacks or has with a different hash (one read per node); None under --dry-run."""
    hashes = {n.name: HashPatchSet(manifest, n.storage.patch_root) for n in nodes}
    results = yield on(f"hash patch set {manifest.name!r}", hashes, timeout_s,
                       stdin={n: op.stdin() for n, op in hashes.items()})
    if results is None:
        return None
    return {n.name: hashes[n.name].parse(results[n.name]) for n in nodes}


def inspect(transport: Transport, nodes: list[Node], manifest: PatchManifest,
            timeout_s: float = 30.0) -> dict[str, NodeState]:
    """inspect_ops run now."""
    return run_ops(transport, nodes, inspect_ops(nodes, manifest, timeout_s)) or {}


def push_ops(nodes: list[Node], manifest: PatchManifest, root: Path) -> OpGen[dict[str, NodeState] | None]:
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


def push(transport: Transport, nodes: list[Node], manifest: PatchManifest, root: Path) -> dict[str, NodeState]:
    """push_ops run now."""
    return run_ops(transport, nodes, push_ops(nodes, manifest, root)) or {}


def findings(states: dict[str, NodeState], manifest: PatchManifest) -> list[Finding]:
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
