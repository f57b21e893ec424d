"""`sparkfleet bench` against the sim engine, run as a real process on a free loopback port.

THE ENDPOINT IS A SIMULATION (sparkfleet/simengine): with --decode-tokens-per-s R every stream decodes
at exactly R tokens/s after its first token, so the bench's numbers can be checked against known rates.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time

import httpx
import pytest

from sparkfleet.bench import promptsets, report, vllm_metrics
from sparkfleet.bench.runner import BenchOptions, BenchResult, run_bench
from sparkfleet.cli.main import main
from sparkfleet.engines.vllm import METRICS as VLLM
from sparkfleet.simengine import tokens
from tests.test_simengine_util import Lane

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

MODEL = "deepseek-v4.1-flash"  # dcp2's served name, so `--profile dcp2 --endpoint URL` sends the right model
RATE = 80.0  # tok/s per stream, configured on the sim engine
FORCED = 241  # tokens per stream (ignore_eos): 240 after the first, 3.0 s at RATE
PREFILL_TPS = 20_000.0

ONE_PROSE = """
name: test-prose
prompts:
  - id: rivers
    category: prose
    max_tokens: 241
    text: "Write a few sentences about rivers and the towns that grew up along them."
"""


def sim_lane(tmp, name: str, *extra: str) -> Lane:
    lane = Lane(tmp, world=1, boot=0.1, name=name, served=(MODEL,),
                extra=["--max-num-seqs", "64", "--decode-tokens-per-s", str(RATE),
                       "--prefill-tokens-per-s", str(PREFILL_TPS), "--kv-tokens", "4000000", *extra])
    lane.start(0)
    lane.wait_health()
    return lane


@pytest.fixture(scope="module")
def lane(tmp_path_factory):
    ln = sim_lane(tmp_path_factory.mktemp("bench"), "paced")
    yield ln
    ln.stop()


@pytest.fixture(scope="module")
def prose_set(tmp_path_factory) -> promptsets.PromptSet:
    path = tmp_path_factory.mktemp("sets") / "prose.yaml"
    path.write_text(ONE_PROSE)
    return promptsets.load(str(path))


def scrape(lane: Lane) -> vllm_metrics.Snapshot:
    return vllm_metrics.parse(lane.http.get(lane.url + "/metrics").text)


@pytest.fixture(scope="module")
def rated(lane, prose_set) -> tuple[BenchResult, vllm_metrics.Delta]:
    """One forced-length run at C1 and C16, with the engine's counters around it."""
    before = scrape(lane)
    result = run_bench(lane.url, prose_set, BenchOptions(concurrency=(1, 16), ignore_eos=True))
    return result, scrape(lane).delta(before)


def test_the_sim_engine_paces_a_stream_at_the_configured_rate_with_the_first_token_alone(lane) -> None:
    """The sim engine option the bench tests rest on (--decode-tokens-per-s), checked with plain httpx."""
    before = scrape(lane)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about harbours."}], "max_tokens": 81,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    times, texts, usage = [], [], None
    with lane.http.stream("POST", lane.url + "/v1/chat/completions", json=body) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            text = (chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None) or ""
            if text:
                times.append(time.perf_counter())
                texts.append(text)
    delta = scrape(lane).delta(before)
    assert usage["completion_tokens"] == 81 == sum(tokens.count(t) for t in texts)
    assert tokens.count(texts[0]) == 1 and max(tokens.count(t) for t in texts[1:]) > 1  # prefill's token, then steps
    assert within(80 / (times[-1] - times[0]), RATE)  # 80 tokens after the first, at RATE
    # the first token is not a draft: every other token is a draft step's own token or an accepted one
    assert delta.get("drafts") + delta.get("accepted") + 1 == 81


def within(measured: float | None, expected: float, tolerance: float = 0.02) -> bool:
    return measured is not None and abs(measured / expected - 1) <= tolerance


@pytest.mark.parametrize("c", [1, 16])
def test_decode_and_aggregate_agree_with_the_configured_rates(rated, c: int) -> None:
    """Per-stream decode against the engine's configured rate; aggregate against the configured decode time
    after the latest first token. (When that first token comes is the engine's admission and prefill, which
    a busy 2-core machine stretches: it is not a configured rate, so the expectation starts from it.)"""
    result, _ = rated
    cell = result.cell("prose", c)
    assert cell is not None and cell.ok, cell
    decode_s = (FORCED - 1) / RATE
    # released together, not one after another (a starved client may take a moment to send them all)
    assert max(s.sent_s for s in cell.streams) < 0.25 * decode_s
    latest_first = max(s.sent_s + s.ttft_s for s in cell.streams)
    expected_aggregate = c * FORCED / (latest_first + decode_s)
    detail = (f"C{c}: decode {cell.decode_tps}, aggregate {cell.aggregate_tps} (expected {RATE}, "
              f"{expected_aggregate}; latest first token {latest_first:.3f} s)")
    assert within(cell.decode_tps, RATE), detail
    assert within(cell.aggregate_tps, expected_aggregate), detail
    assert all(within(s.decode_tps, RATE, 0.05) for s in cell.streams), [s.decode_tps for s in cell.streams]
    assert len(cell.streams) == c and cell.tokens == c * FORCED


