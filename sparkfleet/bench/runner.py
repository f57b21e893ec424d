"""The standard bench: prompt set v1 at concurrency C1..C16, cold prefill, DSpark acceptance.

Method, as the seeds ran it:
- streaming, temperature 0, thinking off, after a warm-up batch that is not recorded (BEN-02);
- at concurrency C, C streams of one category's prompt(s) are released together: one batch per cell
  (BEN-03);
- token counts come from each stream's final usage block, never from chunks (BEN-04); a stream
  without one makes its cell an error;
- per stream, decode tok/s = (tokens - 1) / (last output time - first output time); aggregate =
  all the cell's tokens / batch wall time (release to the last stream's end, TTFT included); TTFT =
  the first output delta after the request was sent (BEN-05);
- cold prefill: a random nonce at the start of fresh random filler (no prefix-cache hit), a 1-token
  reply, tok/s = prompt tokens (usage) / TTFT (BEN-06/07);
- DSpark acceptance and other traffic from /metrics counter deltas (BEN-11, BEN-10).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkfleet.bench import vllm_metrics
from sparkfleet.bench.aclient import AsyncApiClient, Timed, describe
from sparkfleet.bench.promptsets import Prompt, PromptSet
from sparkfleet.gates.client import RequestFailed
from sparkfleet.gates.needle import sentences

DEFAULT_CONCURRENCY = (1, 2, 3, 4, 5, 6, 8, 16)
DEFAULT_PREFILL_TOKENS = (2048, 8192, 32768, 65536)  # BEN-06 targets 2K/8K/32K/64K
WARMUP_TOKENS = 16
PREFILL_TOKENS_PER_WORD = 1.3  # first guess for the filler; /tokenize corrects it when the endpoint has it
PREFILL_ANSWER_ROOM = 16  # tokens left under max_model_len for the reply and the template
SCRAPE_TRIES = 3  # a /metrics scrape that fails is tried this often before the figures are given up
SCRAPE_RETRY_S = 0.5
SETTLE_S = 2.0  # how long the last scrape waits for the engine's counters to catch up with our requests
LAG_SHARE = 0.02  # a cell whose client loop lagged more than this share of its wall time is named in the caveats
# Policy, not a seed figure: repetitions of a cell whose aggregate rates differ by more than this factor are two
# modes, not one noisy number (the seeds' C4 read 122 and 189, a factor 1.55; FM-53).
MODES_RATIO = 1.2
GAUGE_EVERY_S = 0.25  # how often a cell's batch samples the engine's running / waiting gauges (FM-54)
SIM_OWNER = "sparkfleet-sim"  # /v1/models owned_by of the sim engine (sparkfleet/simengine)


@dataclass
class BenchOptions:
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    categories: tuple[str, ...] | None = None  # None: every category of the set
    prefill: bool = False
    prefill_tokens: tuple[int, ...] = DEFAULT_PREFILL_TOKENS
    decode: bool = True  # the concurrency sweep (off: --prefill only)
    warmup: bool = True
    repeat: int = 1  # each cell measured this many times back to back (FM-53)
    max_num_seqs: int | None = None  # the lane's --max-num-seqs, from its profile (FM-54)
    ignore_eos: bool = False  # forced output lengths (every stream runs to its budget)
    max_tokens: int | None = None  # overrides every prompt's budget (quick looks, tests)
    model: str | None = None  # default: the first model /v1/models lists
    api_key: str | None = None
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.concurrency and self.decode:
            raise ValueError("give at least one concurrency")
        if any(c < 1 for c in self.concurrency):
            raise ValueError("concurrency values must be 1 or more")
        if any(n < 16 for n in self.prefill_tokens):
            raise ValueError("prefill lengths must be at least 16 tokens")
        if self.repeat < 1:
            raise ValueError("repeat must be 1 or more")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError("max_tokens must be at least 2 (decode needs tokens after the first)")


@dataclass
class StreamRecord:
    """One request of a cell, raw."""

    category: str
    prompt_id: str
    concurrency: int
    index: int
    sent_s: float | None = None  # after the batch was released
    ttft_s: float | None = None  # first output delta, after this request was sent
    last_s: float | None = None  # last output delta, after this request was sent
    end_s: float | None = None  # stream finished ([DONE]), after the batch was released
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # from the usage block only
    server_tokens: int | None = None  # tokens the server says it decoded (its own `timings`, where it sends them)
    server_decode_tps: float | None = None  # the server's own decode rate for this request (`timings`)
    chunks: int = 0  # chunks that carried output (DSpark packs several tokens into one)
    finish_reason: str | None = None
    decode_tps: float | None = None
    error: str | None = None


@dataclass
class Cell:
    """One (category, concurrency) batch: C streams released together."""

    category: str
    concurrency: int
    ceiling: bool
    wall_s: float | None = None
    tokens: int | None = None
    aggregate_tps: float | None = None
    decode_tps: float | None = None  # mean over the streams
    ttft_s: float | None = None  # mean over the streams
    ttft_max_s: float | None = None
    error: str | None = None
    client_cpu_s: float | None = None  # this process's CPU time while the batch ran (the client's cost)
    client_lag_s: float | None = None  # the event loop's worst lateness while the batch ran (see LoopLag)
    busy_before: float | None = None  # requests running or waiting on the engine just before the release
    engine_requests: float | None = None  # /metrics delta over the cell
    engine_tokens: float | None = None
    acceptance: dict | None = None
    rep: int = 1  # which repetition of the cell this is (bench --repeat)
    running_max: float | None = None  # the engine's most running requests seen while the batch ran (/metrics)
    waiting_max: float | None = None  # ... and most waiting: requests the engine queued (FM-54)
    streams: list[StreamRecord] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class PrefillRecord:
    target: int
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    tps: float | None = None
    timed: str = "ttft"  # ttft | request (the reply carried no text: the whole request time was used)
    sized: str = "estimated"  # tokenize | estimated
    error: str | None = None
    skipped: str | None = None


@dataclass
class BenchResult:
    endpoint: str
    model: str
    prompt_set: dict
    options: dict
    started_at: str
    finished_at: str = ""
    simulated: bool = False
    profile: str | None = None
    lane: dict = field(default_factory=dict)  # uptime_s at the start, from /metrics
    probe: dict | None = None  # the clock/slow-state probe run before the bench, if any
    cells: list[Cell] = field(default_factory=list)
    prefill: list[PrefillRecord] = field(default_factory=list)
    acceptance: dict | None = None  # over the whole run
    traffic: dict = field(default_factory=dict)  # ours vs the engine's counters
    client: dict = field(default_factory=dict)  # the client's own CPU time
    caveats: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cells) and all(p.error is None for p in self.prefill)

    def cell(self, category: str, concurrency: int) -> Cell | None:
        """The cell's first repetition (the one the report's tables and brackets read)."""
        return next((c for c in self.cells if c.category == category and c.concurrency == concurrency), None)

    def reps(self, category: str, concurrency: int) -> list[Cell]:
        return [c for c in self.cells if c.category == category and c.concurrency == concurrency]

    def as_dict(self) -> dict:
        doc = asdict(self)
        doc["ok"] = self.ok
        return doc

    @classmethod
    def from_dict(cls, doc: dict) -> BenchResult:
        """Read a result back from its JSON (for reports and brackets)."""
        doc = dict(doc)
        doc.pop("ok", None)
        cells = []
        for c in doc.pop("cells", []):
            c = dict(c)
            c["streams"] = [StreamRecord(**s) for s in c.get("streams", [])]
            cells.append(Cell(**c))
        prefill = [PrefillRecord(**p) for p in doc.pop("prefill", [])]
        return cls(**doc, cells=cells, prefill=prefill)


Progress = Callable[[str, Any], None]  # ("cell", Cell) | ("prefill", PrefillRecord) | ("note", str)


def body_for(model: str, prompt: Prompt, max_tokens: int, ignore_eos: bool) -> dict:
    """A chat body at temperature 0 with thinking off (lanes differ in their default, OQ-04)."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt.text}],
                            "max_tokens": max_tokens, "temperature": 0, "chat_template_kwargs": {"thinking": False}}
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's sampling extra: run to max_tokens (the knee's forced lengths)
    return body


