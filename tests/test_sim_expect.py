"""`up`'s expectations against a sim that decides its own observables (THE LAB IS A SIMULATION, sparkfleet/sim).

The sim engine derives KV, the MoE line and the Engram lines from what each rank was launched with and what
its node holds, never from the profile's `expect:`; so a wrong expectation, or flags changed under an
unchanged one, or an Engram copy that does not cover the rank's rows, fails through `up` itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.fleet.nodeside import engram_copy as ec
from sparkfleet.sim import values
from tests import cli_run

FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--json"]
NODES = ("reddie", "asusi", "bluey", "spark4")  # ranks 0..3 of dcp2 on the lab inventory
REV = "df42c109f1defefcbfcedbe7d905718a12266e40"  # dcp2's checkpoint (spark-vllm / production-1.2)
REPO = "models--deepseek-ai--DeepSeek-V4.1-Flash"
ROWS = values.ENGRAM_STANDIN_ROWS  # the lab checkpoint's Engram tables: rank r of TP4 reads its quarter


@pytest.fixture(autouse=True)
def clean(sim, capsys):
    yield
    main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"])
    capsys.readouterr()


def up(capsys, *extra: str) -> tuple[int, list[dict]]:
    code = main(["up", "--profile", "dcp2", "--inventory", "sim", *FAST, *extra])
    return code, [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]


def expect_findings(events: list[dict]) -> dict[str, dict]:
    fs = next(e for e in events if e["event"] == "findings" and e["step"] == "expect")["findings"]
    return {f["check"]: f for f in fs}


def result(events: list[dict]) -> dict:
    return next(e for e in events if e["event"] == "result")


def test_a_wrong_kv_expectation_fails_expect(sim, capsys) -> None:
    """The launch (6 GiB at DCP2) yields 1,888,800 tokens (HLT-20); an expectation above that fails."""
    code, events = up(capsys, "-o", "expect.kv_tokens=2000000")
    assert code == 1
    assert result(events)["reason"] == "expect: expectations not met; every rank of this launch was stopped"
    kv = expect_findings(events)["kv-tokens"]
    assert (kv["status"], kv["observed"], kv["expected"]) == ("fail", "1,888,800", "2,000,000")


def test_changed_flags_under_an_unchanged_expectation_fail_expect(sim, capsys) -> None:
    """5 GiB of KV and another MoE backend, with dcp2's expectations (1,888,800 tokens, the b12x line)."""
    code, events = up(capsys, "-o", "flags.--kv-cache-memory-bytes=5368709120", "-o", "flags.--moe-backend=marlin")
    assert code == 1
    fs = expect_findings(events)
    kv, moe = fs["kv-tokens"], fs["moe-backend"]
    assert (kv["status"], kv["expected"]) == ("fail", "1,888,800")
    assert int(kv["observed"].replace(",", "")) < 1_888_800
    assert moe["status"] == "fail" and moe["message"].startswith("ranks [0, 1, 2, 3] did not log ")


def test_node_local_engram_only_where_the_copy_covers_the_rows(sim, capsys) -> None:
    """The copies the real copier made (conftest.engram_copies) are node-local; then two wrong copies, two judges:
    another rank's copy (its manifest says so) is refused by `up`'s engram step before launch; a copy whose
    manifest is right but whose bytes end half-way is only seen by the engine reading it (the sim reads the files),
    which then reads those rows over NFS, and `expect` fails the lane for it."""
    code, events = up(capsys)
    assert code == 0, result(events)
    assert expect_findings(events)["engram-local"]["status"] == "ok"
    copy = Path(f"nvme/engram-local/{REV}")
    bluey, spark4 = sim.root("bluey") / copy, sim.root("spark4") / copy
    # bluey (rank 2) gets asusi's copy (rank 1's rows): its manifest says so, and up stops before launch
    saved = sim.root("bluey") / "tmp" / "copy"
    shutil.copytree(bluey, saved)
    shutil.rmtree(bluey)
    shutil.copytree(sim.root("asusi") / copy, bluey)
    try:
        code, events = up(capsys)
        assert code == 1 and result(events)["reason"].startswith("engram: expect.engram_node_local: rank 2 (bluey): ")
        assert "launch:workers" not in [e["step"] for e in events if e["event"] == "step"]
    finally:
        shutil.rmtree(bluey)
        shutil.move(saved, bluey)
    # spark4's (rank 3) copy loses its last bytes: the manifest still claims the rows, the engine finds them short
    kept = {p.name: p.read_bytes() for p in spark4.iterdir()}
    t = json.loads((spark4 / ec.MANIFEST).read_text())["tensors"][0]  # layer 1's values, rank 3's rows
    with open(spark4 / t["file"], "r+b") as fh:
        fh.truncate(t["offset"] + t["length"] // 2)  # the copy ends half-way through the rows it claims
    try:
        code, events = up(capsys)
        assert code == 1
        assert result(events)["reason"] == "expect: expectations not met; every rank of this launch was stopped"
        fails = [f for f in next(e for e in events if e["event"] == "findings" and e["step"] == "expect")["findings"]
                 if f["status"] == "fail"]
        assert [(f["check"], f["node"], f["message"]) for f in fails] == [(
            "engram-local", "spark4", "rank 3 (spark4) read Engram layer(s) 1, 14 over NFS, not from its node-local "
            "copy (expect.engram_node_local; 6-8 ms a step against 3, ENG-16)")]
        assert _lane_states(sim) == dict.fromkeys(NODES, ["exited"])  # the lane was stopped, like any failure
        logs = {n: _head_log_lines(sim, n) for n in ("spark4", "asusi")}
        q = ROWS // 4
        assert f"Engram layer 14 rows [{3 * q}, {ROWS}) read from the model directory (no node-local copy)" in logs[
            "spark4"]
        assert f"Engram layer 1 rows [{q}, {2 * q}) read from node-local /engram-local" in logs["asusi"]
    finally:
        for name, data in kept.items():
            (spark4 / name).write_bytes(data)


def _head_log_lines(sim, node: str) -> str:
    """The node's running dcp2 container's log."""
    [c] = cli_run.lane_containers(sim, "dcp2", (node,))[node]
    return cli_run.container_log(sim, node, c["Id"])


def _lane_states(sim) -> dict[str, list[str]]:
    """node -> the state of each dcp2 container on the node."""
    return {node: [c["State"]["Status"] for c in cs] for node, cs in cli_run.lane_containers(sim, "dcp2", NODES).items()}
