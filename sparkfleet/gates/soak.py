"""soak: N concurrent streams for T minutes, every prompt uniquely tagged and every answer checked (HLT-44).

The tag opens each prompt, so not even the first KV block is shared with another request and the
prefix cache cannot hide a failure. Tasks have one right answer (count 1..k for a random k, a sum,
a product); a wrong answer, an HTTP error or a broken stream is an error, and zero are allowed.
Requests, errors, TTFT and decode tok/s percentiles are reported (tokens from usage blocks).

MemAvailable on every node of the lane is sampled during the soak through an injectable sampler;
a node under its floor, or within a margin of earlyoom's SIGTERM line, fails the gate and stops the
load at once (earlyoom would otherwise kill the engine, docs/failure-modes.md FM-15; HLT-23/24).
"""

from __future__ import annotations

import math
import random
import secrets
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkfleet.fleet.gather import gather_ops
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.gates.client import ApiClient, RequestFailed, clip
from sparkfleet.gates.env import GateEnv, MemSample, MemSampler, user
from sparkfleet.gates.result import Check, GateResult, verdict
from sparkfleet.gates.text import judge_count, judge_number

if TYPE_CHECKING:
    from sparkfleet.fleet.op import Executor
    from sparkfleet.schema.inventory import Node

NAME = "soak"
GB = 10**9
# Same margin as the after-load expectation: MemAvailable must stay this far above earlyoom's SIGTERM line.
EARLYOOM_MARGIN_BYTES = int(1 * GB)
MAX_TOKENS = 400  # count to 60 is the longest answer: about 180 tokens
ERROR_EXAMPLES = 5


@dataclass
class Task:
    tag: str
    prompt: str
    check: Callable[[str], tuple[bool, str]]


def make_task(rng: random.Random) -> Task:
    """A uniquely tagged prompt with one right answer."""
    tag = "".join(rng.choice(string.ascii_lowercase) for _ in range(12))  # letters only: no stray numbers
    kind = rng.choice(("count", "sum", "product"))
    if kind == "count":
        k = rng.randint(5, 60)
        prompt = f"[{tag}] Count from 1 to {k}, separated by commas. Reply with the numbers only."
        return Task(tag, prompt, lambda text: judge_count(text, 1, k))
    if kind == "sum":
        a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
        prompt = f"[{tag}] What is {a} + {b}? Reply with the number only."
        return Task(tag, prompt, lambda text: judge_number(text, a + b))
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    prompt = f"[{tag}] What is {a} * {b}? Reply with the number only."
    return Task(tag, prompt, lambda text: judge_number(text, a * b))


@dataclass
class Outcome:
    ok: bool
    why: str
    task: Task
    got: str = ""
    ttft_s: float | None = None
    tokens: int | None = None
    decode_tps: float | None = None
    usage_missing: bool = False


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(p / 100 * len(ordered))))
    return ordered[rank - 1]


def one_request(client: ApiClient, env: GateEnv, task: Task) -> Outcome:
    body = env.body(user(task.prompt), max_tokens=MAX_TOKENS)
    try:
        reply = client.stream(body)
    except RequestFailed as exc:
        return Outcome(False, str(exc), task)
    ok, why = task.check(reply.content)
    if not ok and reply.finish_reason == "length":
        why += " (cut at max_tokens)"
    tokens = reply.completion_tokens
    tps = None
    if tokens and tokens > 1 and reply.ttft_s is not None and reply.last_s is not None \
            and reply.last_s > reply.ttft_s:
        tps = (tokens - 1) / (reply.last_s - reply.ttft_s)  # decode rate: tokens after the first over their time
    return Outcome(ok, why, task, clip(reply.content, 120), reply.ttft_s, tokens, tps, reply.usage is None)


@dataclass
class NodeMemory:
    floor: int | None = None
    sigterm: int | None = None
    first: int | None = None
    last: int | None = None
    low: int | None = None
    samples: int = 0
    errors: list[str] = field(default_factory=list)
    breach: str | None = None


def judge_memory(node: str, s: MemSample, at_s: float) -> str | None:
    """Why this sample fails (under the floor, or near earlyoom's SIGTERM line), else None."""
    if s.available is None:
        return None
    if s.floor is not None and s.available < s.floor:
        return f"{node}: MemAvailable {s.available / GB:.2f} GB under its floor {s.floor / GB:.2f} GB at {at_s:.0f} s"
    if s.sigterm is not None and s.available < s.sigterm + EARLYOOM_MARGIN_BYTES:
        return (f"{node}: MemAvailable {s.available / GB:.2f} GB within {EARLYOOM_MARGIN_BYTES / GB:.0f} GB of "
                f"earlyoom's SIGTERM line {s.sigterm / GB:.2f} GB at {at_s:.0f} s")
    return None


