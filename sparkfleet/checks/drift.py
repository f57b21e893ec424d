"""Drift across a lane's ranks: the same image, driver, CUDA and patches everywhere; kernel, docker and clocks close.

A TP lane is one program on several machines: a rank on another image id, NVIDIA driver or patch set
computes something else (or fails NCCL registration late in a boot), so those differences fail before
launch. Where the adapter says each rank drives its own GPU (`ranks_share_driver` False: llama.cpp's
rpc-servers), a driver or CUDA difference only warns; the image still fails. A kernel update broke
RoCE registration for spark-vllm-docker users (#392) but kernels also differ harmlessly, so kernel and
docker differences warn. Clock skew is judged from each node's `collected_at` against the moment its
answer arrived here (one round trip; the transit time makes the estimate a little low): above the
inventory's `max_clock_skew_s`, logs and records stop lining up.
"""

from __future__ import annotations

import hashlib
import posixpath
import statistics
from collections import Counter
from collections.abc import Hashable

from sparkfleet.engines.registry import engine_for
from sparkfleet.findings import Finding, Status
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.placement import Rank

from .context import CheckContext, part_error, unread
from .image import normal, split_ref

CHECK = "drift"


def odd_ones(values: dict[str, Hashable]) -> set[str]:
    """The nodes whose value differs from the one most nodes hold; every node when no value has a majority."""
    counts = Counter(values.values())
    if len(counts) <= 1:
        return set()
    (top, n), (_, second) = counts.most_common(2)
    if n == second:
        return set(values)  # a tie: no side is "the lane's" value
    return {node for node, v in values.items() if v != top}


def listing(values: dict[str, object]) -> str:
    """'reddie 9000, asusi 1500, ...': each node with its value, in rank order."""
    return ", ".join(f"{node} {value if value is not None else '?'}" for node, value in values.items())


def image_id(ctx: CheckContext, f: NodeFacts) -> str | None:
    """The id of the lane's image ref on this node (None: not there; the image check says so)."""
    want = ctx.profile.image
    if want is None or f.docker is None:
        return None
    repo, tag = split_ref(want.ref)
    for img in f.docker.images:
        if split_ref(img.ref) == (normal(repo), tag):
            return img.id
    return None


def patch_hash(ctx: CheckContext, r: Rank, f: NodeFacts) -> str | None:
    """One digest of the lane's patch files as they are on this node (path and sha256 of each, or missing)."""
    name = ctx.profile.patches
    if not name:
        return None
    base = posixpath.join(r.node.storage.patch_root, name) + "/"
    mine = sorted((p[len(base):], h or "missing") for p, h in f.hashes.items() if p.startswith(base))
    if not mine:
        return None
    return hashlib.sha256("".join(f"{p} {h}\n" for p, h in mine).encode()).hexdigest()


def _short(v: str | None) -> str | None:
    if v is None:
        return None
    return v.split(":", 1)[-1][:12] if len(v) > 24 else v


# (what, status when ranks differ, how to say what to do)
ASPECTS: tuple[tuple[str, Status, str], ...] = (
    ("image id", "fail", "pull the same image on every rank (by digest: `docker pull REF@sha256:...`)"),
    ("NVIDIA driver", "fail", "install the same NVIDIA driver on every rank (nvidia-smi shows it)"),
    ("CUDA", "fail", "install the same driver/CUDA on every rank"),
    ("patch set", "fail", "push the lane's patch set to every rank again (`sparkfleet up` does) and compare"),
    ("kernel", "warn", "run one kernel release on every rank: a kernel update broke RoCE registration "
     "before (spark-vllm-docker #392)"),
    ("docker", "warn", "run one docker version on every rank"),
)
DRIVER_ASPECTS = ("NVIDIA driver", "CUDA")


