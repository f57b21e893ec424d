"""Patch sets as the launch sees them: (source, target) bind mounts from a set's manifest."""

from __future__ import annotations

from pathlib import Path

import yaml

from sparkfleet.findings import Finding


def mounts_for(name: str | None, root: Path) -> tuple[list[tuple[str, str]], list[Finding]]:
    """The set's (relative source, absolute target) pairs; a set without a manifest is a warning here
    (plan still shows the lane) and a refusal at `up`."""
    if not name:
        return [], []
    manifest = root / "patches" / name / "manifest.yaml"
    if not manifest.is_file():
        return [], [Finding("patch-set", "warn", f"patch set {name!r} has no manifest ({manifest.relative_to(root)})",
                            f"build it from your files: sparkfleet patches build DIR --name {name}",
                            field="patches")]
    data = yaml.safe_load(manifest.read_text()) or {}
    return [(f["source"], f["target"]) for f in data.get("files", [])], []