def stream_record(timed: Timed | BaseException, released: float, base: StreamRecord) -> StreamRecord:
    """Fill a stream's record from its reply (or its failure)."""
    rec = base
    if isinstance(timed, BaseException):
        rec.error = describe(timed)
        return rec
    reply = timed.reply
    rec.sent_s = timed.sent - released
    rec.end_s = timed.ended - released
    rec.ttft_s, rec.last_s, rec.chunks = reply.ttft_s, reply.last_s, reply.chunks
    rec.finish_reason = reply.finish_reason
    rec.prompt_tokens, rec.completion_tokens = reply.prompt_tokens, reply.completion_tokens
    predicted = (reply.timings or {}).get("predicted_n")
    rec.server_tokens = predicted if isinstance(predicted, int) else None
    rate = (reply.timings or {}).get("predicted_per_second")
    rec.server_decode_tps = float(rate) if isinstance(rate, int | float) else None
    if rec.completion_tokens is None:
        rec.error = ("no usage block in the stream: token counts come only from it (chunks carry several "
                     "tokens), so this cell is not measured")
    elif rec.ttft_s is None:
        rec.error = f"the stream carried no output ({rec.completion_tokens} tokens in its usage block)"
    elif rec.completion_tokens >= 2 and rec.last_s is not None and rec.last_s > rec.ttft_s:
        rec.decode_tps = (rec.completion_tokens - 1) / (rec.last_s - rec.ttft_s)
    return rec


