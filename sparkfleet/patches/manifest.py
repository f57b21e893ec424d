"""The patch-set manifest (`patches/NAME/manifest.yaml`): each file's source, sha256 and target.

    name: probe
    description: what the set fixes
    files:
      - source: vllm/models/engram.py        # relative to the set directory; no '..'
        sha256: 9f2c...                       # of the file's bytes
        target: /usr/local/lib/python3.12/dist-packages/vllm/models/engram.py   # absolute, in the container

A rank that lacks a file or has a different hash aborts the whole launch (docs/failure-modes.md FM-12; LCH-07):
Docker binds an empty directory over a missing source and the import fails minutes later.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path, PurePosixPath

import yaml
from pydantic import Field, field_validator, model_validator

from sparkfleet.findings import Finding
from sparkfleet.schema.base import FieldError, Strict, validate
from sparkfleet.schema.errors import SpecError, UserError
from sparkfleet.schema.yamlsrc import load_yaml

MANIFEST = "manifest.yaml"
HEX64 = re.compile(r"^[0-9a-f]{64}$")


class PatchFile(Strict):
    source: str
    sha256: str | None = None  # None only in a set whose `seed_gap` says why the checksum is unknown
    target: str

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts or not v:
            raise ValueError("must be a path relative to the patch set directory, without '..'")
        return v

    @field_validator("sha256")
    @classmethod
    def _hash(cls, v: str | None) -> str | None:
        if v is not None and not HEX64.match(v):
            raise ValueError("expected 64 lowercase hex digits")
        return v

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        if not v.startswith("/") or ".." in PurePosixPath(v).parts:
            raise ValueError("must be an absolute path inside the container, without '..'")
        return v


class PatchManifest(Strict):
    """A set whose files (or their checksums) the seeds do not give says so in `seed_gap`: it lists what is
    known, nothing of it is mounted, `plan` warns and `up` refuses until `patches build` fills it in."""

    name: str
    description: str = ""
    seed_gap: str | None = None  # why the file list or checksums are missing (quoting the seed)
    files: list[PatchFile] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known(self) -> PatchManifest:
        if self.seed_gap is None:
            if not self.files:
                raise FieldError("files", "a patch set needs at least one file (or a seed_gap saying why not)")
            unsummed = [f.source for f in self.files if f.sha256 is None]
            if unsummed:
                raise FieldError("files", f"{unsummed[0]} has no sha256 (only a set with a seed_gap may lack one)")
        return self

    @property
    def complete(self) -> bool:
        """Every file is known and pinned: the set can be mounted and verified."""
        return self.seed_gap is None

    def mounts(self) -> list[tuple[str, str]]:
        return [(f.source, f.target) for f in self.files] if self.complete else []


def set_dir(root: Path, name: str) -> Path:
    return root / "patches" / name


def load(root: Path, name: str) -> PatchManifest:
    """Load and validate a set's manifest; SpecError names the file and line."""
    path = set_dir(root, name) / MANIFEST
    display = f"patches/{name}/{MANIFEST}"
    data, marks = load_yaml(path, display)
    manifest = validate(PatchManifest, data, marks, display)
    seen: set[str] = set()
    for i, f in enumerate(manifest.files):
        if f.target in seen:
            _, line = marks.get(("files", i), (None, None))
            raise SpecError(f"target {f.target} appears twice", display, line, f"files.{i}.target")
        seen.add(f.target)
    return manifest


def mounts_for(name: str | None, root: Path) -> tuple[list[tuple[str, str]], list[Finding]]:
    """(source, target) pairs for the launch; a set without a manifest is a warning for `plan`
    (it still shows the lane) and a refusal for `up`."""
    if not name:
        return [], []
    if not (set_dir(root, name) / MANIFEST).is_file():
        return [], [Finding("patch-set", "warn", f"patch set {name!r} has no manifest (patches/{name}/{MANIFEST})",
                            f"build it from your files: sparkfleet patches build DIR --name {name}",
                            field="patches")]
    manifest = load(root, name)
    if not manifest.complete:
        return [], [Finding("patch-set", "warn", f"patch set {name!r} is not known in full: {manifest.seed_gap}; "
                            "nothing will be mounted, and `up` refuses the lane until the set is built",
                            f"build it from your files: sparkfleet patches build DIR --name {name} "
                            "--mounts mounts.txt", field="patches")]
    return manifest.mounts(), []


