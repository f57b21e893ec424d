"""Fleet mode end to end on simulated nodes (local transport): the helper is shipped and run per node in
parallel, progress comes back per node, and each rank's manifest is checked against the lane."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.engines.base import LaneContext
from sparkfleet.engines.docker import engram_host_dir
from sparkfleet.engram import fleet
from sparkfleet.engram import ranges as rng
from sparkfleet.engram.safetensors import make_checkpoint
from sparkfleet.fleet.connect import transport_for
from sparkfleet.fleet.nodeside import engram_copy as ec
from sparkfleet.opsdir import Spec
from sparkfleet.placement import place
from tests.noderoot import write_wrapper

REV = "1bae0e1088993b9b82de08f59de5be5a34e42170"
ROWS = 4096
NODES = ["alpha", "beta"]
RANGES = {0: {1: (0, 2048), 14: (0, 2048)}, 1: {1: (2048, 4096), 14: (2048, 4096)}}

INVENTORY = """\
name: sim
nodes:
{nodes}
groups:
  pair: [{names}]
"""
NODE = """\
  {name}:
    ssh: {{host: 127.0.0.1}}
    hardware: gb10
    transport: local
    wrapper: [{wrapper}]
    storage:
      model_root: /models
      engram_local_dir: /nvme/engram-local
      cache_dir: /nvme/cache
"""
PROFILE = """\
engine: vllm
image: {{ref: "local/vllm:test"}}
model: {{repo_dir: models--t--ckpt, revision: {rev}}}
group: pair
tp: 2
port: 8000
engram:
  mode: disk
  format: {fmt}
  layers: [1, 14]
  shards: [47, 48]
  node_local: true
  tensor_pattern: "model.layers.{{layer}}.engram.*"