def check(ctx: CheckContext) -> list[Finding]:
    ranks = list(ctx.ranks())
    if len(ctx.plan.ranks) < 2:
        return []  # one rank: nothing to compare
    seen: dict[str, dict[str, str | None]] = {what: {} for what, _, _ in ASPECTS}
    for r, f in ranks:
        name = r.node.name
        v = f.versions
        seen["image id"][name] = image_id(ctx, f)
        seen["NVIDIA driver"][name] = v.driver if v else None
        seen["CUDA"][name] = v.cuda if v else None
        seen["patch set"][name] = patch_hash(ctx, r, f)
        seen["kernel"][name] = v.kernel if v else None
        seen["docker"][name] = v.docker if v else None
    out: list[Finding] = []
    bad: dict[str, list[Finding]] = {r.node.name: [] for r, _ in ranks}
    unknown: dict[str, list[str]] = {r.node.name: [] for r, _ in ranks}
    shared = engine_for(ctx.profile.engine).ranks_share_driver
    for what, status, remedy in ASPECTS:
        if not shared and what in DRIVER_ASPECTS:
            status = "warn"  # each rank drives its own GPU: the ranks need not share a driver
        values = seen[what]
        known = {n: v for n, v in values.items() if v is not None}
        for n, v in values.items():
            # no patch hashes: a set without files (or no set); the patches step verifies presence
            if v is None and what != "patch set" and not (what == "image id" and ctx.profile.image is None):
                unknown[n].append(what)
        shown = {n: _short(v) for n, v in values.items()}
        for n in sorted(odd_ones(known), key=list(values).index):
            bad[n].append(Finding(CHECK, status, f"{what} {shown[n]} differs from the lane's other ranks",
                                  remedy, node=n, observed=listing(shown),
                                  expected=f"one {what} on every rank"))
    skew = _skew(ctx, ranks)
    for r, f in ranks:
        n = r.node.name
        out += bad[n]
        if n in skew:
            out.append(skew[n])
        # the parts the compared values come from (stack versions, image list, patch hashes)
        error = part_error(f, "versions", "nvidia-smi (versions)", "docker version", "docker images",
                           "docker image", "hashes") if unknown[n] else None
        if error:
            out.append(unread(CHECK, n, error + f" (not compared: {', '.join(unknown[n])})",
                              "the same on every rank"))
        elif unknown[n]:
            out.append(Finding(CHECK, "warn", f"not reported, not compared: {', '.join(unknown[n])}",
                               "see `sparkfleet facts --node " + n + "` (errors)", node=n,
                               observed="; ".join(f.errors) or "no value", expected="the same on every rank"))
        if not bad[n] and n not in skew and not unknown[n]:
            v = f.versions
            assert v is not None
            out.append(Finding(CHECK, "ok", "same image, driver, CUDA, patches, kernel and docker as the other ranks",
                               node=n, observed=f"kernel {v.kernel}, driver {v.driver}, CUDA {v.cuda}, docker "
                               f"{v.docker}, image {_short(seen['image id'][n])}",
                               expected="the same on every rank"))
    return out


def _skew(ctx: CheckContext, ranks: list[tuple[Rank, NodeFacts]]) -> dict[str, Finding]:
    """A warning for each node whose clock is off the lane's median by more than the bound."""
    offsets = {r.node.name: f.collected_at - f.received_at for r, f in ranks if f.received_at is not None}
    if len(offsets) < 2:
        return {}
    bound = ctx.inventory.max_clock_skew_s
    median = statistics.median(offsets.values())
    out = {}
    for n, off in offsets.items():
        if abs(off - median) > bound:
            out[n] = Finding(CHECK, "warn", f"clock {off - median:+.2f} s off the lane's other ranks",
                             "run chrony/NTP on every node (`chronyc tracking`); logs and run records stop "
                             "lining up", node=n,
                             observed=", ".join(f"{k} {v:+.2f} s" for k, v in offsets.items()) + " vs this machine",
                             expected=f"within {bound:g} s of the others (inventory max_clock_skew_s)")
    return out