def refusals(root: Path, name: str | None) -> list[Finding]:
    """Why `up` refuses the lane's patch set before touching a node (none: the set can be pushed and verified):
    no manifest, a set the seeds do not list in full (`seed_gap`), or set files that differ from the manifest.
    The same conditions, in the same order, as `up`'s patches step."""
    if not name:
        return []
    if not (set_dir(root, name) / MANIFEST).is_file():
        return [Finding("patches", "fail", f"patches/{name}/{MANIFEST} does not exist",
                        f"sparkfleet patches build DIR --name {name}", observed="has no manifest")]
    manifest = load(root, name)
    if not manifest.complete:
        return [Finding("patches", "fail", f"patches/{name}/{MANIFEST}: {manifest.seed_gap}",
                        f"sparkfleet patches build DIR --name {name} --mounts mounts.txt",
                        observed="is not known in full (the seeds do not list its files or checksums)")]
    return verify_local(root, manifest)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_mounts_txt(text: str, origin: str) -> list[tuple[str, str]]:
    """The seeds' mounts.txt: one `SOURCE:TARGET[:ro]` per line (optionally prefixed `-v `), # comments."""
    pairs = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-v "):
            line = line[3:].strip()
        parts = line.split(":")
        if parts[-1] in ("ro", "rw"):
            parts = parts[:-1]
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise SpecError("expected SOURCE:TARGET[:ro]", origin, n)
        pairs.append((parts[0], parts[1]))
    return pairs


def build(src_dir: Path, root: Path, name: str, mounts_txt: Path | None = None,
          target_prefix: str | None = None) -> tuple[Path, PatchManifest]:
    """Copy a directory of patch files into `patches/NAME/` and write its manifest.

    Targets come from mounts.txt, or are `target_prefix/<relative path>` for every file."""
    if not src_dir.is_dir():
        raise UserError(f"{src_dir}: not a directory")
    if mounts_txt is not None:
        pairs = parse_mounts_txt(mounts_txt.read_text(), str(mounts_txt))
        entries = []
        for source, target in pairs:
            rel = Path(source)
            if rel.is_absolute():  # the seeds' mounts.txt names host paths; keep the part under src_dir
                try:
                    rel = rel.relative_to(src_dir.resolve())
                except ValueError:
                    rel = Path(rel.name)
            entries.append((rel.as_posix(), target))
    elif target_prefix:
        rels = [p.relative_to(src_dir).as_posix() for p in sorted(src_dir.rglob("*"))
                if p.is_file() and p.name != MANIFEST]
        entries = [(rel, f"{target_prefix.rstrip('/')}/{rel}") for rel in rels]
    else:
        raise UserError("give --mounts mounts.txt or --target-prefix DIR so every file has a target")
    dest = set_dir(root, name)
    files = []
    for rel, target in entries:
        src = src_dir / rel
        if not src.is_file():
            raise UserError(f"{src}: listed in {mounts_txt or 'the set'} but not a file in {src_dir}")
        files.append({"source": rel, "sha256": sha256_file(src), "target": target})
    manifest = validate(PatchManifest, {"name": name, "files": files}, {}, f"patches/{name}/{MANIFEST}")
    staging = dest.with_name(f".{name}.building")
    shutil.rmtree(staging, ignore_errors=True)
    for f in manifest.files:
        out = staging / f.source
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src_dir / f.source, out)
        if sha256_file(out) != f.sha256:  # the source changed under us
            shutil.rmtree(staging)
            raise UserError(f"{src_dir / f.source}: changed while copying; run build again")
    (staging / MANIFEST).write_text(yaml.safe_dump(manifest.model_dump(), sort_keys=False))
    if dest.exists():
        shutil.rmtree(dest)
    staging.rename(dest)  # the set appears whole or not at all
    return dest, manifest


def verify_local(root: Path, manifest: PatchManifest) -> list[Finding]:
    """The set's own files against its manifest (before pushing anything)."""
    out = []
    base = set_dir(root, manifest.name)
    for f in manifest.files:
        path = base / f.source
        if not path.is_file():
            out.append(Finding("patch-file", "fail", f"{f.source} is missing from patches/{manifest.name}",
                               "restore the file or rebuild the set", observed="missing", expected=f.sha256))
        elif (got := sha256_file(path)) != f.sha256:
            out.append(Finding("patch-file", "fail", f"{f.source} does not match the manifest",
                               "rebuild the set if the change is intended", observed=got, expected=f.sha256))
    return out
