"""An engine built on every rank from source: what an adapter says about it (the commands, in order,
where the result goes). Running it, pinning it and checking the pin is sparkfleet/enginebuild.py's."""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass, field
from typing import Any


def stage_of(built_dir: str) -> str:
    """Where a build happens before it is moved into place: a failed build never touches the built dir."""
    return built_dir + ".sparkfleet-new"


@dataclass(frozen=True)
class BuildStep:
    """One published command of a build, by the name a failure is reported under."""

    name: str  # "git am"
    command: str  # shell text, quoted; run in the build's staging dir (after the clone's `cd`)


@dataclass(frozen=True)
class EngineBuild:
    """A build of `engine` into `dir` on every rank: `fetch` makes `stage` (clone), then `steps` run in it;
    the artefact is every file under `dir/artefact` once the stage is moved into place."""

    engine: str
    dir: str  # where the built tree lives on every node
    fetch: BuildStep  # creates the staging dir (run from its parent)
    steps: tuple[BuildStep, ...]  # run inside the staging dir, in order
    artefact: str = "zig-out"  # relative to dir: what the build installs and `up` checks by hash
    inputs: dict[str, Any] = field(default_factory=dict)  # what decides the result (the pin's key)

    @property
    def stage(self) -> str:
        return stage_of(self.dir)

    @property
    def artefact_dir(self) -> str:
        return posixpath.join(self.dir, self.artefact)

    @property
    def key(self) -> str:
        """The inputs' hash: two lanes with the same build share one pin."""
        text = json.dumps({"engine": self.engine, **self.inputs}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