def test_usage_counts_are_exact_when_chunks_carry_several_tokens(rated, lane) -> None:
    result, delta = rated
    streams = [s for cell in result.cells for s in cell.streams]
    assert all(s.completion_tokens == FORCED for s in streams)
    assert all(s.chunks < s.completion_tokens / 2 for s in streams)  # DSpark-like: ~3 tokens per chunk
    # every generated token the engine counted is in our usage blocks (warm-up included)
    assert delta.get("generation_tokens") == result.traffic["our_tokens"] + 16 * 16
    # natural lengths: the streamed usage equals the plain answer's usage and its text's token count
    v1 = promptsets.load("v1")
    natural = run_bench(lane.url, v1, BenchOptions(concurrency=(2,), categories=("code",), warmup=False))
    code = v1.by_category("code")[0]
    plain = lane.chat({"model": MODEL, "messages": [{"role": "user", "content": code.text}],
                       "max_tokens": code.max_tokens, "chat_template_kwargs": {"thinking": False}}).json()
    want = plain["usage"]["completion_tokens"]
    assert want == tokens.count(plain["choices"][0]["message"]["content"])
    cell = natural.cell("code", 2)
    assert cell.ok and [s.completion_tokens for s in cell.streams] == [want, want]
    assert all(s.chunks < s.completion_tokens for s in cell.streams)


def test_acceptance_comes_from_the_metrics_deltas(rated) -> None:
    result, delta = rated
    acc = result.acceptance
    assert acc is not None
    assert acc["mean_acceptance_length"] == pytest.approx(1 + acc["accepted_tokens"] / acc["drafts"])
    assert 2.0 < acc["mean_acceptance_length"] < 6.0  # k=5: at most 6 tokens per step
    rates = acc["per_position"]
    assert len(rates) == 5 and all(a >= b for a, b in zip(rates, rates[1:], strict=False)), rates
    assert sum(rates) * acc["drafts"] == pytest.approx(acc["accepted_tokens"])  # each accepted token has a position
    assert sum(c.acceptance["drafts"] for c in result.cells) == acc["drafts"]  # the cells cover the run
    # paced, every request's first token comes from prefill and the rest from drafts: nothing unaccounted
    assert acc["drafts"] + acc["accepted_tokens"] + result.traffic["our_requests"] == result.traffic["our_tokens"]
    assert all(c.acceptance and c.acceptance["drafts"] > 0 for c in result.cells)
    assert result.traffic["seen"] is False and result.traffic["engine_requests"] == 17


def test_caveats_name_the_simulation_the_single_batch_the_probe_uptime_and_traffic(rated) -> None:
    result, _ = rated
    text = "\n".join(result.caveats)
    assert result.simulated and "SIMULATION" in text
    assert "One batch per cell" in text and "not probed" in text
    assert "had been up" in text and "No other traffic seen" in text and "ignore_eos" in text
    assert result.lane["uptime_s"] >= 0


def test_a_missing_usage_block_is_an_error_for_the_cell(tmp_path, prose_set) -> None:
    ln = sim_lane(tmp_path, "nousage", "--fault", "stream-usage-missing")
    try:
        result = run_bench(ln.url, prose_set, BenchOptions(concurrency=(1, 3), max_tokens=20))
        code = main(["bench", "--profile", "dcp2", "--endpoint", ln.url, "--concurrency", "2", "--max-tokens", "20",
                     "--json", "--out", str(tmp_path / "out"), "--no-warmup"])
    finally:
        ln.stop()
    assert not result.ok
    for cell in result.cells:
        assert cell.error and "no usage block" in cell.error
        assert cell.aggregate_tps is None and cell.decode_tps is None and cell.tokens is None
        assert all(s.completion_tokens is None for s in cell.streams)
    md = report.markdown(result)
    assert "| prose | error | error |" in md and "no usage block" in md
    assert code == 1
    saved = report.load(tmp_path / "out")
    assert len(saved.cells) == 9 and all("no usage block" in c.error for c in saved.cells)  # v1: 8 + counting


