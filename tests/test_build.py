"""`sparkfleet build` without a lab: the seed's build commands shown verbatim per rank under --dry-run (and
nothing reaching a node), bad input refused in one line, `up` refusing a lane whose engine was never built,
and the sim's zig stand-in printing what Zig's build runner prints. The lab runs are tests/test_build_lab.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkfleet.cli.main import main
from sparkfleet.sim import zig as zigsim
from tests.test_dry_run import recording_inventory
from tests.test_seed_fidelity import seeds_dir

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

STAGE = "/opt/deepseek-v4.1-tensorfold-tp4-4xgb10/TensorFold.sparkfleet-new"
# seed 002, Quick start 2, as printed (the clone's destination is the staging dir instead of ./TensorFold)
SEED = ["git clone -b deepseek-v41-zig-tp4 https://github.com/bertholomus/TensorFold",
        "git checkout 5940208",
        'git am "$REPO"/runs/2026-10-17-1017-tensorfold/patches/*.patch',
        "zig build install native -Dtarget=aarch64-linux-gnu.2.28 -Doptimize=ReleaseFast "
        "-Dnvcc=/usr/local/cuda/bin/nvcc -Dsm=121"]
REPO_ON_NODE = "/opt/dsv41-spark"  # tf1017's example for the seed's "$REPO"


def test_the_build_commands_compared_are_the_seeds_text() -> None:
    where = seeds_dir()
    if where is None:
        pytest.skip("the seed write-ups are not beside this checkout")
    text = (where / "002_4d5531930cf5f22c.txt").read_text()
    assert SEED[0] + " && cd TensorFold" in text and all(line in text for line in SEED[1:])


def events(capsys) -> list[dict]:
    return [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]


def test_dry_run_shows_the_seed_commands_on_every_rank_and_reaches_no_node(ops_root: Path, capsys) -> None:
    log = ops_root / "received.log"
    recording_inventory(ops_root, log, answer=False)
    code = main(["build", "--profile", "tf1017", "--inventory", "rec", "--root", str(ops_root), "--dry-run", "--json"])
    ev = events(capsys)
    assert code == 0
    assert not log.exists() or log.read_text() == ""  # no node received anything
    by_node: dict[str, list[tuple[str, str]]] = {}
    for e in ev:
        by_node.setdefault(e["node"], []).append((e["what"], e["command"]))
    assert sorted(by_node) == ["asusi", "bluey", "reddie", "spark4"]
    for node, ops in by_node.items():
        assert [w for w, _ in ops] == [f"build tensorfold in {STAGE}",
                                       "move the build into /opt/deepseek-v4.1-tensorfold-tp4-4xgb10/TensorFold"]
        lines = [ln.removesuffix(" || exit 1") for ln in ops[0][1].splitlines()]
        run = [ln for ln in lines if ln.startswith(("git ", "zig "))]
        want = [SEED[0] + " " + STAGE, SEED[1], SEED[2].replace('"$REPO"', REPO_ON_NODE), SEED[3]]
        assert run == want, node
        # each published command runs in the clone, after the clone's own cd, and in the seed's order
        assert lines.index(f"cd -- {STAGE}") == lines.index(run[0]) + 1
        assert ops[1][1] == ("rm -rf -- /opt/deepseek-v4.1-tensorfold-tp4-4xgb10/TensorFold.sparkfleet-old && "
                             "{ [ ! -e /opt/deepseek-v4.1-tensorfold-tp4-4xgb10/TensorFold ] || mv -- "
                             "/opt/deepseek-v4.1-tensorfold-tp4-4xgb10/TensorFold "
                             "/opt/deepseek-v4.1-tensorfold-tp4-4xgb10/TensorFold.sparkfleet-old; } && "
                             f"mv -- {STAGE} /opt/deepseek-v4.1-tensorfold-tp4-4xgb10/TensorFold && "
                             "rm -rf -- /opt/deepseek-v4.1-tensorfold-tp4-4xgb10/TensorFold.sparkfleet-old")


def test_a_lane_without_a_build_is_refused_in_one_line(capsys) -> None:
    assert main(["build", "--profile", "dcp2", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err == ("sparkfleet: profiles/spark-vllm.yaml:7: profile 'dcp2' has no build to run (engine vllm: the "
                   "engine comes in the lane's image unless the profile sets tensorfold.build)\n")  # where engine: is


def test_an_unknown_profile_is_refused_in_one_line(capsys) -> None:
    assert main(["build", "--profile", "tf9999", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tf9999" in err and "Traceback" not in err


def test_a_bad_build_option_names_file_line_and_field(ops_root: Path, capsys) -> None:
    path = ops_root / "profiles" / "tf1017.yaml"
    text = path.read_text()
    path.write_text(text.replace("-Dsm=121]", "-Dsm=121, --release]"))
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), start=1) if "--release]" in ln)
    assert main(["build", "--profile", "tf1017", "--root", str(ops_root), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"tf1017.yaml:{line}" in err and "tensorfold.build.options" in err and "'--release'" in err


def test_up_refuses_a_lane_whose_engine_was_never_built_and_starts_nothing(ops_root: Path, capsys) -> None:
    log = ops_root / "received.log"
    recording_inventory(ops_root, log, answer=False)
    code = main(["up", "--profile", "tf1017", "--inventory", "rec", "--root", str(ops_root), "--dry-run", "--json"])
    ev = events(capsys)
    assert code == 1
    step = next(e for e in ev if e["event"] == "step" and e["step"] == "engine_build" and e["status"] != "start")
    assert step["status"] == "fail"
    assert step["summary"] == "tensorfold is not built for this lane's build inputs: nothing was started"
    assert not [e for e in ev if e["event"] == "step" and e["step"].startswith("launch")]


def test_a_lane_with_its_engine_in_the_image_skips_the_step(capsys) -> None:
    assert main(["up", "--profile", "dcp2", "--inventory", "lab", "--dry-run", "--json"]) == 0
    step = next(e for e in events(capsys) if e["event"] == "step" and e["step"] == "engine_build"
                and e["status"] != "start")
    assert (step["status"], step["summary"]) == ("skip", "the lane's engine comes in its image")


# -- the sim's zig stand-in ----------------------------------------------------------------------------------

def zig(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, zigsim.__file__, *args], cwd=cwd, capture_output=True, text=True)


def source(tmp: Path, main_zig: str = "pub fn main() void {}\n") -> Path:
    from sparkfleet.sim.tfbuild import BUILD_ZIG

    (tmp / "src").mkdir(parents=True)
    (tmp / "build.zig").write_text(BUILD_ZIG)
    (tmp / "src" / "main.zig").write_text(main_zig)
    return tmp


def test_zig_standin_prints_what_the_build_runner_prints(tmp_path: Path) -> None:
    r = zig(tmp_path, "build", "install")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == ("info: initialize build.zig template file with 'zig init'\n"
                        "info: see 'zig --help' for more options\n"
                        "error: no build.zig file found, in the current directory or any parent directories\n")
    src = source(tmp_path / "a")
    r = zig(src, "build", "install", "nativ")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "no step named 'nativ'\n  access the help menu with "
                                                          "'zig build -h'\n")
    assert not (src / "zig-out").exists()
    r = zig(src, "build", "install", "native", "-Dsm=121")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")  # a successful build prints nothing
    built = (src / "zig-out" / "bin" / "tensorfold").read_bytes()
    assert built.startswith(b"#!/bin/sh\n# SIMULATION: stand-in TensorFold engine")
    other = source(tmp_path / "b")
    assert zig(other, "build", "install", "native", "-Dsm=121").returncode == 0
    assert (other / "zig-out" / "bin" / "tensorfold").read_bytes() == built  # same inputs, same bytes
    assert zig(other, "build", "install", "native", "-Dsm=120").returncode == 0
    assert (other / "zig-out" / "bin" / "tensorfold").read_bytes() != built  # another option, other bytes
    bad = source(tmp_path / "c", 'pub fn main() void {\n    @compileError("no sm121 kernel");\n}\n')
    r = zig(bad, "build", "install", "native")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "src/main.zig:2:5: error: no sm121 kernel\nBuild Summary: 0/3 steps succeeded; 1 failed\n"
    assert not (bad / "zig-out").exists()


def test_the_profiles_build_sections_load(repo_spec) -> None:
    for name in ("tf1017", "tf1017-rail2"):
        b = repo_spec.profile(name).profile.tensorfold.build
        assert b is not None and (b.branch, b.commit) == ("deepseek-v41-zig-tp4", "5940208")
    raw = yaml.safe_load((repo_spec.root / "profiles" / "tf1017.yaml").read_text())
    assert {"tensorfold.build.patches", "tensorfold.build.dir"} <= set(raw["examples"])


def test_a_build_waits_for_no_one_while_another_run_holds_the_fleet_lock(ops_root: Path, capsys, monkeypatch,
                                                                       tmp_path: Path) -> None:
    import os
    import socket

    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    log = ops_root / "received.log"
    recording_inventory(ops_root, log, answer=False)
    lock = tmp_path / "state" / "locks" / "rec.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "user": "ops",
                                "command": "sparkfleet up tf1017", "since": "2026-12-02T02:00:00+0000"}))
    assert main(["build", "--profile", "tf1017", "--inventory", "rec", "--root", str(ops_root)]) == 75
    assert "another run holds the fleet lock" in capsys.readouterr().err
    assert not log.exists() or log.read_text() == ""  # no rank was touched
    assert not (tmp_path / "state" / "builds").exists()
