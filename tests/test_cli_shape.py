"""Lane shapes refused at `plan` (and so at check/up) with the file and line, or the -o, that set the value:
what docker or the engine would otherwise refuse only at launch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkfleet.cli.main import main

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


def _plan(capsys, *argv: str) -> tuple[int, list[dict], str]:
    code = main(["plan", *argv, "--json"])
    captured = capsys.readouterr()
    doc = json.loads(captured.out) if captured.out.startswith("{") else {}
    return code, [f for f in doc.get("findings", []) if f["status"] == "fail"], captured.err.strip()


def _shape(findings: list[dict]) -> list[tuple[str, str, str, str]]:
    return [(f["check"], f["where"], f["field"], f["message"]) for f in findings
            if f["check"] in ("lane-shape", "docker-name", "docker-mount")]


def test_dcp_that_does_not_divide_tp_names_the_o(capsys) -> None:
    code, fails, _ = _plan(capsys, "--profile", "dcp2", "-o", "dcp=3")
    assert code == 2
    assert _shape(fails) == [("lane-shape", "-o dcp=3", "dcp", "dcp 3 does not divide tp 4 (set at "
                              "profiles/spark-vllm.yaml:9): each DCP group is tp/dcp ranks")]
    assert fails[0]["remedy"] == "use a dcp that divides 4: 1, 2, 4"


def test_tp_below_the_group_names_the_nodes_it_would_drop(capsys) -> None:
    code, fails, _ = _plan(capsys, "--profile", "dcp2", "-o", "tp=3", "-o", "dcp=1")
    assert code == 2
    assert _shape(fails) == [("lane-shape", "-o tp=3", "tp", "tp 3 uses 3 of the 4 nodes of group 'sparks' "
                              "(reddie, asusi, bluey): spark4 would be left out without a word")]
    assert fails[0]["remedy"].startswith("name the nodes in rank order (ranks: [reddie, asusi, bluey])")


def test_tp3_dcp2_on_four_sparks_is_both(capsys) -> None:
    code, fails, _ = _plan(capsys, "--profile", "dcp2", "-o", "tp=3")
    assert code == 2
    assert [(c, w) for c, w, _, _ in _shape(fails)] == [("lane-shape", "profiles/dcp2.yaml:4"),
                                                       ("lane-shape", "-o tp=3")]


@pytest.mark.parametrize("lane", ["local-gemma", "llamacpp-spark", "exl3tp3"])
def test_a_lane_on_part_of_its_group_on_purpose_plans(lane: str, capsys) -> None:
    code, fails, err = _plan(capsys, "--profile", lane)
    assert code == 0 and _shape(fails) == [], err


def test_tp_too_big_blames_the_o_not_the_base_group(capsys) -> None:
    assert main(["plan", "--profile", "dcp2", "-o", "tp=5"]) == 2
    assert capsys.readouterr().err.strip() == ("sparkfleet: -o tp=5: tp: the lane needs 5 ranks (tp: 5) but group "
                                               "'sparks' has 4 node(s) (profiles/spark-vllm.yaml:8)")


def test_container_name_docker_rejects(ops_root: Path, capsys) -> None:
    (ops_root / "profiles" / "Bad Name.yaml").write_text("extends: dcp2\n")
    code, fails, _ = _plan(capsys, "--root", str(ops_root), "--profile", "Bad Name")
    assert code == 2
    assert _shape(fails) == [("docker-name", "profiles/Bad Name.yaml", "name", "container name 'sf-Bad Name-r0' "
                              "(from the profile's name 'Bad Name') is not one docker accepts: [a-zA-Z0-9][a-zA-Z0-9_.-]+")]


def test_mount_source_with_a_colon(ops_root: Path, capsys) -> None:
    (ops_root / "profiles" / "colon.yaml").write_text(
        "extends: dcp2\nmounts:\n  - {source: /nvme/a:b, target: /w}\ndocker:\n  -v: [/ok:/ok:ro, /x:/y:rx]\n")
    code, fails, _ = _plan(capsys, "--root", str(ops_root), "--profile", "colon")
    assert code == 2
    assert [(c, w, f) for c, w, f, _ in _shape(fails)] == [
        ("docker-mount", "profiles/colon.yaml:3", "mounts.0.source"),
        ("docker-mount", "profiles/colon.yaml:5", "docker.-v")]
    assert _shape(fails)[0][3] == ("mounts[0].source '/nvme/a:b': docker's -v SRC:DST[:MODE] cannot carry a path "
                                   "with ':' (nor an empty one)")
    assert _shape(fails)[1][3].startswith("docker -v '/x:/y:rx' is not SRC:DST[:MODE]")


def test_mount_source_by_o(capsys) -> None:
    code, fails, _ = _plan(capsys, "--profile", "dcp2", "-o", "mounts=[{source: '/nvme/a:b', target: /w}]")
    assert code == 2
    assert [(c, w) for c, w, _, _ in _shape(fails)] == [("docker-mount", "-o mounts=[{source: '/nvme/a:b', "
                                                         "target: /w}]")]


@pytest.mark.parametrize("name", ["../inventories/lab", "dcp2.yaml", "/etc/passwd", ".hidden"])
@pytest.mark.parametrize("verb", ["plan", "check", "up", "show"])
def test_a_profile_argument_is_a_name_never_a_path(verb: str, name: str, capsys) -> None:
    argv = [verb, name] if verb == "show" else [verb, "--profile", name]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"sparkfleet: {name!r} is not a profile name: a profile is named by its file under profiles/ without "
        ".yaml (see `sparkfleet profiles`)")
