"""Bind mounts: every `-v SRC:DST` source of a rank's rendered launch must exist on that node.

Docker binds a missing source as a new empty directory, the container starts, and the import that
needed the file fails minutes later (docs/failure-modes.md FM-12; HLT-05).
"""

from __future__ import annotations

import posixpath

from sparkfleet.findings import Finding

from .context import CheckContext, part_error, unread

CHECK = "mounts"


def check(ctx: CheckContext) -> list[Finding]:
    out: list[Finding] = []
    engram = ctx.profile.engram.container_dir if ctx.profile.engram else None
    for r, f in ctx.ranks():
        node = r.node.name
        for launch in (x for x in ctx.plan.launches if x.node == node):
            # the node-local Engram copy is made by the playbook's engram step, after this check: the
            # storage check judges the room for it, and the engram step verifies it before the launch
            if launch.spec is None:
                continue  # a launch that is not a container (TensorFold's serve.sh)
            later = launch.spec.source_of(engram) if engram else None
            # files the launch itself writes first (a TensorFold rank's config.env) exist by then
            written = {posixpath.normpath(path) for path in launch.files}
            sources = [s for s in launch.spec.bind_sources if s != later and s not in written]
            if not sources:
                continue
            # a source the helper failed to look at reads as missing: it is unknown, not missing
            errors = {s: e for s in sources if s in f.paths and (e := part_error(f, f"path {s}"))}
            missing = [s for s in sources if s in f.paths and not f.paths[s].exists and s not in errors]
            unasked = [s for s in sources if s not in f.paths]
            fields = {posixpath.normpath(b.source): b.field for b in launch.spec.mounts if b.field}
            for s in missing:
                if s in fields:  # a file the profile names (a GGUF): say which field
                    out.append(Finding(CHECK, "fail", f"{fields[s]}: {s} does not exist on {node} (rank "
                                       f"{launch.rank})", f"put the file on {node}, or fix {fields[s]} / the "
                                       "node's model_root", node=node, field=fields[s], observed=f"{s}: missing",
                                       expected=f"{s} exists"))
                    continue
                out.append(Finding(CHECK, "fail", f"bind-mount source {s} does not exist: Docker would bind an "
                                   "empty directory in its place (a missing patch file failed the import minutes "
                                   "later)",
                                   f"create or copy {s} on {node} (or fix the profile/inventory path); "
                                   "docs/failure-modes.md FM-12; HLT-05", node=node, observed=f"{s}: missing",
                                   expected=f"{s} exists"))
            if unasked:
                out.append(Finding(CHECK, "warn", f"{len(unasked)} bind-mount source(s) not reported by the node: "
                                   + ", ".join(unasked), "gather facts again (`sparkfleet facts --profile ...`)",
                                   node=node, observed="not reported", expected="every -v source exists"))
            out += [unread(CHECK, node, e, f"{s} exists") for s, e in errors.items()]
            if not missing and not unasked and not errors:
                out.append(Finding(CHECK, "ok", f"all {len(sources)} bind-mount sources of rank {launch.rank} exist",
                                   node=node, observed=", ".join(sources), expected="every -v source exists"))
    return out
