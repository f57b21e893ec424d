"""How much the bench's async client costs, and up to what aggregate rate it measures accurately.

Against a SIMULATED engine (sparkfleet/simengine) paced at an exact per-stream rate R
(--decode-tokens-per-s), at C16 and C64, this runs one bench cell per target aggregate (C x R) and prints:

- the client's CPU time per generated token while the batch streamed (process_time of this process;
  the engine runs in its own process), and the engine's CPU per token read from /proc in the same run
  (the baseline the ratio is against);
- the measured per-stream decode tok/s against R, and the measured aggregate against the configured one
  given when the streams' first tokens came (latest first token + (T - 1) / R);
- the engine's own per-stream rate from its /metrics (request_decode_time_seconds), to tell a client
  that falls behind from an engine that does;
- the client's CPU share of the batch time and its event loop's worst lag (a loop that could not run:
  a busy machine, not the client's own work, when the CPU share is low);
- first, the client's CPU per chunk with no socket at all (httpx MockTransport into the StreamParser).

"accurate" = both the decode and the aggregate within 2%. Run from the repository root:

    .venv/bin/python bench/bench_client_overhead.py [--concurrency 16,64] [--aggregate 1000,2500,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sparkfleet.bench import promptsets, vllm_metrics  # noqa: E402
from sparkfleet.bench.aclient import AsyncApiClient  # noqa: E402
from sparkfleet.bench.runner import Bench, BenchOptions  # noqa: E402

TOLERANCE = 0.02
PROMPT = 'prompts:\n  - {id: rivers, category: prose, max_tokens: 64, text: "Write about rivers and towns."}\n'
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def start_engine(rate: float, seqs: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "sparkfleet.simengine", "--rank", "0", "--world-size", "1", "--master-port",
            str(free_port()), "--host", "127.0.0.1", "--port", str(port), "--served-name", "sim",
            "--kv-tokens", "50000000", "--boot-seconds", "0.05", "--max-num-seqs", str(seqs),
            "--decode-tokens-per-s", str(rate), "--prefill-tokens-per-s", "5000000", "--stats-interval", "60"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"the sim engine did not come up; see {log}")


def engine_decode_rate(text_before: str, text_after: str, tokens_after_first: int) -> float | None:
    """Tokens after the first over the engine's own summed decode time (first token to end, per request)."""
    def total(text: str) -> float:
        return sum(v for name, _, v in vllm_metrics.samples(text) if name == "vllm:request_decode_time_seconds_sum")

    spent = total(text_after) - total(text_before)
    return tokens_after_first / spent if spent > 0 else None


async def parse_only(chunks: int = 2000, reps: int = 5) -> float:
    """CPU per chunk of the client with no socket: a canned SSE body through httpx's MockTransport into
    the shared StreamParser (what reading costs before any network or event-loop wake-up)."""
    chunk = {"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0, "model": "sim",
             "choices": [{"index": 0, "delta": {"content": " rivers and towns"}, "logprobs": None,
                          "finish_reason": None}]}
    usage = {"id": "chatcmpl-0", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3 * chunks,
                                                          "total_tokens": 5 + 3 * chunks}}
    events = [f"data: {json.dumps(chunk)}\n\n".encode()] * chunks + [f"data: {json.dumps(usage)}\n\n".encode(),
                                                                      b"data: [DONE]\n\n"]

    class Body(httpx.AsyncByteStream):
        async def __aiter__(self):  # one event per read, as a paced engine sends them
            for event in events:
                yield event

    client = AsyncApiClient("http://sim", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, stream=Body(), headers={"content-type": "text/event-stream"})))
    await client.stream({"model": "sim"})
    t0 = time.process_time()
    for _ in range(reps):
        timed = await client.stream({"model": "sim"})
    spent = (time.process_time() - t0) / reps
    await client.aclose()
    assert timed.reply.completion_tokens == 3 * chunks and timed.reply.chunks == chunks
    return spent / chunks