class MemoryWatch:
    """Samples every node on a thread; a breach sets `stop` so the load ends before earlyoom acts."""

    def __init__(self, sampler: MemSampler, period_s: float, stop: threading.Event) -> None:
        self.sampler, self.period_s, self.stop = sampler, period_s, stop
        self.nodes: dict[str, NodeMemory] = {}
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._loop, name="soak-memory", daemon=True)
        self.done = threading.Event()

    def sample(self) -> None:
        at = time.monotonic() - self.t0
        try:
            samples = self.sampler()
        except Exception as exc:  # a sampler must never take the soak down; its failure is evidence
            self.nodes.setdefault("(sampler)", NodeMemory()).errors.append(f"{type(exc).__name__}: {exc}")
            return
        for node, s in samples.items():
            m = self.nodes.setdefault(node, NodeMemory())
            if s.error or s.available is None:
                m.errors.append(s.error or "no MemAvailable")
                continue
            m.floor, m.sigterm = s.floor, s.sigterm
            m.first = s.available if m.first is None else m.first
            m.last = s.available
            m.low = s.available if m.low is None else min(m.low, s.available)
            m.samples += 1
            why = judge_memory(node, s, at)
            if why and m.breach is None:
                m.breach = why
                self.stop.set()

    def _loop(self) -> None:
        while not self.done.wait(self.period_s):
            self.sample()

    def start(self) -> None:
        self.sample()  # a baseline before the load
        self.thread.start()

    def finish(self) -> None:
        self.done.set()
        self.thread.join()
        self.sample()  # and one after it

    def checks(self) -> list[Check]:
        out = []
        for node, m in sorted(self.nodes.items()):
            lines = []
            if m.floor is not None:
                lines.append(f"floor {m.floor / GB:.2f} GB")
            if m.sigterm is not None:
                lines.append(f"earlyoom SIGTERM {m.sigterm / GB:.2f} GB + {EARLYOOM_MARGIN_BYTES / GB:.0f} GB margin")
            got = (f"MemAvailable {m.first / GB:.2f} → {m.last / GB:.2f} GB (lowest {m.low / GB:.2f} GB), "
                   f"{m.samples} sample(s)") if m.samples and m.first is not None and m.last is not None \
                and m.low is not None else "no sample"
            if m.errors:
                got += f"; {len(m.errors)} failed: {m.errors[-1]}"
            check = Check(f"memory {node}", None, sent="; ".join(lines) or "no floor, no earlyoom line known", got=got)
            if m.breach:
                check.ok, check.why = False, m.breach + " (the load was stopped)"
            elif not m.samples:
                check.ok, check.why = False, "MemAvailable could not be read during the soak"
            else:
                check.ok, check.why = True, "stayed clear of its floor and earlyoom's line"
            out.append(check)
        return out


