"""Setting a profile's `image.digest` in its YAML text, every other byte kept (`sparkfleet pin` writes it).

The pin goes into the lane's own profile file, where `up`, `restore` and `diff` already read `image.digest`
through the loader, and where the operator reads and reviews the lane: one line changes in `git diff`. The
file is edited as text at the positions YAML's parser reports, never dumped again: a dump would drop the
operator's comments, quoting and key order. A pins file merged by the loader was the other way; it would make
a second place a lane's pin can hide in, which `show`, reviews and the seeds' notes would all have to know.
A layout the edit cannot place a line in (flow style, a block scalar) is refused with the line to add by hand,
and the result is parsed again and must equal the old document plus the pin, or nothing is written.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from sparkfleet.schema.errors import SpecError
from sparkfleet.schema.load import Loader
from sparkfleet.schema.yamlsrc import load_text


def _key(mapping: yaml.MappingNode, name: str) -> tuple[yaml.Node, yaml.Node] | None:
    return next(((k, v) for k, v in mapping.value if isinstance(k, yaml.ScalarNode) and k.value == name), None)


def _line_end(text: str, index: int) -> int:
    """The index just past the end of the line holding `index` (its newline included; the text's end)."""
    nl = text.find("\n", index)
    return len(text) if nl < 0 else nl + 1


def set_image_digest(text: str, digest: str, file: str) -> str:
    """`text` (a profile file) with `image.digest: DIGEST`: the value replaced where the file sets one, a line
    added under `image:` where it has the block without a digest, an `image:` block appended where it has none
    (the lane inherits its ref from a base; extends merges the two). SpecError naming the file and line when the
    layout is not one of those, or the edit would change anything else."""
    by_hand = f"set it by hand: image:\\n  digest: {digest}"
    nl = "\r\n" if "\r\n" in text else "\n"
    old, marks = load_text(text, file)
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None or not isinstance(root, yaml.MappingNode) or root.flow_style:
        raise SpecError(f"a profile is a block mapping of fields: {by_hand}", file, 1)
    found = _key(root, "image")
    if found is None:
        new = text + ("" if not text or text.endswith("\n") else nl) + f"image:{nl}  digest: {digest}{nl}"
    else:
        key, image = found
        line = key.start_mark.line + 1
        if not isinstance(image, yaml.MappingNode) or image.flow_style or image.tag != "tag:yaml.org,2002:map":
            raise SpecError(f"image is not a block mapping (ref: ... on lines of their own): {by_hand}", file, line,
                            "image")
        have = _key(image, "digest")
        if have is not None:
            value = have[1]
            if not isinstance(value, yaml.ScalarNode) or value.style not in (None, "'", '"') or \
                    value.start_mark.line != value.end_mark.line:
                raise SpecError(f"image.digest is not a one-line value: {by_hand}", file,
                                value.start_mark.line + 1, "image.digest")
            new = text[:value.start_mark.index] + digest + text[value.end_mark.index:]
        else:
            k0, v0 = image.value[0]
            if not isinstance(v0, yaml.ScalarNode) or v0.style not in (None, "'", '"') or \
                    v0.start_mark.line != v0.end_mark.line:
                raise SpecError(f"image.{k0.value} is not a one-line value to add the digest under: {by_hand}",
                                file, k0.start_mark.line + 1, f"image.{k0.value}")
            at = _line_end(text, v0.end_mark.index)
            lead = "" if text[:at].endswith("\n") else nl  # the entry was the file's last line, with no newline
            new = text[:at] + lead + " " * k0.start_mark.column + f"digest: {digest}{nl}" + text[at:]
    want: dict[str, Any] = copy.deepcopy(old) if isinstance(old, dict) else {}
    image_now = want.setdefault("image", {})
    if not isinstance(image_now, dict):
        raise SpecError(f"image is not a mapping: {by_hand}", file, marks.get(("image",), (file, None))[1], "image")
    image_now["digest"] = digest
    got, _ = load_text(new, file)
    if got != want:  # a layout this edit misread: never write it
        raise SpecError(f"setting image.digest in place would change more than the pin: {by_hand}", file)
    return new


def inheritors(root: Path, lane: str, new_text: str, digest: str) -> list[str]:
    """The other profiles that `new_text` as profiles/LANE.yaml would pin too: those that extend the lane on its
    image and set no digest of their own (one naming another image does not inherit it: load.py
    _pin_follows_ref). Read from a scratch copy of profiles/, before anything is written; a profile that does not
    load is left out: it is not this pin's to judge."""
    out = []
    with tempfile.TemporaryDirectory(prefix="sparkfleet-pin-") as tmp:
        shutil.copytree(root / "profiles", Path(tmp) / "profiles")
        (Path(tmp) / "profiles" / f"{lane}.yaml").write_bytes(new_text.encode())
        before, after = Loader(root), Loader(Path(tmp))
        for name in before.profile_names():
            if name == lane:
                continue
            try:
                was, now = before.profile(name).profile.image, after.profile(name).profile.image
            except SpecError:
                continue
            if now is not None and now.digest == digest and (was is None or was.digest != digest):
                out.append(name)
    return out
