"""The lane's chat template: pinned by sha256 and the same file on every rank (docs/failure-modes.md FM-33).

The 1017 checkpoint ships no chat template, and an encoder that drifts from DeepSeek's reference changes what
every request sends ([002], [001]). A lane that names one (`--chat-template PATH`, a path in the container) must
take it from its patch set: a patch file is pinned by sha256 in the set's manifest, `up`'s patches step verifies
it on every rank before launch, and the facts carry each rank's sha256 of it. A template bound from anywhere
else is pinned by nothing and refused; one inside the image is as pinned as the image is.
"""

from __future__ import annotations

import posixpath

from sparkfleet.engines.container import Bind
from sparkfleet.findings import Finding

from .context import CheckContext

CHECK = "chat-template"
FLAG = "--chat-template"
REF = "docs/failure-modes.md FM-33"


def covering(mounts: list[Bind], path: str) -> Bind | None:
    """The bind a container path is served from (the deepest target that holds it)."""
    best = None
    for b in mounts:
        target = posixpath.normpath(b.target)
        if (path == target or path.startswith(target.rstrip("/") + "/")) and (
                best is None or len(target) > len(posixpath.normpath(best.target))):
            best = b
    return best


def check(ctx: CheckContext) -> list[Finding]:
    p = ctx.profile
    value = p.flags.get(FLAG)
    if not isinstance(value, str) or p.engine not in ("vllm", "sglang"):
        return []
    path = posixpath.normpath(value)
    out: list[Finding] = []
    for r, f in ctx.ranks():
        node = r.node.name
        launch = ctx.launch(node)
        if launch is None or launch.spec is None:
            continue
        bind = covering(launch.spec.mounts, path)
        if bind is None:
            pinned = p.image is not None and p.image.digest is not None
            out.append(Finding(CHECK, "ok" if pinned else "warn", f"chat template {path} comes from the image"
                               + ("" if pinned else ", which is pinned only by its tag"),
                               "" if pinned else f"pin the image by digest (image.digest), or put the template in "
                               f"the lane's patch set ({REF})", node=node, field=f"flags.{FLAG}",
                               observed=f"{path}: in the image", expected="a template pinned by sha256"))
            continue
        source = posixpath.normpath(bind.source) + path[len(posixpath.normpath(bind.target)):]
        patch_base = posixpath.join(r.node.storage.patch_root, p.patches) + "/" if p.patches else None
        if patch_base is None or not source.startswith(patch_base):
            out.append(Finding(CHECK, "fail", f"chat template {path} is bound from {source} on {node}, which no "
                               "patch set pins: each rank could serve another template",
                               f"list the template in the lane's patch set (its manifest pins the sha256 and `up` "
                               f"verifies it on every rank), or take it from a digest-pinned image ({REF})",
                               node=node, field=f"flags.{FLAG}", observed=f"{path} <- {source}",
                               expected="a file of the lane's patch set"))
            continue
        digest = f.hashes.get(source)
        out.append(Finding(CHECK, "ok" if digest else "fail",
                           f"chat template {path} is {source[len(patch_base):]} of patch set {p.patches}"
                           + (f", sha256 {digest[:12]}" if digest else ", but the node could not hash it"),
                           "" if digest else f"push the lane's patch set to {node} (`sparkfleet patches push`)",
                           node=node, field=f"flags.{FLAG}", observed=f"{source}: {digest or 'not hashed'}",
                           expected="the patch set's sha256 (verified by the patches step)"))
    return out
