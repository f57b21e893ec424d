"""Failure modes caused through `sparkfleet bench` (and `exporter`, FM-68) against a lane `up` started on the lab:
FM-53 (bimodal cells: repetitions), FM-54 (a max-num-seqs cap read as a flat line), FM-17 / FM-63 (a warm-up
batch before anything is measured), FM-18 (the lane's uptime), FM-21 (DSpark acceptance per run).

THE LAB IS A SIMULATION (sparkfleet/sim): the sim engine's `bimodal` fault runs every other burst of requests
1.55x slower (the seeds' C4 cell read 189 and 122); the engine admits at most its --max-num-seqs at once, as
vLLM does, and its /metrics counts what it served. The bench, `up` and the CLI are the real code.
"""

from __future__ import annotations

import json

import httpx

from sparkfleet.bench.runner import MODES_RATIO, BenchResult, Cell, capped, modes
from sparkfleet.bench.vllm_metrics import parse
from sparkfleet.cli.bench import lane_endpoint
from sparkfleet.cli.main import main
from sparkfleet.opsdir import Spec
from tests.cli_run import result, run
from tests.conftest import REPO

UP = ("up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models", "--poll", "0.2", "--no-probe",
      "--no-fabric-probe")


def bench_result(*cells: Cell, **options) -> BenchResult:
    return BenchResult("http://x", "m", {}, {"repeat": 2, **options}, "t", cells=list(cells))


def test_repetitions_that_differ_by_more_than_the_ratio_are_named_two_modes() -> None:
    res = bench_result(Cell("prose", 4, False, aggregate_tps=189.0, rep=1), Cell("prose", 4, False,
                       aggregate_tps=122.0, rep=2), Cell("prose", 8, False, aggregate_tps=200.0, rep=1),
                       Cell("prose", 8, False, aggregate_tps=200.0 * MODES_RATIO * 0.99, rep=2))
    assert modes(res) == ["prose C4 is bimodal: 189.0 / 122.0 tok/s aggregate over 2 repetitions (fastest 1.55x the "
                          "slowest, over 1.2x): two modes, not one figure; do not average them "
                          "(docs/failure-modes.md FM-53)."]


def test_cells_above_the_lanes_cap_or_where_the_engine_queued_are_named() -> None:
    res = bench_result(Cell("prose", 4, False, running_max=4, waiting_max=0),
                       Cell("prose", 16, False, running_max=8, waiting_max=8), max_num_seqs=8)
    assert capped(res) == ["Cells above the lane's --max-num-seqs 8: C16 (the engine's /metrics: C16: at most 8 "
                           "running, 8 waiting). The engine runs at most its cap at once and queues the rest, so "
                           "these cells read the cap (a flat line), not the lane at that concurrency "
                           "(docs/failure-modes.md FM-54)."]
    assert capped(bench_result(Cell("prose", 4, False, running_max=4, waiting_max=0), max_num_seqs=8)) == []
    queued = capped(bench_result(Cell("prose", 12, False, running_max=10, waiting_max=2)))  # cap unknown
    assert queued and queued[0].startswith("Cells where the engine queued requests: C12 (")


def requests_served(base: str) -> float:
    return parse(httpx.get(f"{base}/metrics", timeout=10).text).counters["requests"] or 0.0