async def one_cell(url: str, pset: promptsets.PromptSet, c: int, tokens: int, pid: int) -> dict:
    bench = Bench(url, pset, BenchOptions(concurrency=(c,), ignore_eos=True, max_tokens=tokens))
    try:
        await bench.warmup("sim")
        before = (await bench.client.get_text("/metrics"))[1]
        engine0 = cpu_seconds(pid)
        cell = await bench.cell("sim", "prose", c)
        engine_cpu = cpu_seconds(pid) - engine0
        after = (await bench.client.get_text("/metrics"))[1]
    finally:
        await bench.client.aclose()
    if not cell.ok:
        raise SystemExit(f"C{c}: {cell.error}")
    return {"cell": cell, "engine_cpu": engine_cpu,
            "engine_rate": engine_decode_rate(before, after, sum((s.completion_tokens or 1) - 1 for s in cell.streams))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--aggregate", default="2500,5000,7500,10000,15000,20000",
                    help="target aggregate tok/s (C x per-stream rate)")
    ap.add_argument("--seconds", type=float, default=3.0, help="decode time per stream")
    args = ap.parse_args()
    cs = [int(x) for x in args.concurrency.split(",")]
    targets = [float(x) for x in args.aggregate.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="sf-client-overhead-"))
    (tmp / "prompts.yaml").write_text(PROMPT)
    pset = promptsets.load(str(tmp / "prompts.yaml"))
    print(f"sparkfleet bench client overhead (SIMULATED engine; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f} at start)")
    print(f"parsing only (httpx MockTransport -> StreamParser, no socket): "
          f"{asyncio.run(parse_only()) * 1e6:.1f} us per chunk")
    print(f"{'C':>3} {'target':>7} {'R':>6} {'T':>5} | {'decode':>7} {'err':>6} | {'aggregate':>9} {'expected':>9} "
          f"{'err':>6} | {'engine R':>8} | {'client us/tok':>13} {'engine us/tok':>13} {'ratio':>5} "
          f"{'client CPU':>10} {'loop lag':>8} | accurate")
    best: dict[int, float] = {}
    for c in cs:
        for target in targets:
            rate = target / c
            tokens = max(32, round(rate * args.seconds) + 1)
            proc, url = start_engine(rate, c, tmp / f"engine-{c}-{int(target)}.log")
            try:
                r = asyncio.run(one_cell(url, pset, c, tokens, proc.pid))
            finally:
                proc.terminate()
                proc.wait(10)
            cell = r["cell"]
            decode_s = (tokens - 1) / rate
            latest_first = max(s.sent_s + s.ttft_s for s in cell.streams)
            expected = cell.tokens / (latest_first + decode_s)
            d_err = cell.decode_tps / rate - 1
            a_err = cell.aggregate_tps / expected - 1
            client_us = cell.client_cpu_s / cell.tokens * 1e6
            engine_us = r["engine_cpu"] / cell.tokens * 1e6
            ok = abs(d_err) <= TOLERANCE and abs(a_err) <= TOLERANCE
            if ok:
                best[c] = max(best.get(c, 0.0), cell.aggregate_tps)
            engine_rate = r["engine_rate"]
            print(f"{c:>3} {target:>7.0f} {rate:>6.1f} {tokens:>5} | {cell.decode_tps:>7.1f} {100 * d_err:>+5.1f}% | "
                  f"{cell.aggregate_tps:>9.0f} {expected:>9.0f} {100 * a_err:>+5.1f}% | "
                  f"{engine_rate if engine_rate else float('nan'):>8.1f} | {client_us:>13.1f} {engine_us:>13.1f} "
                  f"{client_us / engine_us:>5.2f} {100 * cell.client_cpu_s / cell.wall_s:>9.0f}% "
                  f"{1000 * cell.client_lag_s:>6.0f}ms | {'yes' if ok else 'NO'}")
    for c in cs:
        print(f"C{c}: highest aggregate measured within 2%: "
              + (f"{best[c]:,.0f} tok/s" if c in best else "none"))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
