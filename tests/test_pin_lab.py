"""`sparkfleet pin` on the simulated lab (issue 39 §4): the lane's tag resolved to the registry digest every rank
holds, written as the profile's image.digest; `up` then holds every rank to it.

THE LAB IS A SIMULATION (sparkfleet/sim). The SSH lab as root: each node its own dockerd, which pulled the lane's
images from the lab's registry (sim/registry.py), so RepoDigests and RootFS.Layers are the real daemon's. `pin`,
`up` and their checks are the real code, run as a user runs them, on a scratch copy of the ops directory (pin
writes its profile). Run under the lab lock.

The faults: another build of the tag (the old one plus a layer) pushed to the registry under the same tag and
pulled on one node, whose old build is then pruned (a re-pushed tag pulled on one node); and the tag re-pulled on
one node as another build of the same layers, loaded locally (tests/cli_run.repulled: a new id, no repo digest).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.opsdir import Spec
from sparkfleet.sim import registry
from tests import cli_run
from tests.cli_run import LAB_NODES, findings, heal_and_down, lane_containers, result, run, steps
from tests.conftest import copy_ops

FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe"]
IMAGE = "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2"  # dcp2's, from profiles/production-1.2.yaml
RANKS = dict(zip(LAB_NODES, range(4), strict=True))  # dcp2's rank order (its group's)


@pytest.fixture(autouse=True)
def clean(ssh_sim, capsys):
    """The lab healed and dcp2 down afterwards."""
    yield
    heal_and_down(ssh_sim, capsys)


@pytest.fixture
def ops(tmp_path: Path) -> Path:
    """A scratch copy of the ops directory: pin writes profiles/dcp2.yaml there, never in the checkout."""
    return copy_ops(tmp_path / "ops")


def _docker(sim, node: str, *argv: str) -> str:
    r = sim.exec(node, ["docker", *argv], timeout_s=180)
    assert r.returncode == 0, (node, argv, r.stderr.decode(errors="replace"))
    return r.stdout.decode().strip()


def registry_digest(sim, node: str) -> str:
    """The registry digest the node's image of the tag was pulled with (its one RepoDigest)."""
    [digest] = {d.partition("@")[2] for d in json.loads(_docker(sim, node, "image", "inspect", "-f",
                                                                "{{json .RepoDigests}}", IMAGE))}
    return digest


def pin(capsys, ops: Path, *extra: str) -> tuple[int, dict, str]:
    """`sparkfleet pin --profile dcp2 --json` on the lab: exit code, its document, what it wrote to stderr."""
    code = main(["pin", "--profile", "dcp2", "--root", str(ops), "--inventory", "sim", "--json", *extra])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def up(capsys, ops: Path) -> tuple[int, list[dict]]:
    return run(capsys, "up", "--profile", "dcp2", "--root", str(ops), "--inventory", "sim", *FAST)


@contextlib.contextmanager
def repushed(sim, node: str) -> Iterator[str]:
    """Within the block, another build of IMAGE (its old build plus a layer holding one file) is the registry's
    tag and `node` pulled it, its old build pruned; the other nodes keep theirs. Yields the new build's registry
    digest. Afterwards the old build is pushed back under the tag (from another node) and `node` pulls it again
    by its digest; the new build is removed."""
    old_id = _docker(sim, node, "image", "inspect", "-f", "{{.Id}}", IMAGE)
    old_digest = registry_digest(sim, node)
    there = f"{registry.address()}/{registry.hub_path(IMAGE)}"
    marker = sim.state_dir(node) / "repushed.txt"
    marker.write_text("another build of the tag\n")
    _docker(sim, node, "create", "--name", "sf-repushed", IMAGE)
    try:
        _docker(sim, node, "cp", f"/{marker.relative_to(sim.root(node))}", "sf-repushed:/repushed.txt")
        _docker(sim, node, "commit", "sf-repushed", there)
    finally:
        _docker(sim, node, "rm", "sf-repushed")
        marker.unlink()
    _docker(sim, node, "push", there)
    _docker(sim, node, "rmi", there)
    _docker(sim, node, "pull", IMAGE)  # through the mirror: the new build, with the registry's digest
    _docker(sim, node, "image", "rm", old_id)  # as `docker image prune` leaves it: the pinned build gone
    new_id = _docker(sim, node, "image", "inspect", "-f", "{{.Id}}", IMAGE)
    try:
        yield registry_digest(sim, node)
    finally:
        other = next(n for n in LAB_NODES if n != node)
        _docker(sim, other, "tag", IMAGE, there)
        _docker(sim, other, "push", there)
        _docker(sim, other, "rmi", there)
        repo = IMAGE.rpartition(":")[0]
        _docker(sim, node, "pull", f"{repo}@{old_digest}")
        _docker(sim, node, "tag", f"{repo}@{old_digest}", IMAGE)
        _docker(sim, node, "image", "rm", new_id)
        assert _docker(sim, node, "image", "inspect", "-f", "{{.Id}}", IMAGE) == old_id


