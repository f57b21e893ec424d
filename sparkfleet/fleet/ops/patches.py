"""A patch set's files on a node: their sha256 (one read), and copying the ones that differ (one write).

The hash runs on the node with plain python3: the JSON list of paths on its stdin, one JSON object out, each
path's sha256 or null when it cannot be read (missing). patches/sync.py drives the two.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass, field

from sparkfleet.fleet.ops.base import Op
from sparkfleet.fleet.transport import Result
from sparkfleet.patches.manifest import PatchManifest

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
