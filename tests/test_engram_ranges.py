"""Engram row ranges: log lines parsed, per-rank problems reported (FM-03), harvest stored; manifest checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.engram import ranges as rng
from sparkfleet.engram.manifest import check_rank, falls_back
from sparkfleet.schema.errors import UserError

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

Q = 96_000_000  # a quarter of a 384M-row table (ENG-01/03)


def lines(rank: int | None, layers: dict[int, tuple[int, int]]) -> str:
    prefix = f"(VllmWorker rank={rank} pid=4{rank}) " if rank is not None else ""
    return "".join(f"INFO 09-11 10:0{i}:00 [engram.py:88] {prefix}Engram DISK mode: layer {layer} rows "
                   f"[{s}, {e})\n" for i, (layer, (s, e)) in enumerate(layers.items()))


def good(rank: int) -> dict[int, tuple[int, int]]:
    return {1: (rank * Q, (rank + 1) * Q), 14: (rank * Q, (rank + 1) * Q)}


def test_parse_one_ranks_log_with_noise() -> None:
    text = "WARNING something else\n" + lines(None, good(2)) + "INFO read from node-local\n" + lines(None, good(2))
    assert rng.one_rank(text, "r2.log") == {1: (2 * Q, 3 * Q), 14: (2 * Q, 3 * Q)}


def test_several_ranks_in_one_log_is_an_error_for_one_rank() -> None:
    text = lines(None, good(0)) + lines(None, good(1))
    with pytest.raises(UserError, match=r"all.log:3: layer 1 has rows \[96000000, 192000000\) here and \[0, 96000000\) "
                                        "earlier: these are several ranks' lines"):
        rng.one_rank(text, "all.log")


def test_rank_markers_split_one_file() -> None:
    text = "".join(lines(r, good(r)) for r in range(4))
    text += "[rank3]: Engram DISK mode: layer 1 rows [288000000, 384000000)\n"
    assert rng.by_rank(text, "all.log") == {r: good(r) for r in range(4)}
    with pytest.raises(UserError, match="all.log:1: an Engram DISK mode line without a rank marker"):
        rng.by_rank(lines(None, good(0)), "all.log")


def test_no_lines_and_empty_ranges_are_errors() -> None:
    with pytest.raises(UserError, match="x.log: no 'Engram DISK mode"):
        rng.one_rank("INFO nothing here\n", "x.log")
    with pytest.raises(UserError, match=r"x.log:1: layer 1 rows \[5, 5\) is empty"):
        rng.one_rank("Engram DISK mode: layer 1 rows [5, 5)\n", "x.log")


def statuses(findings) -> list[tuple[str, str]]:
    return [(f.check, f.status) for f in findings]


def test_a_clean_tp4_split_is_ok() -> None:
    findings = rng.report({r: good(r) for r in range(4)}, tp=4, layers=[1, 14])
    assert statuses(findings) == [("engram-ranges", "ok"), ("engram-ranges", "ok")]
    assert "r3 [288,000,000, 384,000,000)" in findings[0].message


def test_identical_ranges_on_every_rank_is_the_rank_offset_bug() -> None:
    findings = rng.report({r: good(0) for r in range(4)}, tp=4, layers=[1, 14])
    assert statuses(findings) == [("engram-rank-offset", "fail")] * 2
    assert "every rank (0, 1, 2, 3) has the same rows [0, 96,000,000)" in findings[0].message
    assert "FM-03" in findings[0].remedy


def test_two_ranks_identical_and_overlaps_are_named() -> None:
    ranks = {0: good(0), 1: good(0), 2: good(2), 3: {1: (3 * Q - 10, 4 * Q), 14: good(3)[14]}}
    findings = rng.report(ranks, tp=4, layers=[1, 14])
    msgs = [f.message for f in findings if f.status == "fail"]
    assert "layer 1: ranks 0 and 1 have the same rows [0, 96,000,000)" in msgs
    assert ("layer 1: ranks 2 [192,000,000, 288,000,000) and 3 [287,999,990, 384,000,000) overlap on rows "
            "[287,999,990, 288,000,000)") in msgs
    assert "layer 14: ranks 0 and 1 have the same rows [0, 96,000,000)" in msgs


def test_missing_rank_missing_layer_and_unowned_rows() -> None:
    ranks = {0: good(0), 1: {1: good(1)[1]}, 3: good(3)}
    findings = rng.report(ranks, tp=4, layers=[1, 14], nodes={2: "bluey"})
    fails = [(f.message, f.node) for f in findings if f.status == "fail"]
    assert ("rank 2 has no Engram DISK mode lines: its rows are not covered", "bluey") in fails
    assert ("rank 1 has no range for layer 14", None) in fails
    warns = [f.message for f in findings if f.status == "warn"]
    assert "layer 1: rows [192,000,000, 288,000,000) belong to no rank (before rank 3)" in warns
    optional = rng.report({r: good(r) for r in (1, 2, 3)}, tp=4, layers=[1, 14], optional=[0])
    assert [f.status for f in optional if "rank 0" in f.message] == ["warn"]


# -- harvest through the CLI, stored per checkpoint and TP ---------------------------------------------
def test_harvest_from_files_stores_and_copy_reads_it(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    args = ["engram-local", "harvest", "--profile", "1017g"]
    for r, node in enumerate(["reddie", "asusi", "bluey", "spark4"]):
        f = tmp_path / f"{node}.log"
        f.write_text(lines(None, good(r)))
        args += ["--from", f"{node if r % 2 else r}={f}"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    stored = Path(out["stored"])
    assert stored == tmp_path / "state" / "engram-ranges" / "1bae0e1088993b9b82de08f59de5be5a34e42170-tp4.json"
    data = json.loads(stored.read_text())
    assert data["checkpoint"]["revision"] == "1bae0e1088993b9b82de08f59de5be5a34e42170" and data["tp"] == 4
    assert data["ranks"]["2"] == {"node": "bluey", "source": str(tmp_path / "bluey.log"),
                                  "layers": {"1": [2 * Q, 3 * Q], "14": [2 * Q, 3 * Q]}}
    got, _ = rng.ranges_for_rank(stored, 3)
    assert got == good(3)
    with pytest.raises(UserError, match="holds ranks 0, 1, 2, 3: pick one with --rank"):
        rng.ranges_for_rank(stored, None)


def test_harvest_refuses_to_store_the_rank_offset_bug(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    all_log = tmp_path / "all.log"
    all_log.write_text("".join(lines(r, good(0)) for r in range(4)))
    assert main(["engram-local", "harvest", "--profile", "1017g", "--ranges", str(all_log)]) == 1
    captured = capsys.readouterr()
    assert "every rank (0, 1, 2, 3) has the same rows" in captured.out
    assert "ranges not stored" in captured.err
    assert not (tmp_path / "state" / "engram-ranges").exists()


def test_fleet_mode_needs_ranges_of_the_lanes_tp(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    assert main(["engram-local", "--profile", "1017g"]) == 2
    assert "no harvested Engram ranges for 1017g" in capsys.readouterr().err
    h = rng.Harvest(tp=3, ranks={r: good(r) for r in range(3)})
    rng.save(h, tmp_path / "tp3.json")
    assert main(["engram-local", "--profile", "1017g", "--ranges", str(tmp_path / "tp3.json")]) == 2
    assert "ranges harvested at TP3, the lane runs TP4 (TP3 needs its own ranges" in capsys.readouterr().err


def test_cli_user_errors_are_one_line(tmp_path: Path, capsys) -> None:
    assert main(["engram-local"]) == 2
    assert "give --profile LANE (fleet mode) or a subcommand" in capsys.readouterr().err
    assert main(["engram-local", "copy", "--source", str(tmp_path), "--dest", str(tmp_path / "d")]) == 2
    assert "give the rank's rows" in capsys.readouterr().err
    assert main(["engram-local", "copy", "--source", str(tmp_path / "nope"), "--dest", str(tmp_path / "d"),
                 "--range", "1:0:10", "--tensors", "x.{layer}.*"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"sparkfleet: {tmp_path / 'nope'}: no such checkpoint directory"


# -- manifest checks (what `up` does before launch) --------------------------------------------------------
REV = "1bae0e1088993b9b82de08f59de5be5a34e42170"


def manifest(**kw) -> dict:
    m = {"schema": "sparkfleet.engram-manifest/1", "complete": True, "verified": True, "mode": "rows",
         "format": "fp8", "completed_at": "2026-10-17T10:00:00+00:00",
         "source": {"revision": REV, "shards": []},
         "layers": {"1": {"start": Q, "end": 2 * Q, "rows": 4 * Q}, "14": {"start": Q, "end": 2 * Q, "rows": 4 * Q}}}
    m.update(kw)
    return m


def check(m: dict | None, **kw):
    base = {"rank": 1, "node": "asusi", "dest": "/nvme/engram-local/" + REV, "revision": REV, "fmt": "fp8",
            "ranges": good(1)}
    return check_rank(m, **{**base, **kw})


def test_a_matching_copy_is_node_local() -> None:
    findings = check(manifest())
    assert statuses(findings) == [("engram-copy", "ok")] and not falls_back(findings)
    assert "rank 1 (asusi): node-local fp8 copy of rows 1 [96000000, 192000000)" in findings[0].message


@pytest.mark.parametrize("m,kw,expect", [
    (None, {}, "no engram-manifest.json: the copy is missing or incomplete"),
    (manifest(source={"revision": "df42c109f1defefcbfcedbe7d905718a12266e40"}), {},
     "the copy is of checkpoint df42c109f1defefcbfcedbe7d905718a12266e40, the lane runs 1bae0e10"),
    (manifest(format="nvfp4"), {}, "the copy holds nvfp4 Engram tables, the lane reads fp8 (docs/failure-modes.md FM-24)"),
    (manifest(), {"ranges": good(2)}, "layer 1: the copy holds rows [96000000, 192000000), the rank reads "
                                      "[192000000, 288000000)"),
    (manifest(layers={"1": {"start": Q, "end": 2 * Q}}), {}, "layer 14 is not in the copy"),
    (manifest(complete=False), {}, "not a complete sparkfleet.engram-manifest/1 manifest"),
    (manifest(), {"source_changed": ["model-00047: header differs"]}, "the checkpoint's shards changed since the copy"),
    (manifest(), {"whole_shards": True}, "the copy holds rows (rows), the lane needs whole shards"),
])
def test_mismatches_fall_back_to_nfs(m, kw, expect) -> None:
    findings = check(m, **kw)
    assert falls_back(findings)
    msg = next(f.message for f in findings if f.status == "fail")
    assert expect in msg and "falls back to reading the model directory over NFS" in msg


def test_an_unknown_revision_warns_an_unverified_copy_falls_back() -> None:
    findings = check(manifest(), revision=None)
    assert not falls_back(findings)
    assert sorted(f.status for f in findings) == ["ok", "warn"]
    findings = check(manifest(verified=False))
    assert [(f.status, f.message.split(": falls back")[0]) for f in findings] == [
        ("fail", "rank 1 (asusi): the copy was never verified (made with --no-verify, or its read-back failed)")]


def test_judge_rank_holds_the_copy_against_the_lane(repo_spec) -> None:
    """The one rule's lane side: revision, format, TP and layers from the profile; rows from the harvest
    when there is one, else the copy's own record against the rank's place in the TP geometry."""
    from sparkfleet.engram.manifest import judge_rank
    from sparkfleet.engram.ranges import Harvest

    profile = repo_spec.profile("1017g").profile  # TP4, fp8, layers 1 and 14, revision REV
    base = {"profile": profile, "rank": 1, "node": "asusi", "dest": "/nvme/engram-local/" + REV}
    made = {"size": 4, "rank": 1}
    assert [f.status for f in judge_rank(manifest(tp=made), **base)] == ["ok"]

    def why(m: dict, **kw) -> list[str]:
        return [f.message.split(": falls back")[0] for f in judge_rank(m, **{**base, **kw}) if f.status == "fail"]

    assert why(manifest(tp={"size": 4, "rank": 2})) == [
        "rank 1 (asusi): the copy holds the rows of rank 2 of TP4, this is rank 1 of TP4"]
    assert why(manifest(tp={"size": 2, "rank": 1})) == [
        "rank 1 (asusi): the copy holds the rows of rank 1 of TP2, this is rank 1 of TP4"]
    assert why(manifest(tp=made, layers={"1": {"start": Q, "end": 2 * Q}})) == [
        "rank 1 (asusi): layer 14 is not in the copy"]
    harvest = Harvest(tp=4, ranks={1: {1: (Q, 2 * Q + 5), 14: (Q, 2 * Q)}})  # rank 1 reads 5 rows more
    assert why(manifest(tp=made), harvest=harvest) == [
        "rank 1 (asusi): layer 1: the copy holds rows [96000000, 192000000), the rank reads [96000000, 192000005)"]
    assert why(manifest(tp=made, format="nvfp4")) == [
        "rank 1 (asusi): the copy holds nvfp4 Engram tables, the lane reads fp8 (docs/failure-modes.md FM-24)"]