def run(env: GateEnv) -> GateResult:
    t0 = time.monotonic()
    opts = env.options
    stop = threading.Event()
    rng = random.Random(secrets.randbits(64))  # fresh tags and tasks on every run
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    errors = 0

    def stream_loop(client: ApiClient, seed: int) -> None:
        nonlocal errors
        local = random.Random(seed)
        try:
            go.wait()
            sent = 0
            # every stream sends at least one request, however late its thread got going
            while not stop.is_set() and (sent == 0 or time.monotonic() < deadline):
                sent += 1
                out = one_request(client, env, make_task(local))
                with lock:
                    outcomes.append(out)
                    if not out.ok:
                        errors += 1
                        if errors >= opts.soak_max_errors:
                            stop.set()
        finally:
            client.close()

    watch = MemoryWatch(opts.mem_sampler, opts.soak_sample_s, stop) if opts.mem_sampler else None
    if watch:
        watch.start()
    # Clients and threads first, then the clock: building an httpx client takes a while on a busy machine.
    go = threading.Event()
    threads = [threading.Thread(target=stream_loop, args=(env.client.clone(), rng.getrandbits(64)),
                                name=f"soak-{i}", daemon=True) for i in range(opts.soak_streams)]
    for t in threads:
        t.start()
    started = time.monotonic()
    deadline = started + opts.soak_seconds
    go.set()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    if watch:
        watch.finish()

    n = len(outcomes)
    bad = [o for o in outcomes if not o.ok]
    ttft = [o.ttft_s for o in outcomes if o.ok and o.ttft_s is not None]
    tps = [o.decode_tps for o in outcomes if o.ok and o.decode_tps is not None]
    tokens = sum(o.tokens or 0 for o in outcomes if o.ok)
    missing_usage = sum(1 for o in outcomes if o.usage_missing)
    data = {
        "streams": opts.soak_streams, "seconds": round(wall, 1), "requests": n, "errors": len(bad),
        "ttft_s": {f"p{p}": _r(percentile(ttft, p)) for p in (50, 90, 99)},
        "decode_tok_s": {f"p{p}": _r(percentile(tps, p)) for p in (10, 50, 90)},
        "aggregate_tok_s": _r(tokens / wall) if wall > 0 and tokens else None,
        "usage_missing": missing_usage,
    }
    if watch:
        data["memory"] = {node: {"first": m.first, "last": m.last, "lowest": m.low, "floor": m.floor,
                                 "sigterm": m.sigterm, "samples": m.samples}
                          for node, m in watch.nodes.items()}
    summary_line = (f"{n} requests, {len(bad)} errors over {wall:.0f} s at {opts.soak_streams}-way; "
                    f"TTFT p50 {_show(data['ttft_s']['p50'], 's')} p99 {_show(data['ttft_s']['p99'], 's')}; "
                    f"decode p50 {_show(data['decode_tok_s']['p50'], 'tok/s')}")
    requests = Check("requests", None, sent=f"{opts.soak_streams} streams for {opts.soak_seconds:.0f} s, unique "
                     "tag first in every prompt; count 1..k, sums and products", got=summary_line)
    memory_stop = watch is not None and any(m.breach for m in watch.nodes.values())
    if n == 0 and memory_stop:
        requests.why = "the load was not started: a node was already too low on memory"
    elif n == 0:
        requests.ok, requests.why = False, "no request completed"
    elif bad:
        stopped = " (stopped early)" if stop.is_set() and wall < opts.soak_seconds else ""
        requests.ok, requests.why = False, f"{len(bad)} of {n} requests failed{stopped}; zero are allowed"
    else:
        requests.ok, requests.why = True, "every answer checked and right" + (
            " (the load was stopped early for memory)" if memory_stop else "")
    if missing_usage and requests.ok:
        requests.got += f"; {missing_usage} stream(s) without a usage block: tok/s counts only the others"
    checks = [requests]
    for o in bad[:ERROR_EXAMPLES]:
        # the name has no brackets: rich would read "[tag]" as markup in the run display
        checks.append(Check(f"error {o.task.tag}", False, sent=clip(o.task.prompt, 100), got=o.got, why=o.why))
    if watch:
        checks += watch.checks()
    else:
        checks.append(Check("memory", None, why="MemAvailable not sampled (no fleet sampler for this endpoint)"))
    return verdict(NAME, checks, t0, summary_line, data)


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _show(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value:.3g} {unit}"


def fleet_sampler(executor: Executor, ranks: list[tuple[Node, str]], floors_gb: dict[str, float]) -> MemSampler:
    """A sampler over the lane's nodes: one facts round trip per node per sample, through `executor` (a run's
    own, so its dry-run rule and -v hold for the samples too).

    `ranks` is [(inventory Node, role)] with role head or workers; floors come from the profile's
    expect.mem_available_floor_gb (keys head / workers, 'worker' accepted).
    """
    nodes = [node for node, _ in ranks]
    role_of = {node.name: role for node, role in ranks}

    def floor(role: str) -> int | None:
        keys = ("head",) if role == "head" else ("workers", "worker")
        value = next((floors_gb[k] for k in keys if k in floors_gb), None)
        return None if value is None else int(value * GB)

    def sample() -> dict[str, MemSample]:
        out: dict[str, MemSample] = {}
        for name, f in executor.drive(gather_ops(nodes, {})).items():
            if not isinstance(f, NodeFacts):
                out[name] = MemSample(None, error=f.message or f.error or "no answer")
            elif f.meminfo is None:
                out[name] = MemSample(None, error="no /proc/meminfo in the facts")
            else:
                out[name] = MemSample(f.meminfo.mem_available_bytes, floor(role_of[name]),
                                      f.earlyoom.sigterm_threshold_bytes if f.earlyoom else None)
        return out

    return sample
