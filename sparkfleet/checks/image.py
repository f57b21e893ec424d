"""The lane's image on every rank; with a digest pin, the node's RepoDigests must contain it (HLT-12).

A re-pushed tag silently changes the engine (FM-13: a later branch head booted and emitted one
repeated garbage token), so a pinned digest is compared, never the tag alone. An image without a pin
is said once, on the first rank that has it (every rank runs the same image), not once per rank and not
in every lane's `plan`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.findings import Finding
from sparkfleet.fleet.nodefacts import Image
from sparkfleet.fleet.ops.base import NodeError
from sparkfleet.fleet.ops.image import ImageBuild, same_build

from .context import CheckContext, part_error, unread

CHECK = "image"


def normal(repo: str) -> str:
    """A repository as Docker stores it: no docker.io/ prefix, no library/ for official images."""
    for prefix in ("docker.io/library/", "index.docker.io/library/", "docker.io/", "index.docker.io/"):
        if repo.startswith(prefix):
            return repo[len(prefix):]
    return repo


def split_ref(ref: str) -> tuple[str, str]:
    """('repo', 'tag') of 'repo:tag' (Docker's default tag: latest); a ':' before the last '/' is a
    registry port, not a tag."""
    name = ref.partition("@")[0]
    head, sep, tag = name.rpartition(":")
    if sep and "/" not in tag:
        return normal(head), tag
    return normal(name), "latest"


def digests_of(img: Image) -> list[str]:
    return [d.partition("@")[2] for d in img.digests if "@" in d]


def check(ctx: CheckContext) -> list[Finding]:
    out: list[Finding] = []
    want = ctx.profile.image
    if want is None:  # a lane whose engine lets the profile leave it unset (the shipped llama.cpp examples)
        return [Finding(CHECK, "fail", "the lane names no image: there is nothing to run",
                        "set image.ref (and image.digest) in the profile", node=r.node.name, field="image",
                        expected="an image") for r, _ in ctx.ranks()]
    repo, tag = split_ref(want.ref)
    expected = want.pinned
    said = False  # the missing pin, said once for the image
    for r, f in ctx.ranks():
        node = r.node.name
        d = f.docker
        if d is None or not d.available:
            out.append(Finding(CHECK, "fail", "docker is not available: the image cannot be checked or run",
                               f"check the docker daemon on {node} (`systemctl status docker`)", node=node,
                               observed=(d.error if d else None) or "docker not reported", expected=expected))
            continue
        # docker answered `ps` but not `images`/`image inspect`: an empty list, not "the image is absent"
        error = part_error(f, "docker images", "docker image")
        if error:
            out.append(unread(CHECK, node, error, expected))
            continue
        by_ref = [i for i in d.images if split_ref(i.ref) == (repo, tag)]
        if want.digest:
            pinned = [i for i in d.images if any(x.partition("@")[2] == want.digest
                                                   and normal(x.partition("@")[0]) == repo for x in i.digests)]
            if pinned:
                out.append(Finding(CHECK, "ok", f"image {want.ref} present with the pinned digest", node=node,
                                   observed=f"{pinned[0].ref} {pinned[0].id[:19]}", expected=expected))
            elif by_ref:
                have = sorted({x for i in by_ref for x in digests_of(i)})
                # rank, node, what it has and the pin, in one line: an operator comparing it with `sparkfleet pin`'s
                # refusal (one line per rank) reads the same names
                out.append(Finding(CHECK, "fail", f"image {want.ref} on rank {r.rank} ({node}) is not the pinned one: "
                                   "it has "
                                   + (", ".join(have) if have else "no repo digest (built or loaded locally)")
                                   + f", the profile pins {want.digest}",
                                   f"`docker pull {want.pinned}` on {node}, or `sparkfleet pin --profile "
                                   f"{ctx.profile.name}` if the new image is the one you mean (docs/pins.md; "
                                   "docs/failure-modes.md FM-13; HLT-12)", node=node,
                                   observed=", ".join(f"{i.ref} {i.id[:19]} digests {digests_of(i) or 'none'}"
                                                      for i in by_ref), expected=expected))
            else:
                out.append(Finding(CHECK, "fail", f"image {want.pinned} is not on {node}",
                                   f"`docker pull {want.pinned}` on {node} (or `docker load` it)", node=node,
                                   observed="absent", expected=expected))
            continue
        if by_ref and not said:
            said = True
            ranks = len(ctx.plan.ranks)
            out.append(Finding(CHECK, "warn", f"image {want.ref} has no digest pin: a re-pushed tag would change "
                               + ("every rank's" if ranks > 1 else "the") + " engine unnoticed",
                               f"`sparkfleet pin --profile {ctx.profile.name}` writes image.digest from what "
                               "every rank holds, so a re-pushed tag cannot change the lane (docs/pins.md; "
                               "docs/failure-modes.md FM-13; HLT-12)", node=node,
                               field="image.digest", observed=f"{by_ref[0].ref} {by_ref[0].id[:19]}"
                               + (f" digests {digests_of(by_ref[0])}" if digests_of(by_ref[0]) else ""),
                               expected=f"{want.ref}@sha256:..."))
        elif by_ref:
            out.append(Finding(CHECK, "ok", f"image {want.ref} present (no digest pin: said once, above)", node=node,
                               observed=f"{by_ref[0].ref} {by_ref[0].id[:19]}", expected=expected))
        else:
            out.append(Finding(CHECK, "fail", f"image {want.ref} is not on {node}",
                               f"`docker pull {want.ref}` on {node} (or `docker load` it)", node=node,
                               observed="absent", expected=expected))
    return out


# -- the pin `sparkfleet pin` writes ---------------------------------------------------------------------

@dataclass(frozen=True)
class PinVerdict:
    """What every rank's node holds of the lane's image, and the digest to pin (None: refused, `reason` says
    why); `lines` names each rank, its node, its registry digest and its build (layers), one line each."""

    digest: str | None
    reason: str
    lines: list[str]


def repo_digests(ref: str, build: ImageBuild) -> list[str]:
    """The image's registry digests (sha256:...) for the ref's own repository (RepoDigests may name others)."""
    repo, _ = split_ref(ref)
    return sorted({d.partition("@")[2] for d in build.repo_digests
                   if "@" in d and normal(d.partition("@")[0]) == repo})


def pin_verdict(ref: str, answers: list[tuple[int, str, ImageBuild | NodeError]]) -> PinVerdict:
    """The digest every rank can be held to, from (rank, node, its image or why not) in rank order. Refused when
    a node does not hold the image or did not answer, when the ranks hold different builds (different layers: the
    ids are not compared, they differ by storage driver for the same content), or when no registry digest is
    common to every rank (a build loaded or built locally has none; a pin a rank lacks would fail it)."""
    builds = {rank: b for rank, _, b in answers if isinstance(b, ImageBuild)}
    first = next(iter(builds.values()), None)
    lines = []
    for rank, node, b in answers:
        if not isinstance(b, ImageBuild):
            lines.append(f"rank {rank} ({node}): {b.message}")
            continue
        have = repo_digests(ref, b)
        other = "" if first is None or same_build(b, first) else f", another build than rank {answers[0][0]}'s"
        lines.append(f"rank {rank} ({node}): {', '.join(have) or 'no repo digest (built or loaded locally)'} "
                     f"(layers {b.content[7:19]}, id {b.id.removeprefix('sha256:')[:12]}{other})")
    missing = [node for rank, node, b in answers if rank not in builds]
    if missing:
        return PinVerdict(None, f"{', '.join(missing)} did not show {ref}", lines)
    contents = {b.content for b in builds.values()}
    if len(contents) > 1:
        return PinVerdict(None, f"the ranks hold {len(contents)} different builds of {ref} (their layers differ)",
                          lines)
    common = set.intersection(*(set(repo_digests(ref, b)) for b in builds.values())) if builds else set()
    if not common:
        return PinVerdict(None, f"the ranks hold one build of {ref} but no registry digest common to all of them "
                          "(pull it by one digest on every rank)", lines)
    return PinVerdict(min(common), f"every rank holds {ref}@{min(common)}", lines)
