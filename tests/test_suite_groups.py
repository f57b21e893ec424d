"""The suite's split (tests/conftest.py, Makefile `test`): `unit` tests run beside the lab's, in a pytest of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

INNER = '''
import pytest

pytestmark = pytest.mark.{mark}


def test_one():
    from sparkfleet.sim import lab

    lab.up("no-such-inventory")
'''


def inner_run(tmp_path: Path, mark: str) -> str:
    """The suite's conftest as a plugin over one test file of this test's own, in a pytest of its own."""
    (tmp_path / "test_inner.py").write_text(INNER.format(mark=mark))
    env = {**os.environ, "SPARKFLEET_STATE": str(tmp_path / "state")}
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
                        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), str(tmp_path / "test_inner.py")],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    return p.stdout + p.stderr


def test_a_unit_test_that_brings_up_the_lab_fails_before_the_lab_starts(tmp_path: Path) -> None:
    # the inventory does not exist, so without the guard the lab's own refusal would be the failure instead
    out = inner_run(tmp_path, "unit")
    assert "is marked unit but brings up the lab" in out, out
    assert not (tmp_path / "state" / "sim").exists()


def test_an_unmarked_test_reaches_the_lab(tmp_path: Path) -> None:
    out = inner_run(tmp_path, "nonroot")
    assert "is marked unit but brings up the lab" not in out
    assert "no-such-inventory" in out, out