def test_cold_prefill_is_uncached_and_runs_at_the_configured_rate(lane, prose_set) -> None:
    before = scrape(lane)
    result = run_bench(lane.url, prose_set, BenchOptions(decode=False, prefill=True, prefill_tokens=(2048, 8192),
                                                         warmup=False))
    delta = scrape(lane).delta(before)
    assert result.ok and [p.target for p in result.prefill] == [2048, 8192]
    for p in result.prefill:
        assert p.sized == "tokenize" and abs(p.prompt_tokens / p.target - 1) < 0.02, p
    assert delta.get("prefix_cache_hits") == 0  # a fresh nonce and filler each time: nothing cached
    for p in result.prefill:
        # TTFT holds the engine's whole prefill (prompt / configured rate) plus its request handling, which a
        # busy 2-core machine stretches (tens of ms for 8K tokens): the rate never beats the configured one
        assert p.ttft_s >= p.prompt_tokens / PREFILL_TPS and p.tps == p.prompt_tokens / p.ttft_s, p
    # the 0.4 s prefill is most of the TTFT even when the machine is busy (a TTFT that took in the /tokenize
    # sizing or a second request would not be)
    assert result.prefill[1].tps > 0.4 * PREFILL_TPS, result.prefill[1]
    assert "Cold prefill" in report.markdown(result)


def test_other_traffic_during_the_run_is_seen(lane, prose_set) -> None:
    stop = threading.Event()

    def other() -> None:
        with httpx.Client(timeout=10) as http:
            while not stop.is_set():
                http.post(lane.url + "/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": "Hello there."}], "max_tokens": 5})

    thread = threading.Thread(target=other, daemon=True)
    try:
        thread.start()
        result = run_bench(lane.url, prose_set, BenchOptions(concurrency=(1,), max_tokens=30, warmup=False))
    finally:
        stop.set()
        thread.join(10)
    assert result.traffic["seen"] is True and result.traffic["other_requests"] >= 1
    assert any("Other traffic was seen" in c for c in result.caveats)


@pytest.mark.parametrize("failures", [1, 3])
def test_a_failed_metrics_scrape_is_tried_again_before_the_figures_are_given_up(lane, prose_set, monkeypatch,
                                                                              failures: int) -> None:
    """The closing /metrics scrape fails `failures` times in a row (a dropped connection): one failure costs
    nothing; SCRAPE_TRIES failures give the traffic figures up, with a note saying why."""
    from sparkfleet.bench import aclient, runner

    real = aclient.AsyncApiClient.get_text
    calls = {"metrics": 0}
    fail_at = set(range(3, 3 + failures))  # scrapes 1-2: lane uptime and before; 3 on: the first cell's "before"

    async def flaky(self, path: str):
        if path == "/metrics":
            calls["metrics"] += 1
            if calls["metrics"] in fail_at:
                raise aclient.RequestFailed("GET /metrics: ReadError: connection dropped")
        return await real(self, path)

    monkeypatch.setattr(aclient.AsyncApiClient, "get_text", flaky)
    notes: list[str] = []
    result = run_bench(lane.url, prose_set, BenchOptions(concurrency=(1,), max_tokens=30, warmup=False),
                       lambda kind, item: notes.append(item) if kind == "note" else None)
    assert failures <= runner.SCRAPE_TRIES
    if failures < runner.SCRAPE_TRIES:
        assert notes == [] and result.traffic["engine_tokens"] == result.traffic["our_tokens"] > 0
    else:
        assert notes == ["/metrics unreadable after 3 tries (GET /metrics: ReadError: connection dropped): "
                         "no acceptance or traffic figures"]
        assert result.traffic["seen"] is None and "engine_tokens" not in result.traffic


def test_report_tables_json_round_trip_and_plots(rated, tmp_path, monkeypatch) -> None:
    result, _ = rated
    md = report.markdown(result)
    assert result.prompt_set["sha256"] in md and "| prose |" in md and "C16" in md
    with monkeypatch.context() as mp:
        mp.setitem(sys.modules, "matplotlib", None)  # as if the plots extra were not installed
        files = report.write(result, tmp_path / "noplot")
    assert files["plots"] == [] and "matplotlib is not installed" in (tmp_path / "noplot" / "report.md").read_text()
    doc = json.loads((tmp_path / "noplot" / "results.json").read_text())
    assert len(doc["cells"][1]["streams"]) == 16 and "api_key" not in doc["options"]
    back = report.load(tmp_path / "noplot")
    assert back.cell("prose", 16).aggregate_tps == result.cell("prose", 16).aggregate_tps
    pytest.importorskip("matplotlib")
    files = report.write(result, tmp_path / "plots")
    assert [p.rsplit("/", 1)[1] for p in files["plots"]] == ["aggregate.png", "per_stream.png"]
    assert all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in files["plots"])


