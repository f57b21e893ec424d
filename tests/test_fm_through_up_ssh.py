"""FM-06 with the fault in the node, through `sparkfleet up` on the simulated lab (issue 39 §3).

THE LAB IS A SIMULATION (sparkfleet/sim). The check compares a digest pin with the RepoDigests the node's docker
shows; on the lab those are real only where the nodes pulled their images from the lab's registry, which the
SSH lab has as root (each node its own dockerd and network namespace, sim/registry.py), so this module runs on
`ssh_sim`; without root, on the docker shim, whose image records carry RepoDigests. `up` and its checks are the
real code. Run under the lab lock.

The fault: another build of the lane's image loaded on one node under the same tag, and the build the node had
pulled (the one the profile pins) removed, as a `docker load` and a `docker image prune` would leave it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest

from tests import cli_run
from tests.cli_run import LAB_NODES, findings, heal_and_down, lane_containers, result, run, steps

FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe"]
DCP2_IMAGE = "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2"  # profiles/production-1.2.yaml


@pytest.fixture(autouse=True)
def clean(ssh_sim, capsys):
    """The lab healed and dcp2 down afterwards."""
    yield
    heal_and_down(ssh_sim, capsys)


def up(capsys, *extra: str) -> tuple[int, list[dict]]:
    return run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST, *extra)


def _docker(sim, node: str, *argv: str) -> str:
    r = sim.exec(node, ["docker", *argv])
    assert r.returncode == 0, (argv, r.stderr.decode(errors="replace"))
    return r.stdout.decode().strip()


def pulled_digest(sim, node: str, ref: str) -> str:
    """The registry digest (sha256:...) the node's image of `ref` was pulled with: its RepoDigests."""
    if sim.docker == "daemon":
        digests = json.loads(_docker(sim, node, "image", "inspect", "-f", "{{json .RepoDigests}}", ref))
    else:
        digests = next(i["RepoDigests"] for i in json.loads((sim.state_dir(node) / "docker.json").read_text())["images"]
                       if ref in i["RepoTags"])
    [digest] = {d.partition("@")[2] for d in digests}
    return digest


@contextlib.contextmanager
def image_replaced(sim, nodes: tuple[str, ...], ref: str) -> Iterator[str]:
    """Within the block, each of `nodes` holds another build of the tag `ref` (loaded, so with no repo digest; the
    same new id on each) and the build it had pulled is gone, as after `docker load` of a rebuilt image and
    `docker image prune`. Yields the new image id. Afterwards the tag is pulled again from the lab's registry
    and the other build removed. On the shim: its image records' id and RepoDigests, put back after."""
    with contextlib.ExitStack() as stack:
        ids = {stack.enter_context(_replaced(sim, n, ref)) for n in nodes}
        [new] = ids
        yield new


@contextlib.contextmanager
def _replaced(sim, node: str, ref: str) -> Iterator[str]:
    if sim.docker != "daemon":
        path = sim.state_dir(node) / "docker.json"
        saved = path.read_bytes()
        docker = json.loads(saved)
        [image] = [i for i in docker["images"] if ref in i["RepoTags"]]
        image["Id"], image["RepoDigests"] = "sha256:" + "b" * 64, []
        path.write_text(json.dumps(docker))
        try:
            yield image["Id"]
        finally:
            path.write_bytes(saved)
        return
    old = _docker(sim, node, "image", "inspect", "-f", "{{.Id}}", ref)
    new = cli_run._repull(sim, node, ref, old)  # `docker load` of the same image rebuilt: a new id, no repo digest
    try:
        _docker(sim, node, "image", "rm", old)
        yield new
    finally:
        _docker(sim, node, "pull", ref)  # through the lab's registry (the nodes' Docker Hub mirror)
        assert _docker(sim, node, "image", "inspect", "-f", "{{.Id}}", ref) == old
        _docker(sim, node, "image", "rm", new)


@pytest.mark.parametrize("changed", [("bluey",), LAB_NODES], ids=["one-node", "every-node"])
def test_the_nodes_image_changed_under_a_pinned_digest_is_refused_before_launch(ssh_sim, capsys, changed) -> None:
    """FM-06 with the fault in the node: dcp2 pinned to the digest its nodes pulled; then the image of the tag is
    replaced by another build on one node (`drift` sees it too: its id differs from the other ranks') or on every
    node (a re-pushed tag pulled everywhere: the ranks agree, only the pin can tell). `up` stops at `check`,
    refusing each changed node by name with what it has and the pin; the other ranks hold the pinned image;
    nothing is launched on any node."""
    sim = ssh_sim
    pin = pulled_digest(sim, "reddie", DCP2_IMAGE)
    assert {pulled_digest(sim, n, DCP2_IMAGE) for n in LAB_NODES} == {pin}  # every node pulled the same build
    with image_replaced(sim, changed, DCP2_IMAGE) as new_id:
        code, events = up(capsys, "-o", f"image.digest={pin}")
    assert code == 1, result(events)
    assert result(events)["reason"].startswith("check: ")
    assert steps(events)["check"] == "fail"
    assert not [s for s in steps(events) if s.startswith("launch")]
    image = {f["node"]: f for f in findings(events, "check") if f["check"] == "image"}
    assert {n: f["status"] for n, f in image.items()} == {n: "fail" if n in changed else "ok" for n in LAB_NODES}
    for n in changed:
        assert image[n]["message"] == (f"image {DCP2_IMAGE} on rank {LAB_NODES.index(n)} ({n}) is not the pinned "
                                       f"one: it has no repo digest (built or loaded locally), the profile pins {pin}")
        assert image[n]["observed"] == f"{DCP2_IMAGE} {new_id[:19]} digests none"
        assert image[n]["expected"] == f"{DCP2_IMAGE}@{pin}"
    drift = [(f["node"], f["message"]) for f in findings(events, "check") if f["check"] == "drift"
             and f["status"] == "fail"]
    assert drift == ([] if changed == LAB_NODES else
                     [(n, f"image id {new_id[7:19]} differs from the lane's other ranks") for n in changed])
    assert {(f["node"], f["check"]) for f in findings(events, "check") if f["status"] == "fail"} == {
        *((n, "image") for n in changed), *((n, "drift") for n, _ in drift)}
    assert lane_containers(sim, "dcp2") == {n: [] for n in LAB_NODES}
