"""`sparkfleet pin --profile P`: resolve the lane's image tag to the registry digest its ranks hold, and write it
as the profile's `image.digest`, so `up`, `restore` and `diff` hold every rank to that build."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import tempfile
from pathlib import Path

from sparkfleet.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_dry_run,
    add_inventory,
    add_json,
    add_root,
    executor,
    fleet_inventory,
    out,
    print_json,
    spec,
)
from sparkfleet.schema.errors import UserError

ORDER = 32

DESCRIPTION = """Ask every rank's node for the lane's image (docker image inspect: its registry digests, id
and layers) and write the registry digest they all hold as the profile's image.digest, the pin `up`,
`restore` and `diff` read. Ranks hold the same build when their layers (RootFS.Layers) are the same;
image ids are not compared (they differ by storage driver for the same content).

Refused, with one line per rank naming its node, its digest and its layers, and nothing written, when:
a node does not hold the image or does not answer; the ranks hold different builds; no registry digest
is common to every rank (an image built or loaded locally has none).

The pin is one line in profiles/NAME.yaml (under `image:`, added if the lane inherits its image from a
base), every other byte of the file as it was. Lanes that extend this one on the same image are pinned
too (named); one that names another image.ref does not inherit the digest."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pin", help="pin a lane's image to the registry digest every rank holds (image.digest)",
                       description=DESCRIPTION,
                       epilog="examples:\n  sparkfleet pin --profile dcp2 -i lab --dry-run=facts   # show the line\n"
                       "  sparkfleet pin --profile dcp2 -i lab\n  sparkfleet up --profile dcp2 -i lab   "
                       "# fails a rank whose image is not the pinned one",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(p)
    add_inventory(p)
    add_json(p)
    p.add_argument("--profile", "-p", required=True, help="the lane whose image to pin")
    add_dry_run(p, "print the command it would run on each node; run none, write nothing; with =facts, show the "
                   "line it would write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparkfleet.checks.image import pin_verdict
    from sparkfleet.fleet.ops.base import on
    from sparkfleet.fleet.ops.image import ImageBuild, InspectImage
    from sparkfleet.placement import place
    from sparkfleet.schema import pinedit

    sp = spec(args)
    loaded = sp.profile(args.profile)
    image = loaded.profile.image
    if image is None:
        raise UserError(f"{loaded.chain[-1]}: profile {args.profile!r} names no image (image.ref): nothing to pin")
    path = sp.root / "profiles" / f"{args.profile}.yaml"
    display = loaded.chain[-1]
    text = path.read_bytes().decode()
    pinedit.set_image_digest(text, "sha256:" + "0" * 64, display)  # a layout it cannot edit: refused before any node
    inventory = fleet_inventory(sp, args.inventory)
    ranks = place(loaded, inventory)
    ex = executor(args, [r.node for r in ranks])
    inspect = InspectImage(image.ref)
    try:
        results = ex.run(on(f"inspect {image.ref}", {r.node.name: inspect for r in ranks}, 60))
    finally:
        ex.transport.close()
    if results is None:  # --dry-run: the command was shown, nothing ran
        return EXIT_OK
    answers = [(r.rank, r.node.name, inspect.parse(results[r.node.name])) for r in ranks]
    verdict = pin_verdict(image.ref, answers)
    doc = {"profile": args.profile, "ref": image.ref, "file": display, "digest": verdict.digest, "written": False,
           "dry_run": bool(args.dry_run), "refused": None if verdict.digest else verdict.reason,
           "ranks": [{"rank": rank, "node": node, **({"id": b.id, "repo_digests": list(b.repo_digests),
                                                       "layers": list(b.layers), "content": b.content}
                                                      if isinstance(b, ImageBuild) else {"error": b.message})}
                     for rank, node, b in answers], "lines": verdict.lines}
    if verdict.digest is None:
        return _refused(args, doc, f"pin refused: {verdict.reason}; nothing written", verdict.lines)
    new = pinedit.set_image_digest(text, verdict.digest, display)
    doc["also_pins"] = same = pinedit.inheritors(sp.root, args.profile, new, verdict.digest)
    change = [line for line in difflib.unified_diff(text.splitlines(), new.splitlines(), display, display, n=0,
                                                    lineterm="")][2:]
    doc["change"] = change
    if new != text and not args.dry_run:
        _write(path, new)
        doc["written"] = True
    if args.json:
        print_json(doc)
        return EXIT_OK
    for line in verdict.lines:
        out.print(line, markup=False, soft_wrap=True)
    if new == text:
        out.print(f"{display}: image.digest is already {verdict.digest}; nothing written", markup=False)
        return EXIT_OK
    out.print(f"{'would write' if args.dry_run else 'wrote'} {display}:", markup=False)
    for line in change:
        out.print(f"  {line}", markup=False, soft_wrap=True)
    if same:
        out.print(f"also pinned (they extend {args.profile} on the same image): {', '.join(same)}", markup=False)
    return EXIT_OK


def _refused(args: argparse.Namespace, doc: dict, headline: str, lines: list[str]) -> int:
    """Refused on what the fleet holds: the reason and every rank's line, exit 1, nothing written."""
    if args.json:
        print_json(doc)
        return EXIT_FAIL
    sys.stdout.flush()
    sys.stderr.write(f"sparkfleet: {headline}\n" + "".join(f"  {line}\n" for line in lines))
    return EXIT_FAIL


def _write(path: Path, text: str) -> None:
    """The file replaced whole (a reader sees the old text or the new), its mode kept."""
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
