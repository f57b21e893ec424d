"""Guards that only a unit test or no test moved, caused through `sparkfleet up` on the simulated lab (issue 39 §3).

THE LAB IS A SIMULATION (sparkfleet/sim): the sim engine derives its KV from what each rank was launched with
(dcp2's 6 GiB at DCP2 gives 1,888,800 tokens, HLT-20), and each node reports its own /proc/meminfo and earlyoom
line; `up` and its checks are the real code. One lab for the module (the shared `sim` fixture); each test leaves
the lab healed and dcp2 down (`lane_cleaned`). Run under the lab lock.

- FM-26: `expect.kv_tokens` as a range (`{min, max}`, as boot10 writes the seeds' two boots), through `up`:
  a KV inside the range serves, one outside fails `expect` naming the range and the figure.
- FM-15: the `earlyoom` check's prediction of MemAvailable after load from the node's own MemTotal and earlyoom
  line, through `up`: a KV budget the node's memory cannot hold is refused before anything is launched.
- FM-03 with the fault in the node: one rank's engine reads rank 0's Engram rows (`engram-rank-offset`, the disk
  reader ignoring the rank's row offset), so its boot log shows another rank's rows: `engram-local harvest`
  refuses to store them naming both ranks, and `up` expecting node-local Engram fails naming the rank.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.sim import values
from tests.cli_run import LAB_NODES, findings, lane_containers, lane_states, result, run, steps

FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe"]
BOOT10 = "{min: 1070168, max: 1250201}"  # the seeds' two boots of one config (profiles/boot10.yaml, FM-26)
GiB = 1024**3
Q = values.ENGRAM_STANDIN_ROWS // 4  # the lab checkpoint's tables: rank r of TP4 reads rows [r Q, (r + 1) Q)


@pytest.fixture(autouse=True)
def clean(lane_cleaned):
    """The lab healed and dcp2 down afterwards (tests/conftest.py lane_cleaned)."""


def up(capsys, *extra: str) -> tuple[int, list[dict]]:
    return run(capsys, "up", "--profile", "dcp2", "--inventory", "sim", *FAST, *extra)


def kv_finding(events: list[dict]) -> dict:
    [kv] = [f for f in findings(events, "expect") if f["check"] == "kv-tokens"]
    return kv


def test_a_kv_inside_the_expected_range_serves(sim, capsys) -> None:
    """1,888,800 lies strictly inside 1,800,000..1,900,000 and equals neither end: only a range test passes it."""
    code, events = up(capsys, "-o", "expect.kv_tokens={min: 1800000, max: 1900000}")
    assert code == 0, result(events)
    kv = kv_finding(events)
    assert (kv["status"], kv["message"], kv["observed"], kv["expected"]) == (
        "ok", "KV cache 1,888,800 tokens", "1,888,800", "1,800,000..1,900,000")
    assert lane_states(sim) == {n: ["running"] for n in LAB_NODES}


def test_a_kv_outside_the_expected_range_fails_expect_naming_the_range(sim, capsys) -> None:
    """dcp2's 1,888,800 tokens against the seeds' boot10 range (1,070,168..1,250,201): expect fails, the finding
    names the figure and the range, and every rank the launch started is stopped."""
    code, events = up(capsys, "-o", f"expect.kv_tokens={BOOT10}")
    assert code == 1
    assert result(events)["reason"] == "expect: expectations not met; every rank of this launch was stopped"
    kv = kv_finding(events)
    assert (kv["status"], kv["message"], kv["observed"], kv["expected"]) == (
        "fail", "KV cache 1,888,800 tokens is outside the expected range 1,070,168..1,250,201",
        "1,888,800", "1,070,168..1,250,201")
    assert lane_states(sim) == {n: ["exited"] for n in LAB_NODES}


def test_a_kv_budget_the_nodes_memory_cannot_hold_is_refused_before_launch(sim, capsys) -> None:
    """FM-15 through `up`: dcp2 has no measured headroom, so MemAvailable after load is predicted from what each
    node reports: its MemTotal (GB10: 121 GiB of unified memory) less the model's 81.6 GiB a rank less the KV
    budget. 37 GiB of KV leaves 2.4 GiB (2.6 GB), under the node's earlyoom line (-m 2 % of MemTotal, 2.6 GB)
    plus the seeds' 2.6 GB margin: every rank is refused at `check` naming its node and the figures, exit 1,
    and nothing is launched."""
    kv = 37 * GiB
    code, events = up(capsys, "-o", f"flags.--kv-cache-memory-bytes={kv}")
    assert code == 1, result(events)
    assert result(events)["reason"].startswith("check: ")
    assert steps(events)["check"] == "fail"
    assert not [s for s in steps(events) if s.startswith("launch")]
    fails = [f for f in findings(events, "check") if f["status"] == "fail"]
    assert [(f["node"], f["check"]) for f in fails] == [(n, "earlyoom") for n in LAB_NODES]
    for f in fails:
        assert f["message"] == ("refused: predicted MemAvailable after load 2.6 GB is below 5.2 GB; earlyoom "
                                "would kill the engine under load"), f
        assert f["observed"] == ("predicted 2.6 GB after load (MemTotal 121.0 GiB - model 81.6 GiB - KV 37.0 GiB; "
                                 "an upper bound: CUDA graphs, activations and the OS come on top); earlyoom "
                                 "SIGTERM at MemAvailable <= 2.6 GB (-m 2%)"), f
        assert f["expected"] == "predicted MemAvailable after load >= 5.2 GB (2.6 GB SIGTERM line + 2.6 GB margin)"
        assert "FM-15" in f["remedy"] and "--kv-cache-memory-bytes" in f["remedy"]
    assert lane_containers(sim, "dcp2") == {n: [] for n in LAB_NODES}


def test_a_rank_whose_boot_log_shows_rank_0s_rows_is_refused_by_harvest_and_fails_up(sim, capsys) -> None:
    """FM-03 with the fault in the node: bluey's engine (rank 2) reads rank 0's Engram rows. Booted without the
    node-local expectation, the lane serves (bluey's copy of its own rows does not cover what it reads, so it reads
    them over NFS); `engram-local harvest` reads every rank's rows from its container's log and refuses them,
    naming ranks 0 and 2 and the rows they share, and stores nothing. With dcp2's expectation, `up` fails at
    expect on bluey alone and stops every rank."""
    sim.fault("bluey", "engram-rank-offset")
    code, events = up(capsys, "-o", "expect.engram_node_local=false")
    assert code == 0, result(events)
    assert main(["engram-local", "harvest", "--profile", "dcp2", "--inventory", "sim", "--json"]) == 1
    [harvest] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert {int(r): v["layers"] for r, v in harvest["ranks"].items()} == {
        r: {"1": [s * Q, (s + 1) * Q], "14": [s * Q, (s + 1) * Q]} for r, s in ((0, 0), (1, 1), (2, 0), (3, 3))}
    fails = [(f["check"], f["message"]) for f in harvest["findings"] if f["status"] == "fail"]
    assert fails == [("engram-rank-offset", f"layer {layer}: ranks 0 and 2 have the same rows [0, {Q:,})")
                     for layer in (1, 14)]
    assert harvest["stored"] is None
    assert not (Path(os.environ["SPARKFLEET_STATE"]) / "engram-ranges").exists()
    code, events = up(capsys)
    assert code == 1
    assert result(events)["reason"] == "expect: expectations not met; every rank of this launch was stopped"
    fails = [(f["node"], f["check"], f["message"]) for f in findings(events, "expect") if f["status"] == "fail"]
    assert fails == [("bluey", "engram-local", "rank 2 (bluey) read Engram layer(s) 1, 14 over NFS, not from its "
                      "node-local copy (expect.engram_node_local; 6-8 ms a step against 3, ENG-16)")]
    assert lane_states(sim) == {n: ["exited"] for n in LAB_NODES}