def test_pin_writes_the_digest_every_rank_holds_and_up_holds_the_ranks_to_it(ssh_sim, capsys, ops) -> None:
    """Every node pulled the same build: `pin` writes its registry digest into dcp2's own file (one block
    appended: dcp2 inherits its image.ref from production-1.2), every other byte kept; the loader reads it; a
    second pin writes nothing; `up` passes the image check on every rank and runs `ref@digest`."""
    sim = ssh_sim
    digest = registry_digest(sim, "reddie")
    assert {registry_digest(sim, n) for n in LAB_NODES} == {digest}
    path = ops / "profiles" / "dcp2.yaml"
    before = path.read_bytes()

    code, doc, err = pin(capsys, ops, "--dry-run=facts")
    assert (code, doc["digest"], doc["written"], err) == (0, digest, False, ""), doc
    assert doc["change"] == ["@@ -15,0 +16,2 @@", "+image:", f"+  digest: {digest}"]
    assert path.read_bytes() == before

    code, doc, err = pin(capsys, ops)
    assert (code, doc["digest"], doc["written"], doc["refused"], err) == (0, digest, True, None, ""), doc
    assert [(r["rank"], r["node"]) for r in doc["ranks"]] == list(zip(range(4), LAB_NODES, strict=True))
    assert len({r["content"] for r in doc["ranks"]}) == 1
    assert path.read_bytes() == before + f"image:\n  digest: {digest}\n".encode()
    image = Spec(ops).profile("dcp2").profile.image
    assert (image.ref, image.digest) == (IMAGE, digest)
    assert doc["also_pins"] == ["dcp4"]  # extends dcp2 on its image; production-1.1 names another (no pin)
    code, doc, _ = pin(capsys, ops)
    assert (code, doc["written"]) == (0, False)

    code, events = up(capsys, ops)
    assert code == 0, cli_run.why_up_failed(sim, events, "dcp2")
    ok = sorted((f["node"], f["status"], f["message"]) for f in findings(events, "check") if f["check"] == "image")
    assert ok == sorted((n, "ok", f"image {IMAGE} present with the pinned digest") for n in LAB_NODES)
    assert {n: [c["Config"]["Image"] for c in cs] for n, cs in lane_containers(sim, "dcp2").items()} == \
        {n: [f"{IMAGE}@{digest}"] for n in LAB_NODES}


def test_a_tag_repushed_on_one_node_is_refused_by_pin_and_by_up(ssh_sim, capsys, ops) -> None:
    """dcp2 pinned; then bluey pulls another build pushed under the tag and prunes the pinned one. `pin` refuses,
    one line per rank naming node, digest and layers, and leaves the file as it was; `up` stops at `check`,
    naming bluey's rank, its digest and the pin, and launches nothing."""
    sim = ssh_sim
    path = ops / "profiles" / "dcp2.yaml"
    code, doc, _ = pin(capsys, ops)
    assert code == 0, doc
    pinned, text = doc["digest"], path.read_bytes()
    layers = {r["node"]: r["content"][7:19] for r in doc["ranks"]}
    with repushed(sim, "bluey") as new:
        assert new != pinned
        code, doc, err = pin(capsys, ops)
        assert code == 1, doc
        assert doc["refused"] == f"the ranks hold 2 different builds of {IMAGE} (their layers differ)"
        assert doc["written"] is False and path.read_bytes() == text
        code = main(["pin", "--profile", "dcp2", "--root", str(ops), "--inventory", "sim"])
        captured = capsys.readouterr()
        assert code == 1 and path.read_bytes() == text
        head, *lines = captured.err.splitlines()
        assert head == (f"sparkfleet: pin refused: the ranks hold 2 different builds of {IMAGE} (their layers "
                        "differ); nothing written")
        bluey = next(r for r in doc["ranks"] if r["node"] == "bluey")
        assert len(lines) == 4
        for n, line in zip(LAB_NODES, lines, strict=True):
            if n == "bluey":
                assert line.startswith(f"  rank 2 (bluey): {new} (layers {bluey['content'][7:19]}, id "), line
                assert line.endswith(", another build than rank 0's)"), line
                assert bluey["content"][7:19] != layers["bluey"]
            else:
                assert line.startswith(f"  rank {RANKS[n]} ({n}): {pinned} (layers {layers[n]}, id "), line
                assert "another build" not in line

        code, events = up(capsys, ops)
    assert code == 1, result(events)
    assert result(events)["reason"].startswith("check: ")
    assert not [s for s in steps(events) if s.startswith("launch")]
    image = {f["node"]: f for f in findings(events, "check") if f["check"] == "image"}
    assert {n: f["status"] for n, f in image.items()} == {n: "fail" if n == "bluey" else "ok" for n in LAB_NODES}
    assert image["bluey"]["message"] == (f"image {IMAGE} on rank 2 (bluey) is not the pinned one: it has {new}, "
                                         f"the profile pins {pinned}")
    assert lane_containers(sim, "dcp2") == {n: [] for n in LAB_NODES}


def test_a_build_loaded_on_one_node_has_no_digest_to_pin(ssh_sim, capsys, ops) -> None:
    """bluey's tag re-pulled as another build of the same layers, loaded (a new image id, no repo digest): the
    same build by content (its id differs, its layers do not, so it is not called another build), but no
    registry digest every rank holds, so `pin` refuses naming bluey, and writes nothing."""
    sim = ssh_sim
    path = ops / "profiles" / "dcp2.yaml"
    text = path.read_bytes()
    digest = registry_digest(sim, "reddie")
    with cli_run.repulled(sim, ("bluey",), IMAGE) as new_id:
        code, doc, _ = pin(capsys, ops)
    assert code == 1, doc
    assert doc["refused"] == (f"the ranks hold one build of {IMAGE} but no registry digest common to all of them "
                              "(pull it by one digest on every rank)")
    assert path.read_bytes() == text
    assert len({r["content"] for r in doc["ranks"]}) == 1
    assert {r["node"]: r["id"] == new_id for r in doc["ranks"]} == {n: n == "bluey" for n in LAB_NODES}
    assert [line.split(" (layers ")[0] for line in doc["lines"]] == [
        f"rank {RANKS[n]} ({n}): " + ("no repo digest (built or loaded locally)" if n == "bluey" else digest)
        for n in LAB_NODES]
    assert not [line for line in doc["lines"] if "another build" in line]
