"""Patch-set manifests: build from mounts.txt, refuse bad manifests, verify local files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.patches import manifest as pm
from sparkfleet.schema.errors import SpecError
from tests.conftest import REPO

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


def test_shipped_probe_set_is_real() -> None:
    m = pm.load(REPO, "probe")
    (f,) = m.files
    data = (REPO / "patches/probe" / f.source).read_bytes()
    assert hashlib.sha256(data).hexdigest() == f.sha256
    assert pm.verify_local(REPO, m) == []


def test_build_from_mounts_txt(tmp_path: Path, ops_root: Path, capsys) -> None:
    src = tmp_path / "patch"
    (src / "common").mkdir(parents=True)
    (src / "common/engram.py").write_text("ROWS = 1\n")
    (src / "topk.py").write_text("K = 2\n")
    (src / "mounts.txt").write_text(
        "# from the seeds' launcher\n"
        f"-v {src}/common/engram.py:/usr/local/lib/python3.12/dist-packages/vllm/models/deepseek_v4_1/common/engram.py:ro\n"
        "topk.py:/usr/local/lib/python3.12/dist-packages/vllm/topk.py\n")
    assert main(["patches", "build", str(src), "--name", "mine", "--mounts", str(src / "mounts.txt"),
                 "--root", str(ops_root)]) == 0
    m = pm.load(ops_root, "mine")
    assert [(f.source, f.target, f.sha256) for f in m.files] == [
        ("common/engram.py", "/usr/local/lib/python3.12/dist-packages/vllm/models/deepseek_v4_1/common/engram.py",
         hashlib.sha256(b"ROWS = 1\n").hexdigest()),
        ("topk.py", "/usr/local/lib/python3.12/dist-packages/vllm/topk.py", hashlib.sha256(b"K = 2\n").hexdigest())]
    assert (ops_root / "patches/mine/common/engram.py").read_text() == "ROWS = 1\n"
    assert not (ops_root / "patches/mine/mounts.txt").exists()
    # a profile naming the set now renders its mounts, read-only from the node's patch_root
    (ops_root / "profiles/p.yaml").write_text("extends: dcp2\npatches: mine\n")
    assert main(["plan", "--profile", "p", "--json", "--root", str(ops_root)]) == 0
    out = capsys.readouterr().out
    assert ("/var/lib/sparkfleet/patches/mine/topk.py:/usr/local/lib/python3.12/dist-packages/vllm/topk.py:ro"
            in out)


def test_mounts_txt_bad_line(tmp_path: Path, ops_root: Path, capsys) -> None:
    src = tmp_path / "patch"
    src.mkdir()
    (src / "mounts.txt").write_text("a.py:/x\njust-a-path\n")
    assert main(["patches", "build", str(src), "--name", "m", "--mounts", str(src / "mounts.txt"),
                 "--root", str(ops_root)]) == 2
    assert capsys.readouterr().err.strip() == f"sparkfleet: {src}/mounts.txt:2: expected SOURCE:TARGET[:ro]"
    assert not (ops_root / "patches/m").exists()


def test_build_refuses_a_listed_file_that_is_missing(tmp_path: Path, ops_root: Path, capsys) -> None:
    src = tmp_path / "patch"
    src.mkdir()
    (src / "mounts.txt").write_text("gone.py:/usr/x.py\n")
    assert main(["patches", "build", str(src), "--name", "m", "--mounts", str(src / "mounts.txt"),
                 "--root", str(ops_root)]) == 2
    assert "gone.py: listed in" in capsys.readouterr().err
    assert not (ops_root / "patches/m").exists()


@pytest.mark.parametrize("entry, message", [
    ("{source: /etc/passwd, sha256: " + "a" * 64 + ", target: /x}", "files.0.source: must be a path relative"),
    ("{source: ../x.py, sha256: " + "a" * 64 + ", target: /x}", "files.0.source: must be a path relative"),
    ("{source: x.py, sha256: " + "a" * 64 + ", target: usr/x.py}", "files.0.target: must be an absolute path"),
    ("{source: x.py, sha256: abc, target: /x}", "files.0.sha256: expected 64 lowercase hex digits"),
])
def test_bad_manifests_are_refused(ops_root: Path, entry: str, message: str) -> None:
    d = ops_root / "patches/bad"
    d.mkdir()
    (d / "manifest.yaml").write_text(f"name: bad\nfiles:\n  - {entry}\n")
    with pytest.raises(SpecError) as exc:
        pm.load(ops_root, "bad")
    assert str(exc.value).startswith(f"patches/bad/manifest.yaml:3: {message}")


def test_verify_local_names_changed_and_missing_files(ops_root: Path) -> None:
    m = pm.load(ops_root, "probe")
    (ops_root / "patches/probe/sparkfleet_patch_probe.py").write_text("tampered\n")
    (f,) = pm.verify_local(ops_root, m)
    assert (f.status, f.message, f.expected) == ("fail", "sparkfleet_patch_probe.py does not match the manifest",
                                                 m.files[0].sha256)
    (ops_root / "patches/probe/sparkfleet_patch_probe.py").unlink()
    (f,) = pm.verify_local(ops_root, m)
    assert f.message == "sparkfleet_patch_probe.py is missing from patches/probe"


def test_plan_warns_for_a_set_without_manifest(ops_root: Path, capsys) -> None:
    (ops_root / "profiles/b.yaml").write_text("extends: boot10\npatches: mine\n")
    assert main(["plan", "--profile", "b", "--root", str(ops_root)]) == 0
    assert "WARN patch-set: patch set 'mine' has no manifest (patches/mine/manifest.yaml)" in capsys.readouterr().out


@pytest.mark.parametrize("profile, name", [("boot10", "vllm-lanes"), ("exl3tp3", "exl3-tp3"),
                                           ("exl3-1017-full", "exl3-1017-full"),
                                           ("production-1.0-tonyd2wild", "tonyd2wild-7"),
                                           ("production-1.0-dcp2set", "dcp2-23")])
def test_a_set_the_seeds_do_not_list_warns_mounts_nothing_and_cannot_be_pushed(capsys, profile, name) -> None:
    """Seed-gap sets (the seeds name them but give no file list or checksums): plan says nothing will be
    mounted, the argv carries no patch mount, and `patches verify` refuses (exit 2) naming the manifest."""
    assert main(["plan", "--profile", profile, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    (f,) = [f for f in plan["findings"] if f["check"] == "patch-set"]
    assert f["status"] == "warn" and f["message"].startswith(f"patch set {name!r} is not known in full: ")
    assert "nothing will be mounted, and `up` refuses the lane until the set is built" in f["message"]
    for step in plan["steps"]:
        if step["step"] == "launch":
            assert not [a for a in step["argv"] if "/patches/" in a], step["argv"]
    assert main(["patches", "verify", "--profile", profile]) == 2
    assert f"patches/{name}/manifest.yaml: the set is not known in full" in capsys.readouterr().err


def test_a_manifest_without_files_or_checksums_needs_a_seed_gap(ops_root: Path) -> None:
    d = ops_root / "patches/x"
    d.mkdir()
    (d / "manifest.yaml").write_text("name: x\nfiles: []\n")
    with pytest.raises(SpecError, match="files"):
        pm.load(ops_root, "x")
    (d / "manifest.yaml").write_text("name: x\nfiles:\n- {source: a.py, target: /a.py}\n")
    with pytest.raises(SpecError, match="a.py has no sha256"):
        pm.load(ops_root, "x")
