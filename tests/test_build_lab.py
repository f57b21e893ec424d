"""`sparkfleet build --profile tf1017` on the simulated lab: the seed's commands run on every rank (real git:
clone, checkout, am; the sim's zig stand-in), the built tree is moved into place and pinned only when every
rank built the same bytes; a failed build names rank and step and changes nothing; `up` and `restore` refuse a
rank whose built engine is not the pinned one.

THE LAB IS A SIMULATION (sparkfleet/sim): the TensorFold source, its patches and Zig are stand-ins
(sparkfleet/sim/tfbuild.py, sparkfleet/sim/zig.py); git, the shell and the hashing are real and run in
each node's own root.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from tests import cli_run

NODES = ("reddie", "asusi", "bluey", "spark4")  # tf1017's ranks 0..3
BUILT = "opt/deepseek-v4.1-tensorfold-tp4-4xgb10/TensorFold"  # tensorfold.build.dir, under a node's root
PATCHES = "opt/dsv41-spark/runs/2026-10-17-1017-tensorfold/patches"  # tensorfold.build.patches
FAST = ["--gates", "models", "--poll", "0.2", "--no-probe"]


def cli(capsys, *argv: str) -> tuple[int, list[dict]]:
    code = main([*argv, "--inventory", "sim", "--json"])
    out = capsys.readouterr().out
    if argv[0] == "build":
        return code, [json.loads(out)]
    return code, [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def step(events: list[dict], name: str) -> dict:
    return next(e for e in events if e["event"] == "step" and e["step"] == name and e["status"] != "start")


def pins() -> list[Path]:
    return sorted((Path(os.environ["SPARKFLEET_STATE"]) / "builds").glob("*.json"))


def lane_containers(sim) -> list[str]:
    """One entry per lane container on a node (any lane)."""
    return [node for node, cs in cli_run.lane_containers(sim, None, NODES).items() for _ in cs]


def stages(root: Path) -> list[str]:
    """What a build leaves beside the built dir when it did not finish (its stage, or the previous build)."""
    return sorted(p.name for p in (root / BUILT).parent.iterdir() if p.name.startswith("TensorFold."))


def git_log(sim, node: str) -> list[str]:
    return subprocess.run(["git", "-C", str(sim.root(node) / BUILT), "log", "--format=%s"], capture_output=True,
                          text=True, check=True).stdout.splitlines()


@pytest.fixture
def down(sim, capsys):
    yield
    main(["down", "--profile", "tf1017", "--inventory", "sim", "--json"])
    capsys.readouterr()


def test_build_pins_what_every_rank_built_and_up_serves_only_that(sim, capsys, down) -> None:
    # never built: up refuses before anything starts
    code, events = cli(capsys, "up", "--profile", "tf1017", *FAST)
    assert code == 1 and step(events, "engine_build")["status"] == "fail"
    assert lane_containers(sim) == []

    code, [doc] = cli(capsys, "build", "--profile", "tf1017")
    assert code == 0, doc
    [pin_file] = pins()
    pin = json.loads(pin_file.read_text())
    artefact = (sim.root("reddie") / BUILT / "zig-out" / "bin" / "tensorfold").read_bytes()
    assert artefact.startswith(b"#!/bin/sh\n# SIMULATION: stand-in TensorFold engine")
    assert pin["files"] == {"bin/tensorfold": hashlib.sha256(artefact).hexdigest()}
    for node in NODES:  # the same bytes on every rank, built there from the fork, the tag and the three patches
        root = sim.root(node)
        assert (root / BUILT / "zig-out" / "bin" / "tensorfold").read_bytes() == artefact
        assert git_log(sim, node) == ["SIMULATION: stand-in for engine patch 3", "SIMULATION: stand-in for engine "
                                      "patch 2", "SIMULATION: stand-in for engine patch 1",
                                      "SIMULATION: stand-in for engine commit 5940208"]
        assert stages(root) == []
        assert doc["nodes"][node] == {"ok": True, "step": None, "digest": pin["digest"], "tail": [],
                                      "seconds": doc["nodes"][node]["seconds"]}
    assert sorted(pin["nodes"]) == sorted(NODES) and pin["inputs"]["commit"] == "5940208"

    # one rank's engine changed after the build: up names it and starts nothing
    tampered = sim.root("asusi") / BUILT / "zig-out" / "bin" / "tensorfold"
    tampered.write_bytes(artefact + b"# changed\n")
    found = hashlib.sha256(tampered.read_bytes()).hexdigest()
    code, events = cli(capsys, "up", "--profile", "tf1017", *FAST)
    assert code == 1 and lane_containers(sim) == []
    fails = [f for f in next(e for e in events if e["event"] == "findings" and e["step"] == "engine_build")["findings"]
             if f["status"] == "fail"]
    assert [(f["node"], f["message"]) for f in fails] == [
        ("asusi", f"/{BUILT}/zig-out/bin/tensorfold: expected sha256 {pin['files']['bin/tensorfold']}, found {found}")]

    # built again: every rank holds the pin, and up serves it (the record says which build served)
    code, [doc] = cli(capsys, "build", "--profile", "tf1017")
    assert code == 0 and json.loads(pin_file.read_text())["digest"] == pin["digest"]
    code, events = cli(capsys, "up", "--profile", "tf1017", *FAST, "--save-as", "tfprod")
    assert code == 0, events[-1]
    assert step(events, "engine_build")["summary"] == f"tensorfold build {pin['digest'][:16]} verified on every rank"
    record = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "restore" / "tfprod.json").read_text())["record"]
    assert record["data"]["engine_build"]["digest"] == pin["digest"]
    assert {n: v["digest"] for n, v in record["data"]["engine_build"]["nodes"].items()} == {
        n: pin["digest"] for n in NODES}


def test_a_failed_build_names_rank_and_step_and_changes_nothing(sim, capsys) -> None:
    if not pins():
        assert cli(capsys, "build", "--profile", "tf1017")[0] == 0
    [pin_file] = pins()
    pin_before = pin_file.read_bytes()
    before = {n: (sim.root(n) / BUILT / "zig-out" / "bin" / "tensorfold").read_bytes() for n in NODES}
    # reddie has no recipe dir; bluey's second patch no longer applies; spark4's third adds a compile error
    recipe = sim.root("reddie") / BUILT
    recipe.parent.rename(recipe.parent.with_name("moved-away"))
    p2 = sim.root("bluey") / PATCHES / "0002-sim-stand-in-engine-patch-2.patch"
    p3 = sim.root("spark4") / PATCHES / "0003-sim-stand-in-engine-patch-3.patch"
    good2, good3 = p2.read_bytes(), p3.read_bytes()
    p2.write_bytes(good2.replace(b" pub const one = 1;", b" pub const uno = 1;"))
    p3.write_bytes(good3.replace(b"+pub const three = 3;", b'+pub const three = @compileError("no sm121 kernel");'))
    try:
        code, [doc] = cli(capsys, "build", "--profile", "tf1017")
    finally:
        recipe.parent.with_name("moved-away").rename(recipe.parent)
        p2.write_bytes(good2)
        p3.write_bytes(good3)
    assert code == 1 and doc["built"] is False and doc["pin"] is None
    assert {n: (v["ok"], v["step"]) for n, v in doc["nodes"].items()} == {
        "reddie": (False, "prepare"), "asusi": (True, None), "bluey": (False, "git am"), "spark4": (False, "zig build")}
    assert doc["nodes"]["reddie"]["tail"] == [
        "/opt/deepseek-v4.1-tensorfold-tp4-4xgb10: no such directory on this node (the parent of the build dir "
        "/opt/deepseek-v4.1-tensorfold-tp4-4xgb10/TensorFold)"]
    assert not (recipe.parent.parent / "deepseek-v4.1-tensorfold-tp4-4xgb10.sparkfleet-new").exists()
    # each failure carries the program's own words: git am's, and the zig stand-in's (Zig's build runner)
    assert "error: patch failed: src/patches.zig:1" in doc["nodes"]["bluey"]["tail"]
    assert doc["nodes"]["spark4"]["tail"][-2:] == ["src/patches.zig:5:19: error: no sm121 kernel",
                                                  "Build Summary: 0/3 steps succeeded; 1 failed"]
    fails = [(f["node"], f["message"].split(":")[0]) for f in doc["findings"]]
    assert fails == [("bluey", "git am failed"), ("reddie", "prepare failed"), ("spark4", "zig build failed")]
    # nothing half-built: no stage on any rank, every rank's previous build and the pin unchanged
    assert pin_file.read_bytes() == pin_before
    for n in NODES:
        assert stages(sim.root(n)) == []
        assert (sim.root(n) / BUILT / "zig-out" / "bin" / "tensorfold").read_bytes() == before[n]


def test_restore_refuses_a_build_other_than_the_one_it_served(sim, capsys, down) -> None:
    state = Path(os.environ["SPARKFLEET_STATE"])
    if not (state / "restore" / "tfprod.json").exists():
        assert cli(capsys, "build", "--profile", "tf1017")[0] == 0
        assert cli(capsys, "up", "--profile", "tf1017", *FAST, "--save-as", "tfprod")[0] == 0
    served = json.loads((state / "restore" / "tfprod.json").read_text())["record"]["data"]["engine_build"]["digest"]
    # every rank's third patch changed the same way: the ranks agree, the pin moves to the new build
    saved = {}
    for n in NODES:
        p3 = sim.root(n) / PATCHES / "0003-sim-stand-in-engine-patch-3.patch"
        saved[n] = p3.read_bytes()
        p3.write_bytes(saved[n].replace(b"+pub const three = 3;", b"+pub const three = 4;"))
    try:
        code, [doc] = cli(capsys, "build", "--profile", "tf1017")
        assert code == 0, doc
        [pin_file] = pins()
        now = json.loads(pin_file.read_text())["digest"]
        assert now != served
        code, events = cli(capsys, "restore", "tfprod", *FAST)
        assert code == 1 and step(events, "engine_build")["summary"] == (
            "the engine was rebuilt since the restore point: nothing was started")
        fs = next(e for e in events if e["event"] == "findings" and e["step"] == "engine_build")["findings"]
        assert [(f["observed"], f["expected"]) for f in fs] == [(now, served)]
    finally:
        for n in NODES:
            (sim.root(n) / PATCHES / "0003-sim-stand-in-engine-patch-3.patch").write_bytes(saved[n])
    assert cli(capsys, "build", "--profile", "tf1017")[0] == 0  # the served build back: restore serves it
    code, events = cli(capsys, "restore", "tfprod", *FAST)
    assert code == 0, events[-1]
    assert step(events, "engine_build")["status"] == "ok"
