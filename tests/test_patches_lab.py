"""Patch sets verified on every rank of the lab: `patches push` copies only what differs, `up` refuses a rank
whose copy differs (naming node, file, expected and found sha256) before anything starts.

THE LAB IS A SIMULATION (sparkfleet/sim): each node has its own root; the hashes are taken on the node.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from sparkfleet.cli.main import main
from sparkfleet.patches import manifest as pm
from sparkfleet.sim import lab
from tests import cli_run
from tests.conftest import REPO, engram_copies

NODES = ("reddie", "asusi", "bluey", "spark4")  # dcp2's ranks
PATCH = "var/lib/sparkfleet/patches/probe/sparkfleet_patch_probe.py"  # the inventory's patch_root, on the node


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    ops = tmp_path_factory.mktemp("ops")
    for d in ("inventories", "profiles", "templates", "playbooks", "patches"):
        shutil.copytree(REPO / d, ops / d)
    (ops / "profiles/dcp2-patched.yaml").write_text("extends: dcp2\npatches: probe\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(tmp_path_factory.mktemp("state")))
        s = lab.up("lab", ops_root=str(ops))
        try:
            engram_copies(s)
            yield ops, s
        finally:
            s.down()


def cli(capsys, *argv: str) -> tuple[int, list[dict]]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    if argv[0] == "patches":  # one JSON document
        return code, [json.loads(out)]
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")]  # up: events


def containers(sim) -> list[str]:
    """One entry per lane container on a node (any lane)."""
    return [node for node, cs in cli_run.lane_containers(sim, None, NODES).items() for _ in cs]


def test_push_copies_only_what_differs_and_up_refuses_a_rank_whose_copy_changed(ops, capsys) -> None:
    root, sim = ops
    args = ("--profile", "dcp2-patched", "--inventory", "sim", "--root", str(root))
    expected = pm.load(root, "probe").files[0].sha256
    good = (root / "patches/probe/sparkfleet_patch_probe.py").read_bytes()

    # a fresh lab holds no copy: verify names every rank, push copies to every rank and verifies after
    code, (v,) = cli(capsys, "patches", "verify", *args)
    assert code == 1 and sorted(f["node"] for f in v["findings"] if f["observed"] == "missing") == sorted(NODES)
    code, (p,) = cli(capsys, "patches", "push", *args)
    assert code == 0, p
    assert {n: s["pushed"] for n, s in p["nodes"].items()} == {n: ["sparkfleet_patch_probe.py"] for n in NODES}
    for node in NODES:
        assert (sim.root(node) / PATCH).read_bytes() == good

    # one rank's copy changed on that node only
    (sim.root("bluey") / PATCH).write_text("tampered\n")
    found = hashlib.sha256(b"tampered\n").hexdigest()
    # the rank is named with the file, the expected and the found sha256 (hashed on the node)
    code, (v,) = cli(capsys, "patches", "verify", *args)
    assert code == 1
    assert [f for f in v["findings"] if f["status"] != "ok"] == [{
        "check": "patches", "status": "fail", "node": "bluey",
        "message": f"/{PATCH}: expected sha256 {expected}, found {found}",
        "remedy": "sparkfleet patches push --profile ... (set 'probe')",
        "observed": found, "expected": expected}]
    assert v["nodes"]["bluey"]["found"] == {"sparkfleet_patch_probe.py": found}
    # up stops before launch, in the patches step (before the checks compare the ranks with each other),
    # naming node, file, expected and found sha256
    code, events = cli(capsys, "up", *args, "--gates", "models", "--poll", "0.2", "--no-probe")
    assert code == 1
    assert next(e for e in events if e["event"] == "result")["reason"] == (
        "patches: a rank lacks patch set 'probe' files: the whole launch is aborted")
    fails = [f for e in events if e["event"] == "findings" for f in e["findings"] if f["status"] == "fail"]
    assert [(f["check"], f["node"], f["message"], f["expected"], f["observed"]) for f in fails] == [
        ("patches", "bluey", f"/{PATCH}: expected sha256 {expected}, found {found}", expected, found)]
    assert [e["step"] for e in events if e["event"] == "step" and e["status"] != "start"] == [
        "stop", "drop_caches", "facts", "patches"]
    assert not [e["step"] for e in events if e["event"] == "step" and e["step"].startswith("launch:")]
    assert containers(sim) == []  # nothing was launched

    # push copies that one file to that one rank, then every rank verifies
    code, (p,) = cli(capsys, "patches", "push", *args)
    assert code == 0, p
    assert {n: s["pushed"] for n, s in p["nodes"].items()} == {
        "reddie": [], "asusi": [], "bluey": ["sparkfleet_patch_probe.py"], "spark4": []}
    assert (sim.root("bluey") / PATCH).read_bytes() == good
    assert [f["status"] for f in p["findings"]] == ["ok"] * 4


def test_a_missing_file_on_one_rank_is_named_and_up_starts_nothing(ops, capsys) -> None:
    root, sim = ops
    args = ("--profile", "dcp2-patched", "--inventory", "sim", "--root", str(root))
    assert cli(capsys, "patches", "push", *args)[0] == 0
    (sim.root("spark4") / PATCH).unlink()
    expected = pm.load(root, "probe").files[0].sha256
    code, (v,) = cli(capsys, "patches", "verify", *args)
    assert code == 1
    assert [(f["node"], f["message"], f["observed"]) for f in v["findings"] if f["status"] != "ok"] == [
        ("spark4", f"/{PATCH}: expected sha256 {expected}, found no file", "missing")]
    code, events = cli(capsys, "up", *args, "--gates", "models", "--poll", "0.2", "--no-probe")
    assert code == 1  # stopped in the patches step: no launch step began (they are launch:workers, launch:head)
    assert [e["step"] for e in events if e["event"] == "step" and e["status"] != "start"][-1] == "patches"
    assert not [e["step"] for e in events if e["event"] == "step" and e["step"].startswith("launch:")]
    fails = [f for e in events if e["event"] == "findings" for f in e["findings"] if f["status"] == "fail"]
    assert [(f["node"], f["message"]) for f in fails] == [
        ("spark4", f"/{PATCH}: expected sha256 {expected}, found no file")]
    assert containers(sim) == []
