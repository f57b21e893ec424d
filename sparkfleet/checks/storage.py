"""Storage: the model dir on every rank (workers: on the NFS mount), never on CIFS/SMB (FM-44), room for
the rank's node-local Engram copy (INV-36), and the persistent cache dir (FM-29, FM-40)."""

from __future__ import annotations

import posixpath

from sparkfleet.findings import Finding
from sparkfleet.fleet.gather import model_dir
from sparkfleet.fleet.nodefacts import NodeFacts, PathInfo
from sparkfleet.placement import Rank

from .context import CheckContext, gib, part_error, unread
from .seeds import engram_copy_bytes

CHECK = "storage"
NFS = ("nfs", "nfs4")
CIFS = ("cifs", "smb3", "smbfs")


def _on(info: PathInfo) -> str:
    m = info.mount
    return f"on {m.fstype} {m.source} at {m.target}" if m else "mount unknown"


def _unasked(node: str, path: str, what: str) -> Finding:
    return Finding(CHECK, "warn", f"{what} {path} was not reported by the node", "gather facts again "
                   "(`sparkfleet facts --profile ...`); an older facts helper?", node=node, observed="not reported")


def model(ctx: CheckContext, r: Rank, f: NodeFacts) -> list[Finding]:
    node = r.node
    path = model_dir(ctx.profile, node)
    if path is None:
        return []
    info = f.paths.get(posixpath.normpath(path))
    if info is None:
        return [_unasked(node.name, path, "model dir")]
    nfs = node.storage.nfs_mount
    on_nfs = info.mount is not None and info.mount.fstype in NFS
    wants_nfs = nfs is not None and (path == nfs.path or path.startswith(nfs.path.rstrip("/") + "/"))
    expected = (f"present, on the NFS mount {nfs.path} ({nfs.source})" if wants_nfs and nfs
                else "present, on the node's local disk" if node.storage.model_local else "present")
    # the path itself unread: neither present nor missing is known; the mount table unread: the filesystem
    # it is on is not known (an empty table read as "mount unknown", ok, on a CIFS share: FM-44)
    error = part_error(f, f"path {info.path}") or (part_error(f, "mounts") if info.exists else None)
    if error:
        return [unread(CHECK, node.name, error, expected)]
    if info.mount is not None and info.mount.fstype in CIFS:
        return [Finding(CHECK, "fail", f"model dir {path} is on {info.mount.fstype}: pinned copies page-fault from "
                        "it and DSpark reads it twice; over SMB neither converges (35 min to load)",
                        f"copy the checkpoint to local NVMe on {node.name} and point model_root there "
                        "(docs/failure-modes.md FM-44; LCH-G1, HLT-15)", node=node.name, observed=_on(info),
                        expected=expected)]
    if not info.exists:
        if wants_nfs and nfs and not on_nfs and not part_error(f, "mounts"):
            return [Finding(CHECK, "fail", f"model dir {path} is missing: the NFS mount {nfs.path} is not mounted",
                            f"mount it on {node.name}: `mount {nfs.path}` (fstab: {nfs.source} {nfs.path} nfs "
                            f"{nfs.options}; nofail lets a node boot without it, INV-32)",
                            node=node.name, observed=f"missing; {nfs.path} {_on(info)}", expected=expected)]
        return [Finding(CHECK, "fail", f"model dir {path} is missing",
                        f"put the checkpoint at {path} on {node.name}, or fix model_root / the profile's "
                        "model.repo_dir", node=node.name, observed=f"missing ({_on(info)})", expected=expected)]
    if wants_nfs and nfs and not on_nfs:
        return [Finding(CHECK, "warn", f"model dir {path} exists but is not on the NFS mount of {nfs.source}",
                        f"mount {nfs.path} on {node.name} (`mount {nfs.path}`), or mark the node's copy as "
                        "local (storage.model_local) if it is one", node=node.name, observed=_on(info),
                        expected=expected)]
    return [Finding(CHECK, "ok", f"model dir {path} present", node=node.name, observed=_on(info),
                    expected=expected)]