def summarize(cell: Cell, released: float, ended: float | None) -> Cell:
    """Aggregate, mean per-stream decode and TTFT of a cell whose streams are filled in."""
    bad = [s for s in cell.streams if s.error]
    if bad:
        more = f" (and {len(bad) - 1} more stream(s))" if len(bad) > 1 else ""
        cell.error = f"stream {bad[0].index}: {bad[0].error}{more}"
        return cell
    tokens = [s.completion_tokens or 0 for s in cell.streams]
    cell.tokens = sum(tokens)
    assert ended is not None
    cell.wall_s = ended - released
    cell.aggregate_tps = cell.tokens / cell.wall_s if cell.wall_s > 0 else None
    decodes = [s.decode_tps for s in cell.streams if s.decode_tps is not None]
    cell.decode_tps = statistics.fmean(decodes) if decodes else None
    ttfts = [s.ttft_s for s in cell.streams if s.ttft_s is not None]
    cell.ttft_s = statistics.fmean(ttfts) if ttfts else None
    cell.ttft_max_s = max(ttfts) if ttfts else None
    return cell


class LoopLag:
    """How late the event loop runs a short sleep while a batch streams.

    Every timestamp the client takes is when the loop got round to a chunk, not when it arrived. A loop
    that is late by L seconds (too many chunks at once, or a machine too busy to give this process a
    CPU) may have stamped chunks up to L late: the cell's timings are uncertain by about that much."""

    INTERVAL = 0.005

    def __init__(self) -> None:
        self.worst = 0.0
        self.stop = False

    async def watch(self) -> None:
        while not self.stop:
            t0 = time.perf_counter()
            await asyncio.sleep(self.INTERVAL)
            self.worst = max(self.worst, time.perf_counter() - t0 - self.INTERVAL)


class Gauges:
    """The engine's running / waiting gauges, sampled while a batch runs: one scrape at a time, each tried once
    (a missed sample only leaves the maximum lower), until `stop`."""

    def __init__(self, bench: Bench) -> None:
        self.bench, self.stop = bench, False
        self.running: float | None = None
        self.waiting: float | None = None

    async def watch(self) -> None:
        client = self.bench.client
        while not self.stop and self.bench.metrics_ok:
            try:
                status, text, _ = await client.get_text("/metrics")
                snap = vllm_metrics.parse(text) if status == 200 else None
            except (RequestFailed, ValueError):
                snap = None
            if snap is not None and "running" in snap.gauges:
                self.running = max(self.running or 0.0, snap.gauges["running"])
                self.waiting = max(self.waiting or 0.0, snap.gauges.get("waiting", 0.0))
            await asyncio.sleep(GAUGE_EVERY_S)