def test_mean_row_averages_the_eight_and_leaves_the_ceiling_out() -> None:
    v1 = promptsets.load("v1")
    from sparkfleet.bench.runner import Cell

    result = BenchResult("http://x", "m", v1.summary(), {}, "now")
    for i, cat in enumerate(v1.categories):
        result.cells.append(Cell(cat, 1, cat == "counting", aggregate_tps=10.0 * (i + 1)))
    assert report.mean_row(result, lambda c: c.aggregate_tps) == {1: 45.0}  # (10 + ... + 80) / 8
    md = report.markdown(result)
    assert "| **mean of 8** | **45.0** |" in md and "| counting (ceiling) | 90.0 |" in md
    result.cells[0].error = "boom"
    result.cells[0].aggregate_tps = None
    assert report.mean_row(result, lambda c: c.aggregate_tps) == {1: None}  # a mean of 7 would mislead


def test_prompt_set_v1_is_eight_categories_and_a_counting_ceiling() -> None:
    v1 = promptsets.load("v1")
    assert v1.mean_categories == list(promptsets.V1_CATEGORIES) and v1.ceiling_categories == ["counting"]
    assert v1.sha256 == hashlib.sha256((promptsets.PROMPTS_DIR / "v1.yaml").read_bytes()).hexdigest()
    for p in v1.prompts:
        assert 150 <= p.max_tokens <= 256, p.id
        n = tokens.count(p.text)  # the sim's words-and-punctuation count, a stand-in for the real tokenizer
        assert (250 <= n <= 360) if p.category == "summary" else (30 <= n <= 120), (p.id, n)


def test_user_prompt_sets_are_checked(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("prompts:\n  - {id: a, category: x, text: hi, max_tokens: 10}\n  - {id: a, category: x, text: ho, "
                   "max_tokens: 10}\n")
    with pytest.raises(promptsets.PromptSetError, match=r"prompts\[1\]: id 'a' is used twice"):
        promptsets.load(str(bad))
    bad.write_text("prompts:\n  - {id: a, category: x, text: hi, max_tokens: many}\n")
    with pytest.raises(promptsets.PromptSetError, match="'max_tokens' must be int"):
        promptsets.load(str(bad))
    with pytest.raises(promptsets.PromptSetError, match="shipped sets: v1"):
        promptsets.load(str(tmp_path / "missing.yaml"))
    assert main(["bench", "--profile", "dcp2", "--endpoint", "http://127.0.0.1:9", "--prompt-set",
                 str(bad)]) == 2


def test_bench_cli_writes_results_and_report(lane, tmp_path, capsys) -> None:
    code = main(["bench", "--profile", "dcp2", "--endpoint", lane.url, "--concurrency", "1,2", "--categories",
                 "json,counting", "--max-tokens", "24", "--out", str(tmp_path / "run")])
    printed = capsys.readouterr().out
    assert code == 0
    assert "### Aggregate tok/s" in printed and "| counting (ceiling) |" in printed
    assert (tmp_path / "run" / "results.json").is_file() and (tmp_path / "run" / "report.md").is_file()
    saved = report.load(tmp_path / "run")
    assert saved.profile == "dcp2" and saved.model == MODEL and saved.ok
    assert [(c.category, c.concurrency) for c in saved.cells] == [("json", 1), ("counting", 1), ("json", 2),
                                                                 ("counting", 2)]
    assert main(["bench", "--profile", "dcp2", "--endpoint", lane.url, "--concurrency", "1,x"]) == 2


def test_the_metrics_reader_agrees_with_prometheus_clients_parser(lane, rated) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = lane.http.get(lane.url + "/metrics").text
    ref: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            ref[s.name] = ref.get(s.name, 0.0) + s.value
            if s.name == VLLM.per_pos:
                per_pos[int(s.labels["position"])] = s.value
    snap = vllm_metrics.parse(text)
    assert snap.counters == {k: ref[name] for k, name in VLLM.counters.items()}
    assert snap.per_pos == per_pos and len(per_pos) == 5 and snap.counters["generation_tokens"] > 0


def test_a_starved_client_loop_is_measured_and_named_in_the_caveats() -> None:
    import asyncio

    from sparkfleet.bench.runner import Cell, LoopLag, caveats

    async def blocked() -> float:
        lag = LoopLag()
        watch = asyncio.ensure_future(lag.watch())
        await asyncio.sleep(0.02)
        time.sleep(0.08)  # the loop cannot run: as if the machine gave this process no CPU
        await asyncio.sleep(0.02)
        lag.stop = True
        await watch
        return lag.worst

    assert 0.07 <= asyncio.run(blocked()) < 0.5
    result = BenchResult("http://x", "m", {}, {}, "now", traffic={"seen": False, "our_requests": 2})
    result.cells = [Cell("code", 1, False, wall_s=2.0, client_lag_s=0.01), Cell("code", 8, False, wall_s=2.0,
                                                                              client_lag_s=0.3)]
    (note,) = [c for c in caveats(result) if "event loop fell behind" in c]
    assert "code C8 (300 ms)" in note and "code C1" not in note
