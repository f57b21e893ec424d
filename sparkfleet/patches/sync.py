"""Patch sets on the nodes: hash what is there (one round trip per node), push only what differs."""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from sparkfleet.findings import Finding
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


def inspect(transport: Transport, nodes: list[Node], manifest: PatchManifest,
            timeout_s: float = 30.0) -> dict[str, NodeState]:
    """Which files each node lacks or has with a different hash."""
    paths = {n.name: [remote_path(n, manifest, f.source) for f in manifest.files] for n in nodes}
    states: dict[str, NodeState] = {}
    # one command per node; nodes sharing a patch_root share one fan-out
    results = {}
    by_stdin: dict[str, list[Node]] = {}
    for node in nodes:
        by_stdin.setdefault(json.dumps(paths[node.name]), []).append(node)
    for stdin, group in by_stdin.items():
        results.update(transport.run(group, f"python3 -c {shlex.quote(HASH_SCRIPT)}", stdin=stdin,
                                     timeout_s=timeout_s))
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


def push(transport: Transport, nodes: list[Node], manifest: PatchManifest, root: Path) -> dict[str, NodeState]:
    """Copy only the files whose hash differs, then verify every node again."""
    before = inspect(transport, nodes, manifest)
    base = set_dir(root, manifest.name)
    for node in nodes:
        st = before[node.name]
        if not st.reachable:
            continue
        for source in st.missing + st.wrong:
            data = (base / source).read_bytes()
            res = transport.put([node], data, remote_path(node, manifest, source))[node.name]
            if not res.ok:
                st.message = f"copying {source} failed: {res.message or res.stderr.strip()}"
                break
            st.pushed.append(source)
    after = inspect(transport, [n for n in nodes if before[n.name].reachable], manifest)
    for name, st in after.items():
        st.pushed = before[name].pushed
        if before[name].message:
            st.message = before[name].message
    return {**before, **after}


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
