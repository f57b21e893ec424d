"""Patch sets on the nodes: hash what is there (one round trip per node), push only what differs."""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from sparkfleet.findings import Finding
from sparkfleet.fleet.op import NodeCommands, OpGen, query, run_ops
from sparkfleet.fleet.transport import Transport
from sparkfleet.patches.manifest import PatchManifest, set_dir
from sparkfleet.spec.inventory import Node

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
class NodeState:
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


def remote_path(node: Node, manifest: PatchManifest, source: str) -> str:
    return posixpath.join(node.storage.patch_root, manifest.name, source)


def inspect_ops(nodes: list[Node], manifest: PatchManifest,
                timeout_s: float = 30.0) -> OpGen[dict[str, NodeState] | None]:
    """Which files each node lacks or has with a different hash (one read per node); None under --dry-run."""
    paths = {n.name: [remote_path(n, manifest, f.source) for f in manifest.files] for n in nodes}
    command = f"python3 -c {shlex.quote(HASH_SCRIPT)}"
    results = yield query(f"hash patch set {manifest.name!r}", {n.name: command for n in nodes}, timeout_s,
                          {n.name: json.dumps(paths[n.name]) for n in nodes})
    if results is None:
        return None
    states: dict[str, NodeState] = {}
    for node in nodes:
        r = results[node.name]
        if not r.ok:
            states[node.name] = NodeState(node.name, False, r.message or r.stderr.strip())
            continue
        try:
            got = json.loads(r.stdout)
        except ValueError:
            states[node.name] = NodeState(node.name, False, f"unexpected answer: {r.stdout[:200]!r}")
            continue
        st = NodeState(node.name, True)
        for f in manifest.files:
            st.paths[f.source] = remote_path(node, manifest, f.source)
            h = got.get(st.paths[f.source])
            st.found[f.source] = h
            if h is None:
                st.missing.append(f.source)
            elif h != f.sha256:
                st.wrong.append(f.source)
        states[node.name] = st
    return states


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
        done = yield NodeCommands(f"copy patch set {manifest.name!r} files that differ",
                                  {n: "true" for n in writes}, files=writes)
        if done is None or before is None:
            return None
        for n in writes:
            st = before[n]
            if done[n].ok:
                st.pushed = list(todo[n])
            else:
                st.message = f"copying failed: {done[n].message or done[n].stderr.strip()}"
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
