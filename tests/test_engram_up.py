"""The one Engram rule through `up` on the lab: in a lane that expects node-local rows (dcp2:
expect.engram_node_local), a rank without a qualifying copy (none at all, or one that is there but does not
qualify) stops `up` before launch, naming node, rank and why; the operator's path (boot reading NFS on purpose,
harvest, copy, boot again) ends with every rank node-local.

THE LAB IS A SIMULATION (sparkfleet/sim): each node has its own tree and holds a stand-in checkpoint; the copies
are made by the real copier (conftest.engram_copies, or `sparkfleet engram-local` itself) and the sim engine
reads them. Uses the sim's fixed ports: run under the lab lock.
"""

from __future__ import annotations

import json
import shutil

import pytest

from sparkfleet.cli.main import main
from sparkfleet.engram import ranges
from sparkfleet.naming import ENGRAM_MANIFEST
from sparkfleet.opsdir import Spec
from sparkfleet.sim import values
from tests import cli_run
from tests.conftest import REPO, engram_copies

REV = "df42c109f1defefcbfcedbe7d905718a12266e40"  # dcp2's model.revision
RANK_NODE = {0: "reddie", 1: "asusi", 2: "bluey", 3: "spark4"}
Q = values.ENGRAM_STANDIN_ROWS // 4  # the lab checkpoint's tables: rank r of TP4 reads rows [r Q, (r + 1) Q)
FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe", "--json"]
UP = ["up", "--profile", "dcp2", "--inventory", "sim", *FAST]
NFS = ": falls back to reading the model directory over NFS (6-8 ms a step against 3, ENG-16)"
REMEDY = ("make the copies: boot once reading NFS on purpose (sparkfleet up --profile dcp2 "
          "-o expect.engram_node_local=false), then sparkfleet engram-local harvest --profile dcp2 and "
          "sparkfleet engram-local --profile dcp2 --tensors PATTERN; or keep serving from NFS with that -o")
NO_COPY = "no engram-manifest.json: the copy is missing or incomplete"


@pytest.fixture(autouse=True)
def clean(sim, capsys):
    yield
    store = ranges.store_path(Spec(REPO).profile("dcp2").profile)
    store.unlink(missing_ok=True)
    main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"])
    for node in RANK_NODE.values():  # a test's broken copy goes; the real copier makes a good one again
        m = copy_dir(sim, node) / ENGRAM_MANIFEST
        if m.is_file() and json.loads(m.read_text()).get("test-broken"):
            shutil.rmtree(copy_dir(sim, node))
    engram_copies(sim)
    capsys.readouterr()


def copy_dir(sim, node: str):
    return sim.root(node) / "nvme/engram-local" / REV


def events(capsys) -> list[dict]:
    return [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]


def result(evs: list[dict]) -> dict:
    return next(e for e in evs if e["event"] == "result")


def step_findings(evs: list[dict], step: str) -> list[dict]:
    return [f for e in evs if e["event"] == "findings" and e["step"] == step for f in e["findings"]]


def break_copy(sim, node: str, **fields) -> None:
    """The real copy's manifest on `node` with `fields` changed (None deletes one), marked for the clean-up."""
    path = copy_dir(sim, node) / ENGRAM_MANIFEST
    m = json.loads(path.read_text())
    for k, v in fields.items():
        if v is None:
            m.pop(k, None)
        else:
            m[k] = v
    m["test-broken"] = True
    path.write_text(json.dumps(m))


def containers(sim, lane: str = "dcp2") -> dict[str, list[str]]:
    """node -> the lane's containers in the node's docker state (ids)."""
    return {node: [c["Id"] for c in cs] for node, cs in
            cli_run.lane_containers(sim, lane, ("reddie", "asusi", "bluey", "spark4", "station")).items()}


def fails_before_launch(evs: list[dict], node: str, rank: int, why: str) -> None:
    """`up` stopped at its engram step naming this rank alone; the other copies qualified; nothing launched."""
    assert result(evs)["reason"] == f"engram: expect.engram_node_local: rank {rank} ({node}): {why}{NFS}"
    fails = [f for e in evs if e["event"] == "findings" for f in e["findings"] if f["status"] == "fail"]
    assert [(f["node"], f["message"]) for f in fails] == [(node, f"rank {rank} ({node}): {why}{NFS}")]
    ok = [f["node"] for f in step_findings(evs, "engram") if f["status"] == "ok"]
    assert ok == [n for n in RANK_NODE.values() if n != node]  # the good copies qualify under the same rule
    assert not [e for e in evs if e["event"] == "step" and e["step"].startswith("launch")]


@pytest.mark.parametrize("bad, why", [
    ({"source": {"revision": "1bae0e1088993b9b82de08f59de5be5a34e42170", "shards": []}},
     f"the copy is of checkpoint 1bae0e1088993b9b82de08f59de5be5a34e42170, the lane runs {REV} (docs/failure-modes.md FM-62)"),
    ({"verified": False}, "the copy was never verified (made with --no-verify, or its read-back failed)"),
    ({"layers": {"1": {"start": 2 * Q, "end": 3 * Q, "rows": 4 * Q}}}, "layer 14 is not in the copy"),
    ({"tp": {"size": 4, "rank": 1}}, "the copy holds the rows of rank 1 of TP4, this is rank 2 of TP4"),
], ids=["wrong-revision", "unverified", "missing-layer", "another-ranks-rows"])
def test_a_copy_that_does_not_qualify_stops_up_before_launch(sim, capsys, bad: dict, why: str) -> None:
    break_copy(sim, "bluey", **bad)
    assert main(UP) == 1
    fails_before_launch(events(capsys), "bluey", 2, why)
    assert containers(sim)["bluey"] == [] and not any(containers(sim).values())  # nothing was started