class Bench:
    """One bench run against one endpoint (use `run_bench`)."""

    def __init__(self, base_url: str, pset: PromptSet, opts: BenchOptions, progress: Progress | None = None,
                 *, profile: str | None = None, probe: dict | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.pset = pset.only(list(opts.categories)) if opts.categories else pset
        self.opts = opts
        self.progress = progress or (lambda kind, item: None)
        self.profile = profile
        self.probe = probe
        self.client = AsyncApiClient(self.base_url, opts.api_key, timeout_s=opts.timeout_s,
                                     max_streams=max([*opts.concurrency, 1]))
        self.metrics_ok = True
        self.max_model_len: int | None = None

    # ------------------------------------------------------------------------------------ endpoint

    async def scrape(self) -> vllm_metrics.Snapshot | None:
        """The engine's counters now; None (for the rest of the run, said once) when /metrics stays unreadable.

        A failed scrape is tried again (SCRAPE_TRIES in all) before the figures are given up: one refused or
        dropped connection between two cells must not cost the whole run its traffic accounting."""
        if not self.metrics_ok:
            return None
        for attempt in range(1, SCRAPE_TRIES + 1):
            try:
                status, text, _ = await self.client.get_text("/metrics")
                if status != 200:
                    raise RequestFailed(f"HTTP {status}: {text[:120]}")
                return vllm_metrics.parse(text)
            except (RequestFailed, ValueError) as exc:
                if attempt < SCRAPE_TRIES:
                    await asyncio.sleep(SCRAPE_RETRY_S)
                    continue
                self.metrics_ok = False
                self.progress("note", f"/metrics unreadable after {SCRAPE_TRIES} tries ({exc}): no acceptance or "
                              "traffic figures")
        return None

    async def model_and_flags(self) -> tuple[str, bool]:
        """The model to send and whether the endpoint is the sparkfleet simulation."""
        status, text, headers = await self.client.get_text("/v1/models")
        if status != 200:
            raise RequestFailed(f"GET /v1/models: HTTP {status}: {text[:200]}", status)
        try:
            cards = [m for m in json.loads(text).get("data", []) if isinstance(m, dict)]
        except (ValueError, AttributeError):
            raise RequestFailed("GET /v1/models: not an OpenAI model list") from None
        if not cards:
            raise RequestFailed("GET /v1/models lists no model")
        model = self.opts.model or str(cards[0].get("id"))
        card = next((m for m in cards if m.get("id") == model), None)
        if card is None:
            raise RequestFailed(f"the endpoint does not serve {model!r} (it lists "
                                f"{', '.join(str(m.get('id')) for m in cards)})")
        if isinstance(card.get("max_model_len"), int):
            self.max_model_len = card["max_model_len"]
        simulated = headers.get("x-sparkfleet-sim") == "1" or any(m.get("owned_by") == SIM_OWNER for m in cards)
        return model, simulated

    # ------------------------------------------------------------------------------------ batches

    async def batch(self, bodies: list[dict]) -> tuple[float, list[Timed | BaseException], float]:
        """Release every body at once; returns the release time, each stream's outcome and the event
        loop's worst lag while they ran."""
        go = asyncio.Event()

        async def one(body: dict) -> Timed:
            await go.wait()
            return await self.client.stream(body)

        tasks = [asyncio.ensure_future(one(b)) for b in bodies]
        await asyncio.sleep(0)  # every task is now parked on `go`: they leave together
        lag = LoopLag()
        watch = asyncio.ensure_future(lag.watch())
        released = time.perf_counter()
        go.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        lag.stop = True
        await watch
        return released, results, lag.worst

    async def warmup(self, model: str) -> None:
        """One unrecorded batch at the largest concurrency: opens every connection, wakes the engine."""
        prompts = [p for c in self.pset.categories for p in self.pset.by_category(c)]
        width = max(self.opts.concurrency) if self.opts.decode else 1
        bodies = [body_for(model, prompts[i % len(prompts)], WARMUP_TOKENS, False) for i in range(width)]
        _, results, _ = await self.batch(bodies)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            self.progress("note", f"warm-up: {len(failed)} of {len(bodies)} request(s) failed: {describe(failed[0])}")

    async def cell(self, model: str, category: str, concurrency: int) -> Cell:
        prompts = self.pset.by_category(category)
        ceiling = all(p.ceiling for p in prompts)
        cell = Cell(category, concurrency, ceiling)
        chosen = [prompts[i % len(prompts)] for i in range(concurrency)]
        bodies = [body_for(model, p, self.opts.max_tokens or p.max_tokens, self.opts.ignore_eos) for p in chosen]
        before = await self.scrape()
        if before is not None:
            cell.busy_before = before.gauges.get("running", 0.0) + before.gauges.get("waiting", 0.0)
        cpu0 = time.process_time()
        gauges = Gauges(self)
        sampler = asyncio.ensure_future(gauges.watch())
        released, results, cell.client_lag_s = await self.batch(bodies)
        gauges.stop = True
        await sampler
        cell.running_max, cell.waiting_max = gauges.running, gauges.waiting
        cell.client_cpu_s = time.process_time() - cpu0
        ended = [r.ended for r in results if isinstance(r, Timed)]
        cell.streams = [stream_record(r, released, StreamRecord(category, p.id, concurrency, i))
                        for i, (r, p) in enumerate(zip(results, chosen, strict=True))]
        summarize(cell, released, max(ended) if ended else None)
        after = await self.scrape()
        if before is not None and after is not None:
            delta = after.delta(before)
            cell.engine_requests, cell.engine_tokens = delta.get("requests"), delta.get("generation_tokens")
            cell.acceptance = delta.acceptance()
        return cell

    # ------------------------------------------------------------------------------------ prefill

    async def count_tokens(self, model: str, text: str) -> int | None:
        """vLLM's /tokenize count of a chat prompt (template applied), or None without the route."""
        try:
            status, doc = await self.client.post_json("/tokenize", {
                "model": model, "messages": [{"role": "user", "content": text}], "add_generation_prompt": True})
        except RequestFailed:
            return None
        count = doc.get("count") if status == 200 and isinstance(doc, dict) else None
        return count if isinstance(count, int) else None

    @staticmethod
    def prefill_text(rng: random.Random, words: int) -> str:
        """A random nonce first (no prefix-cache hit from the first block on), then random-word filler."""
        return (f"[{secrets.token_hex(8)}] " + " ".join(sentences(rng, words))
                + "\n\nReply with one word: done.")

    async def prefill_one(self, model: str, target: int, per_word: float | None) -> PrefillRecord:
        rec = PrefillRecord(target)
        if self.max_model_len is not None and target + PREFILL_ANSWER_ROOM > self.max_model_len:
            rec.skipped = f"longer than the endpoint's max_model_len {self.max_model_len:,}"
            return rec
        rng = random.Random(secrets.randbits(64))
        words = max(8, round(target / (per_word or PREFILL_TOKENS_PER_WORD)))
        text = self.prefill_text(rng, words)
        if per_word is not None:
            # One correction from /tokenize (before anything is timed): a new nonce and filler each time.
            count = await self.count_tokens(model, text)
            if count:
                words = max(8, round(words * target / count))
                text = self.prefill_text(random.Random(secrets.randbits(64)), words)
                rec.sized = "tokenize"
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1, "temperature": 0,
                "chat_template_kwargs": {"thinking": False}}
        try:
            timed = await self.client.stream(body)
        except RequestFailed as exc:
            rec.error = str(exc)
            return rec
        reply = timed.reply
        rec.prompt_tokens = reply.prompt_tokens
        if rec.prompt_tokens is None:
            rec.error = "no usage block in the stream: the prompt's token count comes only from it"
            return rec
        if reply.ttft_s is None:
            rec.ttft_s, rec.timed = reply.elapsed_s, "request"
        else:
            rec.ttft_s = reply.ttft_s
        rec.tps = rec.prompt_tokens / rec.ttft_s if rec.ttft_s > 0 else None
        return rec

    async def prefill(self, model: str) -> list[PrefillRecord]:
        probe = self.prefill_text(random.Random(secrets.randbits(64)), 400)
        count = await self.count_tokens(model, probe)
        per_word = count / 400 if count else None
        out = []
        for target in self.opts.prefill_tokens:
            rec = await self.prefill_one(model, target, per_word)
            self.progress("prefill", rec)
            out.append(rec)
        return out

    # ------------------------------------------------------------------------------------ the run

    async def run(self) -> BenchResult:
        opts = self.opts
        cpu0, wall0 = time.process_time(), time.perf_counter()
        started = dt.datetime.now(dt.UTC)
        try:
            model, simulated = await self.model_and_flags()
            result = BenchResult(self.base_url, model, self.pset.summary(), _options_doc(opts),
                                 started.isoformat(timespec="seconds"), simulated=simulated, profile=self.profile,
                                 probe=self.probe)
            first = await self.scrape()
            if first is not None and first.started is not None:
                result.lane = {"uptime_s": max(0.0, time.time() - first.started), "source": "/metrics"}
            if opts.warmup:
                await self.warmup(model)
            before = await self.scrape()
            sent0, tokens0 = self.client.requests_sent, self.client.tokens_seen
            missing0 = self.client.usage_missing
            if opts.decode:
                for c in opts.concurrency:
                    for category in self.pset.categories:
                        for n in range(1, opts.repeat + 1):  # back to back: a mode that flips shows up here
                            cell = await self.cell(model, category, c)
                            cell.rep = n
                            result.cells.append(cell)
                            self.progress("cell", cell)
            if opts.prefill:
                result.prefill = await self.prefill(model)
            result.traffic, after = await self.traffic(before, self.client.requests_sent - sent0,
                                                       self.client.tokens_seen - tokens0,
                                                       self.client.usage_missing - missing0)
            if before is not None and after is not None:
                result.acceptance = after.delta(before).acceptance()
        finally:
            await self.client.aclose()
        measured = [c for c in result.cells if c.ok and c.client_cpu_s is not None]
        tokens = sum(c.tokens or 0 for c in measured)
        streaming = sum(c.client_cpu_s or 0.0 for c in measured)
        result.client = {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0,
                         "streaming_cpu_s": streaming, "tokens": tokens,
                         "cpu_us_per_token": streaming / tokens * 1e6 if tokens else None,
                         "loop_lag_max_s": max((c.client_lag_s or 0.0 for c in measured), default=None)}
        result.finished_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        result.caveats = caveats(result)
        return result

    async def traffic(self, before: vllm_metrics.Snapshot | None, ours: int, our_tokens: int,
                      no_usage: int) -> tuple[dict, vllm_metrics.Snapshot | None]:
        """Our requests and tokens against the engine's counter deltas since after the warm-up.

        The engine may count a request a moment after its stream ended, so the last scrape waits (up to
        SETTLE_S) until the engine has counted at least ours."""
        doc: dict[str, Any] = {"our_requests": ours, "our_tokens": our_tokens if not no_usage else None}
        if before is None:
            doc["seen"] = None
            return doc, None
        deadline = time.monotonic() + SETTLE_S
        while True:
            after = await self.scrape()
            if after is None:
                doc["seen"] = None
                return doc, None
            delta = after.delta(before)
            requests, tokens = delta.get("requests"), delta.get("generation_tokens")
            if delta.restarted or requests is None or requests >= ours or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        doc.update(engine_requests=requests, engine_tokens=tokens, restarted=delta.restarted)
        other_requests = None if requests is None else max(0.0, requests - ours)
        other_tokens = None if tokens is None or no_usage else max(0.0, tokens - our_tokens)
        doc["other_requests"], doc["other_tokens"] = other_requests, other_tokens
        doc["seen"] = bool(delta.restarted or (other_requests or 0) > 0 or (other_tokens or 0) > 0)
        return doc, after


