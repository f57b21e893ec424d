"""Bind mounts: every `-v SRC:DST` source of a rank's rendered launch must exist on that node.

Docker binds a missing source as a new empty directory, the container starts, and the import that
needed the file fails minutes later (CATALOG FM-12, HLT-05).
"""

from __future__ import annotations

import posixpath

from sparkfleet.findings import Finding
from sparkfleet.fleet.gather import bind_sources

from .context import CheckContext

CHECK = "mounts"


def volumes(argv: list[str], stop_at: str | None = None) -> list[tuple[str, str]]:
    """(source, target) of every `-v`/`--volume` host-path bind before `stop_at` (the image)."""
    out: list[tuple[str, str]] = []
    it = iter(argv)
    for token in it:
        if stop_at is not None and token == stop_at:
            break
        value = next(it, None) if token in ("-v", "--volume") else (
            token.split("=", 1)[1] if token.startswith("--volume=") else None)
        if value is None:
            continue
        parts = value.split(":")
        if len(parts) >= 2 and parts[0].startswith("/"):
            out.append((posixpath.normpath(parts[0]), parts[1]))
    return out


def check(ctx: CheckContext) -> list[Finding]:
    out: list[Finding] = []
    image = ctx.profile.image.pinned if ctx.profile.image else None
    engram = ctx.profile.engram.container_dir if ctx.profile.engram else None
    for r, f in ctx.ranks():
        node = r.node.name
        for launch in (x for x in ctx.plan.launches if x.node == node):
            # the node-local Engram copy is made by the playbook's engram step, after this check: the
            # storage check judges the room for it, and the engram step verifies it before the launch
            later = {src for src, dst in volumes(launch.argv, image) if dst == engram}
            sources = [s for s in bind_sources(launch.argv, image) if s not in later]
            if not sources:
                continue  # a launch without docker binds (TensorFold's serve.sh)
            missing = [s for s in sources if s in f.paths and not f.paths[s].exists]
            unasked = [s for s in sources if s not in f.paths]
            for s in missing:
                out.append(Finding(CHECK, "fail", f"bind-mount source {s} does not exist: Docker would bind an "
                                   "empty directory in its place (a missing patch file failed the import minutes "
                                   "later)",
                                   f"create or copy {s} on {node} (or fix the profile/inventory path); "
                                   "CATALOG FM-12, HLT-05", node=node, observed=f"{s}: missing",
                                   expected=f"{s} exists"))
            if unasked:
                out.append(Finding(CHECK, "warn", f"{len(unasked)} bind-mount source(s) not reported by the node: "
                                   + ", ".join(unasked), "gather facts again (`sparkfleet facts --profile ...`)",
                                   node=node, observed="not reported", expected="every -v source exists"))
            if not missing and not unasked:
                out.append(Finding(CHECK, "ok", f"all {len(sources)} bind-mount sources of rank {launch.rank} exist",
                                   node=node, observed=", ".join(sources), expected="every -v source exists"))
    return out