def engram(ctx: CheckContext, r: Rank, f: NodeFacts) -> list[Finding]:
    """Room for the rank's node-local copy, where the launch mounts one (the -v onto engram.container_dir)."""
    e = ctx.profile.engram
    launch = ctx.launch(r.node.name)
    if e is None or not e.node_local or launch is None:
        return []
    copy = launch.spec.source_of(e.container_dir) if launch.spec else None
    if copy is None:
        return []  # this rank reads Engram from the model dir (engram.nfs_ranks, or no engram_local_dir)
    node = r.node.name
    info = f.paths.get(posixpath.normpath(copy))
    if info is None:
        return [_unasked(node, copy, "Engram copy dir")]
    need = engram_copy_bytes(e.format, ctx.profile.tp)
    expected = (f"room for {gib(need)} (a {e.format} rank copy at TP{ctx.profile.tp}, INV-36)" if need
                else "room for the rank's copy")
    error = part_error(f, f"path {info.path}")
    if error:
        return [unread(CHECK, node, error, expected)]
    if info.exists:
        return [Finding(CHECK, "ok", f"Engram copy dir {copy} present (`sparkfleet engram-local` verifies it)",
                        node=node, observed=f"present, {gib(info.free_bytes)} free", expected=expected)]
    if need is None:
        return [Finding(CHECK, "warn", f"Engram copy dir {copy} missing; the seeds give no copy size for "
                        f"format {e.format} at TP{ctx.profile.tp}, so free space is not judged",
                        "make the copy with `sparkfleet engram-local`", node=node,
                        observed=f"missing, {gib(info.free_bytes)} free")]
    if info.free_bytes is None:
        return [Finding(CHECK, "warn", f"Engram copy dir {copy} missing and free space unknown",
                        "check the disk holding engram_local_dir", node=node, observed="free space unknown",
                        expected=expected)]
    if info.free_bytes < need:
        # without a copy the rank reads rows over NFS: 6-8 ms a step on the workers (FM-11)
        status = "fail" if ctx.profile.expect.engram_node_local else "warn"
        return [Finding(CHECK, status, f"no room for the rank's Engram copy at {copy}: {gib(info.free_bytes)} free, "
                        f"{gib(need)} needed", f"free space on {node}'s engram_local_dir disk, or list the rank in "
                        "engram.nfs_ranks (reads over NFS cost 6-8 ms a step, docs/failure-modes.md FM-11)", node=node,
                        observed=f"missing, {gib(info.free_bytes)} free", expected=expected)]
    return [Finding(CHECK, "warn", f"the rank's Engram copy {copy} is not made yet (there is room for it)",
                    "`sparkfleet engram-local` makes it (from the ranges `sparkfleet engram-local harvest` reads "
                    "off a boot); without it the rank reads rows over NFS, 6-8 ms a step "
                    "(docs/failure-modes.md FM-11; HLT-22)",
                    node=node,
                    observed=f"missing, {gib(info.free_bytes)} free", expected=expected)]


def cache(ctx: CheckContext, r: Rank, f: NodeFacts) -> list[Finding]:
    """Free space for the persistent cache dir the launch mounts (warn only: the seeds give no size for it,
    so only a full disk is judged; a missing dir is a missing bind source, which the mounts check fails)."""
    node = r.node.name
    path = posixpath.normpath(r.node.storage.cache_dir)
    launch = ctx.launch(node)
    if launch is None or launch.spec is None or path not in launch.spec.bind_sources:
        return []  # this lane's launch does not mount the node's cache dir (TensorFold's recipe has its own)
    info = f.paths.get(path)
    error = part_error(f, f"path {path}") if info is not None else None
    if error:
        return [unread(CHECK, node, error, "free space")]
    if info is None or not info.exists:
        return []
    observed = f"{gib(info.free_bytes)} free ({_on(info)})"
    if info.free_bytes == 0:
        return [Finding(CHECK, "warn", f"the disk holding cache dir {path} is full: JIT kernels and autotune "
                        "results cannot be kept (docs/failure-modes.md FM-29, FM-40)", f"free space on {node}",
                        node=node,
                        observed=observed, expected="free space")]
    return [Finding(CHECK, "ok", f"cache dir {path} present", node=node, observed=observed,
                    expected="free space")]


def check(ctx: CheckContext) -> list[Finding]:
    out: list[Finding] = []
    for r, f in ctx.ranks():
        out += model(ctx, r, f) + engram(ctx, r, f) + cache(ctx, r, f)
    return out