def _options_doc(opts: BenchOptions) -> dict:
    doc = asdict(opts)
    doc.pop("api_key", None)  # a secret never goes into a result file
    return doc


def run_bench(base_url: str, pset: PromptSet, opts: BenchOptions, progress: Progress | None = None, *,
              profile: str | None = None, probe: dict | None = None) -> BenchResult:
    """Run the bench (blocking)."""
    return asyncio.run(Bench(base_url, pset, opts, progress, profile=profile, probe=probe).run())


# ---------------------------------------------------------------------------------------------- caveats


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def caveats(result: BenchResult) -> list[str]:
    """The notes the seeds printed with every result table (BEN-10), filled in from this run."""
    out = []
    if result.simulated:
        out.append("THE ENDPOINT IS A SIMULATION (sparkfleet sim engine): these numbers say nothing about "
                   "hardware.")
    repeat = int(result.options.get("repeat") or 1)
    if result.cells and repeat == 1:
        out.append("One batch per cell: every number is a single measurement. The GB10 slow state alone can move "
                   "a cell by up to ~1.5x (counting at C1: 62.2 in one run, 92.2 back to back); a cell can also "
                   "be bimodal, which only repetitions show (`--repeat 2`, docs/failure-modes.md FM-53).")
    elif result.cells:
        out.append(f"Every cell was measured {repeat} times back to back; the tables show the first repetition, "
                   "results.json holds every one.")
        out.extend(modes(result))
    out.extend(capped(result))
    probe = result.probe
    if probe is None:
        out.append("Clock latch / slow state: not probed before this run (run `sparkfleet bench --probe` or "
                   "`sparkfleet check --probe` first and keep its result with these numbers).")
    else:
        out.append(f"Clock latch / slow state probed before the run: {probe.get('summary', probe)}")
    uptime = result.lane.get("uptime_s")
    if uptime is not None:
        out.append(f"The lane had been up {_hours(uptime)} when the run started (from /metrics); a fresh lane and "
                   "one up for 15 h differed by ~30% in prefill in the seeds.")
    else:
        out.append("Lane uptime unknown (/metrics gave no start time).")
    t = result.traffic
    if t.get("seen") is None:
        out.append("Other traffic on the endpoint: unknown (no /metrics counters to compare with).")
    elif t.get("restarted"):
        out.append("The engine's counters went backwards during the run: it restarted; the run is not one lane.")
    elif t["seen"]:
        extra = [f"{t['other_requests']:.0f} request(s)" if t.get("other_requests") else "",
                 f"{t['other_tokens']:.0f} generated token(s)" if t.get("other_tokens") else ""]
        out.append("Other traffic was seen on the endpoint during the run (/metrics counted "
                   + " and ".join(x for x in extra if x) + " that were not ours): cells may have moved.")
    else:
        out.append(f"No other traffic seen on the endpoint during the run (/metrics counted only our "
                   f"{t['our_requests']} request(s)).")
    lagged = [f"{c.category} C{c.concurrency} ({1000 * c.client_lag_s:.0f} ms)" for c in result.cells
              if c.ok and c.client_lag_s is not None and c.wall_s and c.client_lag_s > LAG_SHARE * c.wall_s]
    if lagged:
        out.append(f"The client's event loop fell behind by more than {LAG_SHARE:.0%} of the batch time in: "
                   + ", ".join(lagged) + ". Its timestamps there may be late by that much: run the bench from a "
                   "machine that is not busy.")
    busy = [f"{c.category} C{c.concurrency}" for c in result.cells if c.busy_before]
    if busy:
        out.append("Requests were already running when these cells were released: " + ", ".join(busy) + ".")
    if result.options.get("ignore_eos"):
        out.append("Forced output lengths (ignore_eos): every stream ran to its budget.")
    if result.prefill:
        out.append("Prefill: one cold request per length (fresh nonce and filler, no prefix-cache hit); "
                   "tok/s = prompt tokens / TTFT.")
    return out


