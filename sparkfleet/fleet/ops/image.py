"""An image on a node, as `docker image inspect REF` shows it: its registry digests, id and layers.

`docker image inspect REF` prints a JSON array holding the image object (https://docs.docker.com/reference/
cli/docker/image/inspect/; the Engine API's ImageInspect): `Id`, `RepoDigests` (`repo@sha256:...`, one per
registry manifest the image was pulled or pushed by; none for an image built or loaded locally) and
`RootFS.Layers` (the layers' diff ids: sha256 of each uncompressed layer, base first). For a ref it does not
hold it prints `[]` on stdout, `Error: No such image: REF` on stderr and exits 1.

Which build a node holds is judged by its layers, not its id: the id is the config's digest in the classic
store but the manifest's in the containerd store, so two nodes with the same content can show different ids
(a peer found it across storage drivers), while the diff ids are the content itself on every store.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass

from sparkfleet.fleet.ops.base import REMEDIES, NodeError, Op, classify
from sparkfleet.fleet.transport import Result

NO_SUCH_IMAGE = re.compile(r"No such (?:image|object): ")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImageBuild:
    """One node's image of a ref: what `pin` compares across the ranks."""

    id: str
    repo_digests: tuple[str, ...]  # repo@sha256:..., as docker lists them
    layers: tuple[str, ...]  # RootFS.Layers: diff ids, base first

    @property
    def content(self) -> str:
        """One digest of the layer list (sha256 over the diff ids in order): equal on two nodes = same build."""
        return "sha256:" + hashlib.sha256("\n".join(self.layers).encode()).hexdigest()


def same_build(a: ImageBuild, b: ImageBuild) -> bool:
    """The same build: the same layers in the same order (the ids may differ by storage driver)."""
    return a.layers == b.layers


@dataclass(frozen=True)
class InspectImage(Op[ImageBuild | NodeError]):
    """The node's image of `ref`; a NodeError of kind `no-such-image` when the node does not hold it."""

    ref: str

    def command(self) -> str:
        return f"docker image inspect {shlex.quote(self.ref)}"

    def parse(self, result: Result) -> ImageBuild | NodeError:
        node = result.node
        if not result.ok and result.error in ("exit", None) and NO_SUCH_IMAGE.search(result.stderr or ""):
            return NodeError(node, "no-such-image", f"{self.ref} is not on the node",
                             f"`docker pull {self.ref}` on {node}, then run again")
        err = classify(result)
        if err:
            return err
        try:
            doc = json.loads(result.stdout)
        except ValueError:
            doc = None
        if not isinstance(doc, list) or len(doc) != 1 or not isinstance(doc[0], dict):
            return NodeError(node, "failed", f"docker image inspect {self.ref} did not print one image as JSON",
                             REMEDIES["missing-binary"])
        img = doc[0]
        layers = (img.get("RootFS") or {}).get("Layers") or []
        if not layers or not all(isinstance(x, str) and DIGEST.match(x) for x in layers):
            return NodeError(node, "failed", f"docker image inspect {self.ref} shows no RootFS.Layers (sha256 diff "
                             "ids): its content cannot be compared", "check the node's docker (`docker version`)")
        return ImageBuild(id=str(img.get("Id") or ""), repo_digests=tuple(str(d) for d in img.get("RepoDigests") or []),
                          layers=tuple(layers))