"""


@pytest.fixture
def lab(tmp_path: Path, monkeypatch) -> dict:
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    ops = tmp_path / "ops"
    (ops / "inventories").mkdir(parents=True)
    (ops / "profiles").mkdir()
    ck = make_checkpoint(tmp_path / "checkpoint", rows=ROWS).root
    roots = {}
    for name in NODES:
        root = tmp_path / "nodes" / name
        snap = root / "models" / "models--t--ckpt" / "snapshots"
        snap.mkdir(parents=True)
        (snap / REV).symlink_to(ck)  # as an HF cache links a snapshot to its blobs
        (root / "home").mkdir()
        (root / "nvme").mkdir()
        roots[name] = root
    (ops / "inventories" / "sim.yaml").write_text(INVENTORY.format(
        nodes="".join(NODE.format(name=n, wrapper=write_wrapper(roots[n], tmp_path / f"enter-{n}", extra=[ck]))
                      for n in NODES), names=", ".join(NODES)))
    (ops / "profiles" / "lane.yaml").write_text(PROFILE.format(rev=REV, fmt="fp8"))
    (ops / "profiles" / "lane-nvfp4.yaml").write_text(PROFILE.format(rev=REV, fmt="nvfp4"))
    harvest = rng.Harvest(tp=2, ranks=RANGES, nodes=dict(enumerate(NODES)))
    rng.save(harvest, tmp_path / "ranges.json")
    return {"ops": ops, "roots": roots, "ck": ck, "ranges": tmp_path / "ranges.json"}


def cli(lab: dict, *extra: str, profile: str = "lane") -> list[str]:
    return ["engram-local", "--root", str(lab["ops"]), "-i", "sim", "--profile", profile, "--ranges",
            str(lab["ranges"]), *extra]


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def dest(lab: dict, node: str) -> Path:
    return lab["roots"][node] / "nvme" / "engram-local" / REV


def test_fleet_copies_every_rank_on_its_node_and_checks_the_manifests(lab: dict, capsys) -> None:
    assert main(cli(lab, "--json")) == 0
    summary = last_json(capsys)
    assert summary["nfs_ranks"] == []
    assert [c["node"] for c in summary["copies"]] == NODES and all(c["ok"] for c in summary["copies"])
    ok = [f for f in summary["findings"] if f["status"] == "ok"]
    assert [f["node"] for f in ok] == NODES
    for rank, node in enumerate(NODES):
        m = json.loads((dest(lab, node) / ec.MANIFEST).read_text())
        assert m["tp"] == {"size": 2, "rank": rank} and m["source"]["revision"] == REV and m["verified"]
        assert {k: (v["start"], v["end"]) for k, v in m["layers"].items()} == {str(k): v for k, v in RANGES[rank].items()}
        assert m["source"]["path"] == f"/models/models--t--ckpt/snapshots/{REV}"  # the node's path, not the sandbox's
        assert ec.verify(str(dest(lab, node)), str(lab["ck"]))["ok"]
        assert (lab["roots"][node] / "home" / ".cache" / "sparkfleet" / "bin" / "engram_copy.py").is_file()
    # a second run finds both copies complete and copies nothing
    assert main(cli(lab, "--json")) == 0
    again = last_json(capsys)
    assert all(c["result"]["already_complete"] for c in again["copies"])
    # a lane that reads NVFP4 tables finds fp8 copies (docs/failure-modes.md FM-24): both ranks fall back to NFS
    assert main(cli(lab, profile="lane-nvfp4")) == 1
    text = capsys.readouterr().out
    assert "the copy holds fp8 Engram tables, the lane reads nvfp4" in text
    assert "ranks reading Engram rows over NFS at launch: 0, 1" in text


def test_the_copy_dir_is_the_one_the_launch_mounts(lab: dict) -> None:
    sp = Spec(lab["ops"])
    loaded, inventory = sp.profile("lane"), sp.inventory("sim")
    ranks = place(loaded, inventory)
    ctx = LaneContext(loaded.profile, inventory, ranks, template_dir=Path("."))
    for r in ranks:
        assert fleet.copy_dir(loaded.profile, r.node) == engram_host_dir(ctx, r)


def test_one_node_and_a_failing_node(lab: dict, capsys) -> None:
    assert main(cli(lab, "--node", "beta", "--json")) == 0
    assert [c["node"] for c in last_json(capsys)["copies"]] == ["beta"]
    assert not dest(lab, "alpha").exists()
    os.unlink(lab["roots"]["alpha"] / "models" / "models--t--ckpt" / "snapshots" / REV)
    assert main(cli(lab, "--json")) == 1
    summary = last_json(capsys)
    alpha = next(c for c in summary["copies"] if c["node"] == "alpha")
    assert not alpha["ok"] and f"/models/models--t--ckpt/snapshots/{REV}: no such checkpoint directory" in alpha["error"]
    assert summary["nfs_ranks"] == [0]


def test_whole_shards(lab: dict, capsys) -> None:
    assert main(cli(lab, "--whole-shards", "--json")) == 0
    summary = last_json(capsys)
    assert summary["nfs_ranks"] == []
    for node in NODES:
        for name in ("model-00047-of-00048.safetensors", "model-00048-of-00048.safetensors"):
            assert (dest(lab, node) / name).read_bytes() == (lab["ck"] / name).read_bytes()
        assert json.loads((dest(lab, node) / ec.MANIFEST).read_text())["mode"] == "whole-shards"


def test_progress_lines_come_from_each_node_while_it_copies(lab: dict, monkeypatch) -> None:
    for n in NODES:  # ~3 s a node: seen even on a busy machine (the fault is the node's own environment)
        write_wrapper(lab["roots"][n], lab["roots"][n].parent.parent / f"enter-{n}", extra=[lab["ck"]],
                      env={"SPARKFLEET_ENGRAM_FAULT": "sleep_per_chunk=0.1"})
    sp = Spec(lab["ops"])
    loaded = sp.profile("lane")
    ranks = place(loaded, sp.inventory("sim"))
    harvest = rng.Harvest(tp=2, ranks=RANGES)
    jobs, findings = fleet.plan_jobs(loaded.profile, ranks, harvest=harvest, pattern=loaded.profile.engram.tensor_pattern,
                                     whole_shards=False)
    assert not findings
    for j in jobs:  # small chunks: a copy that lasts long enough to be watched
        j.request.update(chunk_bytes=32 * 1024, window_bytes=32 * 1024)
    seen: list[tuple[str, str]] = []
    transport = transport_for([j.node for j in jobs])
    results = fleet.run_copies(transport, jobs, on_progress=lambda j, e: seen.append((j.node.name, e["event"])),
                               poll_s=0.1)
    assert all(r.ok for r, _ in results.values())
    for node in NODES:
        events = [e for n, e in seen if n == node]
        assert "progress" in events and events[-1] == "done"
