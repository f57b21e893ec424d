"""patches/sglang-dsv41-offloader: the patched deepseek_v4.py of seed 000's SGLang command, as a set that
verifies the file's bytes on the Station once an operator builds it from the file they hold.

The shipped sglang-dryrun mounts the file with `mounts:` (the seed's own `-v`), not this set: the seeds give
the file's target and what the patch does, never its bytes or checksum, so the shipped set is `seed_gap` and
a lane naming it would mount nothing and be refused (the plan would no longer print the seed's `-v` line).
Built from the operator's file (`patches build` reads the seed's `-v` line as mounts.txt), the set mounts
it where the seed does and `up` checks its sha256 on the rank."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from sparkfleet.cli.main import main

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

TARGET = "/sgl-workspace/sglang/python/sglang/srt/models/deepseek_v4.py"
SEED_V = f"-v /path/to/patched/deepseek_v4.py:{TARGET}:ro"  # seed 000, verbatim


def launch_argv(capsys, root: Path, profile: str) -> list[str]:
    assert main(["plan", "--profile", profile, "--json", "--root", str(root)]) == 0
    plan = json.loads(capsys.readouterr().out)
    [launch] = [s for s in plan["steps"] if s["step"] == "launch"]  # one rank on the Station
    return launch["argv"]


def test_shipped_set_is_a_seed_gap_and_the_lane_mounts_the_seeds_file_instead(repo_spec) -> None:
    raw = yaml.safe_load((repo_spec.root / "patches/sglang-dsv41-offloader/manifest.yaml").read_text())
    assert [f["target"] for f in raw["files"]] == [TARGET] and "sha256" not in raw["files"][0] and raw["seed_gap"]
    p = repo_spec.profile("sglang-dryrun").profile
    assert p.patches is None and [m.target for m in p.mounts] == [TARGET]


def test_built_from_the_operators_file_the_set_mounts_it_where_the_seed_does(ops_root: Path, tmp_path: Path,
                                                                              capsys) -> None:
    src = tmp_path / "patched"
    src.mkdir()
    (src / "deepseek_v4.py").write_bytes(b"# the operator's patched deepseek_v4.py (test bytes)\n")
    (src / "mounts.txt").write_text(SEED_V + "\n")
    assert main(["patches", "build", str(src), "--name", "sglang-dsv41-offloader", "--mounts",
                 str(src / "mounts.txt"), "--root", str(ops_root)]) == 0
    capsys.readouterr()
    manifest = yaml.safe_load((ops_root / "patches/sglang-dsv41-offloader/manifest.yaml").read_text())
    assert manifest["files"] == [{"source": "deepseek_v4.py", "target": TARGET, "sha256": hashlib.sha256(
        (src / "deepseek_v4.py").read_bytes()).hexdigest()}] and not manifest.get("seed_gap")
    (ops_root / "profiles/sglang-dryrun-verified.yaml").write_text(
        "extends: sglang-dryrun\npatches: sglang-dsv41-offloader\nmounts: []\n")
    argv = launch_argv(capsys, ops_root, "sglang-dryrun-verified")
    mounts = [argv[i + 1] for i, t in enumerate(argv) if t == "-v"]
    assert f"/var/lib/sparkfleet/patches/sglang-dsv41-offloader/deepseek_v4.py:{TARGET}:ro" in mounts
    assert [m for m in mounts if m.endswith(f"{TARGET}:ro")] == [
        f"/var/lib/sparkfleet/patches/sglang-dsv41-offloader/deepseek_v4.py:{TARGET}:ro"]  # only the set's
    # and the shipped lane is unchanged: the seed's -v with its example source
    shipped = [a for i, a in enumerate(launch_argv(capsys, ops_root, "sglang-dryrun")) if i and a.endswith(TARGET + ":ro")]
    assert shipped == [f"/home/milo/dsv41/sglang/deepseek_v4.py:{TARGET}:ro"]