def modes(result: BenchResult) -> list[str]:
    """A caveat per cell whose repetitions fall into two modes (fastest / slowest aggregate > MODES_RATIO)."""
    out = []
    for key in dict.fromkeys((c.category, c.concurrency) for c in result.cells):
        rates = [c.aggregate_tps for c in result.reps(*key) if c.ok and c.aggregate_tps]
        if len(rates) >= 2 and max(rates) > MODES_RATIO * min(rates):
            shown = " / ".join(f"{r:.1f}" for r in rates)
            out.append(f"{key[0]} C{key[1]} is bimodal: {shown} tok/s aggregate over {len(rates)} repetitions "
                       f"(fastest {max(rates) / min(rates):.2f}x the slowest, over {MODES_RATIO:g}x): two modes, "
                       "not one figure; do not average them (docs/failure-modes.md FM-53).")
    return out


def capped(result: BenchResult) -> list[str]:
    """Cells above the lane's --max-num-seqs, or where the engine queued requests: they read the cap (FM-54)."""
    cap = result.options.get("max_num_seqs")
    over = sorted({c.concurrency for c in result.cells if cap and c.concurrency > cap})
    queued = sorted({c.concurrency for c in result.cells if c.waiting_max})
    if not over and not queued:
        return []
    seen: dict[int, tuple[float, float]] = {}
    for c in result.cells:  # the most the engine held at each concurrency, over categories and repetitions
        if c.running_max is not None:
            r, w = seen.get(c.concurrency, (0.0, 0.0))
            seen[c.concurrency] = (max(r, c.running_max), max(w, c.waiting_max or 0.0))
    engine = "; ".join(f"C{k}: at most {r:.0f} running, {w:.0f} waiting" for k in sorted(set(over) | set(queued))
                       if k in seen for r, w in [seen[k]])
    why = (f"above the lane's --max-num-seqs {cap}" if over else "where the engine queued requests") + \
        f": C{', C'.join(map(str, sorted(set(over) | set(queued))))}"
    return [f"Cells {why} (the engine's /metrics: {engine or 'not read'}). The engine runs at most its cap at "
            "once and queues the rest, so these cells read the cap (a flat line), not the lane at that "
            "concurrency (docs/failure-modes.md FM-54)."]
