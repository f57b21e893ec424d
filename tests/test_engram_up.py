"""The one Engram rule through `up` on the lab: a node-local copy that is there but does not qualify stops a
lane that expects node-local rows (dcp2: expect.engram_node_local) before launch, naming node, rank and why.

THE LAB IS A SIMULATION (sparkfleet/sim): each node has its own tree; the copies' manifests are written into
the node's /nvme/engram-local as a copy leaves them. Uses the sim's fixed ports: run under the lab lock.
"""

from __future__ import annotations

import json

import pytest

from sparkfleet.cli.main import main
from sparkfleet.engram import ranges
from sparkfleet.fleet.nodeside.engram_copy import MANIFEST_SCHEMA
from sparkfleet.naming import ENGRAM_MANIFEST
from sparkfleet.spec.load import Spec
from tests.conftest import REPO

REV = "df42c109f1defefcbfcedbe7d905718a12266e40"  # dcp2's model.revision
RANK_NODE = {0: "reddie", 1: "asusi", 2: "bluey", 3: "spark4"}
ROWS = 384_000_000  # the table's rows (CATALOG ENG-01); rank r of TP4 holds its quarter
Q = ROWS // 4
UP = ["up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models", "--poll", "0.2", "--no-probe",
      "--no-fabric-probe", "--json"]


@pytest.fixture(autouse=True)
def clean(sim, capsys):
    yield
    for node in RANK_NODE.values():
        copy_path(sim, node).unlink(missing_ok=True)
    store = ranges.store_path(Spec(REPO).profile("dcp2").profile)
    store.unlink(missing_ok=True)
    main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"])
    capsys.readouterr()


def copy_path(sim, node: str):
    return sim.root(node) / "nvme/engram-local" / REV / ENGRAM_MANIFEST


def manifest(rank: int, **kw) -> dict:
    """A complete, verified rows copy of rank `rank` of TP4, as engram_copy.py writes it (its fields read here)."""
    m = {"schema": MANIFEST_SCHEMA, "complete": True, "verified": True, "mode": "rows", "format": "fp8",
         "completed_at": "2026-12-01T09:00:00+00:00", "source": {"revision": REV, "shards": []},
         "tp": {"size": 4, "rank": rank},
         "layers": {str(layer): {"start": rank * Q, "end": (rank + 1) * Q, "rows": ROWS} for layer in (1, 14)}}
    m.update(kw)
    return m


def place(sim, bad: dict) -> None:
    """Good copies on every rank but bluey (rank 2), which gets `bad`."""
    for rank, node in RANK_NODE.items():
        path = copy_path(sim, node)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(bad if rank == 2 else manifest(rank)))


def containers(sim) -> list[str]:
    out = []
    for node in RANK_NODE.values():
        docker = json.loads((sim.state_dir(node) / "docker.json").read_text())
        out += [node for c in docker["containers"] if c["Config"]["Labels"].get("sparkfleet.profile") == "dcp2"]
    return out


NFS = ": falls back to reading the model directory over NFS (6-8 ms a step against 3, CATALOG ENG-16)"


@pytest.mark.parametrize("bad, why", [
    (manifest(2, source={"revision": "1bae0e1088993b9b82de08f59de5be5a34e42170", "shards": []}),
     f"the copy is of checkpoint 1bae0e1088993b9b82de08f59de5be5a34e42170, the lane runs {REV} (CATALOG FM-62)"),
    (manifest(2, verified=False), "the copy was never verified (made with --no-verify, or its read-back failed)"),
    (manifest(2, layers={"1": {"start": 2 * Q, "end": 3 * Q, "rows": ROWS}}), "layer 14 is not in the copy"),
    (manifest(2, tp={"size": 4, "rank": 1}), "the copy holds the rows of rank 1 of TP4, this is rank 2 of TP4"),
], ids=["wrong-revision", "unverified", "missing-layer", "another-ranks-rows"])
def test_a_copy_that_does_not_qualify_stops_up_before_launch(sim, capsys, bad: dict, why: str) -> None:
    place(sim, bad)
    code = main(UP)
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert code == 1
    res = next(e for e in events if e["event"] == "result")
    assert res["reason"] == f"engram: expect.engram_node_local: rank 2 (bluey): {why}{NFS}"
    fails = [f for e in events if e["event"] == "findings" for f in e["findings"] if f["status"] == "fail"]
    assert [(f["node"], f["message"]) for f in fails] == [("bluey", f"rank 2 (bluey): {why}{NFS}")]
    ok = [f["node"] for e in events if e["event"] == "findings" and e["step"] == "engram"
          for f in e["findings"] if f["status"] == "ok"]
    assert ok == ["reddie", "asusi", "spark4"]  # the good copies qualify under the same rule
    assert "launch:workers" not in [e["step"] for e in events if e["event"] == "step"]
    assert containers(sim) == []  # nothing was started


def test_harvested_ranges_decide_the_rows_a_rank_reads(sim, capsys) -> None:
    """With the lane's harvested ranges stored, a copy holding fewer rows than its rank reads stops `up`."""
    place(sim, manifest(2))
    profile = Spec(REPO).profile("dcp2").profile
    harvest = ranges.Harvest(tp=4, ranks={r: {1: (r * Q, (r + 1) * Q), 14: (r * Q, (r + 1) * Q)} for r in range(4)},
                             profile="dcp2", revision=REV)
    harvest.ranks[2][14] = (2 * Q, 3 * Q + 1000)  # rank 2 reads 1000 rows past what its copy holds
    ranges.save(harvest, ranges.store_path(profile))
    code = main(UP)
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert code == 1
    assert next(e for e in events if e["event"] == "result")["reason"] == (
        f"engram: expect.engram_node_local: rank 2 (bluey): layer 14: the copy holds rows [{2 * Q}, {3 * Q}), the "
        f"rank reads [{2 * Q}, {3 * Q + 1000}){NFS}")
    assert containers(sim) == []


def test_check_judges_the_copies_by_the_same_rule(sim, capsys) -> None:
    place(sim, manifest(2, verified=False))
    code = main(["check", "--profile", "dcp2", "--inventory", "sim", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    copies = [(f["node"], f["status"], f["message"]) for f in doc["findings"] if f["check"] == "engram-copy"]
    assert [(n, s) for n, s, _ in copies] == [("reddie", "ok"), ("asusi", "ok"), ("bluey", "fail"), ("spark4", "ok")]
    assert copies[2][2] == ("rank 2 (bluey): the copy was never verified (made with --no-verify, or its read-back "
                            f"failed){NFS}")