def test_a_rank_without_a_copy_stops_up_before_launch_and_leaves_other_lanes_alone(sim, capsys) -> None:
    """spark4 (rank 3) has no copy at all: `up` fails before launch naming it, with the operator's remedy; the
    Station's lane, serving meanwhile, keeps its container."""
    # (the sim's KV for a GB300 launch is not a seed figure, docs/sim-layout.md: the Station lane's KV unjudged)
    station_up = ["up", "--profile", "gb300-configc", "--inventory", "sim", "-o", "expect.kv_tokens=!unset", *FAST]
    assert main(station_up) == 0, result(events(capsys))
    station = containers(sim, "gb300-configc")
    capsys.readouterr()
    shutil.rmtree(copy_dir(sim, "spark4"))
    try:
        assert main(UP) == 1
        evs = events(capsys)
        fails_before_launch(evs, "spark4", 3, NO_COPY)
        [f] = [f for f in step_findings(evs, "engram") if f["status"] == "fail"]
        assert f["remedy"] == REMEDY
        assert not any(containers(sim).values())  # no dcp2 container anywhere
        assert containers(sim, "gb300-configc") == station and station["station"]  # the other lane: untouched
    finally:
        main(["down", "--profile", "gb300-configc", "--inventory", "sim", "--json"])


def test_without_the_expectation_a_rank_without_a_copy_is_a_warning(sim, capsys) -> None:
    shutil.rmtree(copy_dir(sim, "spark4"))
    assert main([*UP, "-o", "expect.engram_node_local=false"]) == 0
    evs = events(capsys)
    [f] = [f for f in step_findings(evs, "engram") if f["status"] != "ok"]
    assert (f["status"], f["node"], f["message"]) == ("warn", "spark4", f"rank 3 (spark4): {NO_COPY}{NFS}")
    assert f["remedy"] == "make (or resume) the copy: sparkfleet engram-local --profile dcp2 --node spark4"
    assert "engram-local" not in {f["check"] for f in step_findings(evs, "expect")}  # not expected: not judged


def test_harvested_ranges_decide_the_rows_a_rank_reads(sim, capsys) -> None:
    """With the lane's harvested ranges stored, a copy holding fewer rows than its rank reads stops `up`."""
    profile = Spec(REPO).profile("dcp2").profile
    harvest = ranges.Harvest(tp=4, ranks={r: {1: (r * Q, (r + 1) * Q), 14: (r * Q, (r + 1) * Q)} for r in range(4)},
                             profile="dcp2", revision=REV)
    harvest.ranks[2][14] = (2 * Q, 3 * Q + 10)  # rank 2 reads 10 rows past what its copy holds
    ranges.save(harvest, ranges.store_path(profile))
    assert main(UP) == 1
    fails_before_launch(events(capsys), "bluey", 2,
                        f"layer 14: the copy holds rows [{2 * Q}, {3 * Q}), the rank reads [{2 * Q}, {3 * Q + 10})")
    assert not any(containers(sim).values())


def test_check_judges_the_copies_by_the_same_rule(sim, capsys) -> None:
    break_copy(sim, "bluey", verified=False)
    shutil.rmtree(copy_dir(sim, "spark4"))
    code = main(["check", "--profile", "dcp2", "--inventory", "sim", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    copies = [(f["node"], f["status"], f["message"]) for f in doc["findings"] if f["check"] == "engram-copy"]
    assert copies == [
        ("reddie", "ok", copies[0][2]), ("asusi", "ok", copies[1][2]),
        ("bluey", "fail", "rank 2 (bluey): the copy was never verified (made with --no-verify, or its read-back "
                          f"failed){NFS}"),
        ("spark4", "fail", f"rank 3 (spark4): {NO_COPY}{NFS}")]
    assert copies[1][2].startswith(f"rank 1 (asusi): node-local fp8 copy of rows 1 [{Q}, {2 * Q}), 14 [{Q}, {2 * Q})")


def test_the_operators_path_from_nfs_to_node_local(sim, capsys) -> None:
    """No copies anywhere: boot reading NFS on purpose, harvest the ranks' rows from their logs, copy with
    `engram-local` fleet mode, and `up` again: every rank reads node-local rows and `expect` says so."""
    for node in RANK_NODE.values():
        shutil.rmtree(copy_dir(sim, node))
    assert main([*UP, "-o", "expect.engram_node_local=false"]) == 0
    evs = events(capsys)
    assert {f["node"]: f["status"] for f in step_findings(evs, "engram")} == dict.fromkeys(RANK_NODE.values(), "warn")
    assert main(["engram-local", "harvest", "--profile", "dcp2", "--inventory", "sim", "--json"]) == 0
    got = events(capsys)[-1]
    assert {r: v["layers"] for r, v in got["ranks"].items()} == {
        str(r): {"1": [r * Q, (r + 1) * Q], "14": [r * Q, (r + 1) * Q]} for r in range(4)}
    assert main(["engram-local", "--profile", "dcp2", "--inventory", "sim", "--tensors", "model.layers.{layer}.engram.*",
                 "--json"]) == 0
    summary = events(capsys)[-1]
    assert summary["nfs_ranks"] == [] and [c["ok"] for c in summary["copies"]] == [True] * 4
    assert main(UP) == 0
    evs = events(capsys)
    assert [f["status"] for f in step_findings(evs, "engram")] == ["ok"] * 4
    [local] = [f for f in step_findings(evs, "expect") if f["check"] == "engram-local"]
    assert (local["status"], local["message"]) == ("ok", "every rank logged 'read from node-local'")
