"""The lane's image on every rank; with a digest pin, the node's RepoDigests must contain it (HLT-12).

A re-pushed tag silently changes the engine (FM-13: a later branch head booted and emitted one
repeated garbage token), so a pinned digest is compared, never the tag alone. An image without a pin
is said once, on the first rank that has it (every rank runs the same image), not once per rank and not
in every lane's `plan`.
"""

from __future__ import annotations

from sparkfleet.findings import Finding
from sparkfleet.fleet.nodefacts import Image

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
                out.append(Finding(CHECK, "fail", f"image {want.ref} on {node} is not the pinned one: it has "
                                   + (", ".join(have) if have else "no repo digest (built or loaded locally)")
                                   + f", the profile pins {want.digest}",
                                   f"`docker pull {want.pinned}` on {node}, or update image.digest if the new "
                                   "image is the one you mean (docs/failure-modes.md FM-13; HLT-12)", node=node,
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
                               "add image.digest (sha256:... from `docker images --digests` on the node you "
                               "trust) so a re-pushed tag cannot change the lane (docs/failure-modes.md FM-13; "
                               "HLT-12)", node=node,
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