def test_bench_on_the_lab_names_a_bimodal_cell_and_the_cap_after_a_warm_up(sim, capsys, lane_cleaned,
                                                                         tmp_path) -> None:
    """dcp2 (--max-num-seqs 8) serves with its head's engine bimodal. `bench --repeat 2` at C4 and C16: C4's two
    repetitions fall in two modes, C16 reads the cap (the engine held 8 running and queued 8), and the engine
    served the 16-request warm-up batch before any cell, none of which the results count."""
    sim.fault("reddie", "bimodal")
    code, events = run(capsys, *UP)
    assert code == 0, result(events)
    sp = Spec(REPO)
    base = lane_endpoint(sp, sp.profile("dcp2"), "sim")
    served_before = requests_served(base)
    code = main(["bench", "--profile", "dcp2", "--inventory", "sim", "--concurrency", "4,16", "--repeat", "2",
                 "--categories", "prose", "--max-tokens", "300", "--ignore-eos", "--json", "--out", str(tmp_path / "bench")])
    res = json.loads(capsys.readouterr().out)
    assert code == 0, res.get("caveats")
    assert [(c["concurrency"], c["rep"]) for c in res["cells"]] == [(4, 1), (4, 2), (16, 1), (16, 2)]
    c4 = [c["aggregate_tps"] for c in res["cells"] if c["concurrency"] == 4]
    assert max(c4) > MODES_RATIO * min(c4)  # the engine's two modes, measured
    bimodal = [c for c in res["caveats"] if "is bimodal" in c]
    assert bimodal and bimodal[0].startswith("prose C4 is bimodal: ")
    # sampled every 0.25 s while the batch ran: the cap exactly, and some of the 8 it queued
    c16 = [(c["running_max"], c["waiting_max"]) for c in res["cells"] if c["concurrency"] == 16]
    assert max(r for r, _ in c16) == 8 and max(w for _, w in c16) >= 1, c16  # never more than the cap ran
    assert all(c["running_max"] <= 4 and c["waiting_max"] == 0 for c in res["cells"] if c["concurrency"] == 4), \
        res["cells"]
    assert [c for c in res["caveats"] if c.startswith("Cells above the lane's --max-num-seqs 8: C16 (")]
    # FM-17 / FM-63: the warm-up batch (16 requests, the largest concurrency) ran and is not in the figures
    assert res["endpoint"] == base
    assert res["traffic"]["engine_requests"] == res["traffic"]["our_requests"] == 2 * 4 + 2 * 16  # after the warm-up
    assert requests_served(base) - served_before == 16 + 2 * 4 + 2 * 16  # the warm-up's 16 were served before
    # FM-18: the lane's uptime, from the engine's own start time; FM-21: acceptance over the run, from /metrics
    assert [c for c in res["caveats"] if c.startswith("The lane had been up ")]
    assert res["acceptance"]["drafts"] > 0 and res["acceptance"]["mean_acceptance_length"] >= 1


def test_the_exporter_labels_a_serving_lane_with_its_checkpoint_revision(sim, capsys, lane_cleaned) -> None:
    """FM-68: the lane name hides the checkpoint. With dcp2 serving, `exporter --once` publishes the lane's
    checkpoint revision (production-1.2's df42c109...) and the image its head container runs."""
    code, events = run(capsys, *UP)
    assert code == 0, result(events)
    assert main(["exporter", "--inventory", "sim", "--once"]) == 0
    text = capsys.readouterr().out
    (line,) = [x for x in text.splitlines() if x.startswith("sparkfleet_lane_info{") and 'profile="dcp2"' in x]
    assert 'checkpoint="df42c109f1defefcbfcedbe7d905718a12266e40"' in line
    assert line.endswith(" 1.0")


def test_cold_prefill_requests_never_hit_the_engines_prefix_cache(sim, capsys, lane_cleaned, tmp_path) -> None:
    """FM-27: the prefix cache hides failures and inflates prefill. `bench --prefill-only` sends two requests of
    the same length; each starts with a fresh nonce, so the engine's own prefix-cache counters (its block hashes
    over the prompt) count every prompt token queried and none hit."""
    code, events = run(capsys, *UP)
    assert code == 0, result(events)
    sp = Spec(REPO)
    base = lane_endpoint(sp, sp.profile("dcp2"), "sim")
    before = parse(httpx.get(f"{base}/metrics", timeout=10).text)
    code = main(["bench", "--profile", "dcp2", "--inventory", "sim", "--prefill-only", "--prefill-tokens", "2K,2K",
                 "--no-warmup", "--json", "--out", str(tmp_path / "bench")])
    res = json.loads(capsys.readouterr().out)
    assert code == 0, res.get("prefill")
    delta = parse(httpx.get(f"{base}/metrics", timeout=10).text).delta(before)
    prompt = sum(p["prompt_tokens"] for p in res["prefill"])
    assert prompt >= 2 * 2000
    assert delta.get("prefix_cache_queries") == prompt and delta.get("prefix_cache_hits") == 0
