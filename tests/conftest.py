"""Shared fixtures: the repo's ops directory, and scratch copies of it that tests may break."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkfleet.spec.load import Spec

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_spec() -> Spec:
    return Spec(REPO)


OPS_DIRS = ("inventories", "profiles", "templates", "playbooks", "patches")


def copy_ops(root: Path) -> Path:
    """A copy of the repo's ops directory (inventories, profiles, templates, playbooks, patches) at `root`."""
    for name in OPS_DIRS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name)
        else:
            (root / name).mkdir(parents=True)
    return root


@pytest.fixture
def ops_root(tmp_path: Path) -> Path:
    """A scratch copy of the repo's ops directory that a test may break."""
    return copy_ops(tmp_path / "ops")


def sim_lab(tmp_path_factory):
    """A simulated lab of the repo's `lab` inventory in a state dir of its own, for a module's tests; down after."""
    from sparkfleet.sim import lab

    state = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        s = lab.up("lab")
        try:
            yield s
        finally:
            lab.down()


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """The repo's `lab` inventory as a simulated lab, one per test module (a module may define its own)."""
    yield from sim_lab(tmp_path_factory)
