"""The sim engine's scheduler: admission by free KV and `max_num_seqs`, a prefix cache, preemption,
and DSpark-like speculative steps that emit several tokens at once.

The answer text is fixed before scheduling starts (see answers.py), so scheduling changes timing and
metrics, never the text: temperature 0 gives the same answer alone or under concurrency.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sparkfleet.simengine.metrics import Metrics

BLOCK = 128  # tokens per KV block; the Spark lanes run --block-size 128
# the bimodal fault's slow mode: the seeds' bimodal C4 cell read 189 and 122 tok/s (189 / 122 = 1.55)
BIMODAL_SLOW = 1.55
ACCEPT_P = 0.72  # chance each draft position is accepted, given the ones before it were


@dataclass
class Piece:
    """One output token: what it belongs to, its text, and which tool call it is part of."""

    kind: str  # reasoning | content | tool_name | tool_args
    text: str
    call: int = -1


@dataclass
class Job:
    """One request, ready to run: prompt size (and its block hashes for the prefix cache) and output."""

    prompt_tokens: int
    block_hashes: list[str]
    pieces: list[Piece]
    seed: str  # seeds the speculative acceptance draws, so chunking is the same on every run
    max_tokens_param: int | None = None
    finish: str = "stop"  # stop | length; set by the caller that built `pieces`


@dataclass
class _Seat:
    reserved: int = 0  # KV tokens held
    active: bool = False  # counted in `running`
    slow: bool = False  # the bimodal fault's slow mode


class EngineDead(RuntimeError):
    """The engine can no longer serve (a rank went away)."""


def block_hashes(tokens: list[str]) -> list[str]:
    """Chained hashes of the full KV blocks of a prompt (what vLLM's prefix cache keys on)."""
    out, prev = [], ""
    for start in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
        prev = hashlib.sha1((prev + "\x00".join(tokens[start:start + BLOCK])).encode()).hexdigest()
        out.append(prev)
    return out


class Engine:
    """Runs jobs on request threads; shared state lives under one condition variable."""

    def __init__(self, capacity: int, max_num_seqs: int, num_spec_tokens: int, step_s: float,
                 prefill_tps: float, metrics: Metrics, garbage: bool = False, cache_blocks: int = 200_000,
                 token_rate: float = 0.0, gate: Callable[[], bool] | None = None, bimodal: bool = False) -> None:
        self.capacity = max(capacity, 1)
        self.max_num_seqs = max(max_num_seqs, 1)
        self.k = max(num_spec_tokens, 0)
        self.step_s = step_s
        self.prefill_tps = prefill_tps
        self.metrics = metrics
        self.garbage = garbage  # a wrong-commit engine: the drafter's tokens are never accepted
        self.cond = threading.Condition()
        self.used = 0
        self.running = 0
        self.waiting: deque[_Seat] = deque()
        self.dead = False
        self.cache: dict[str, None] = {}  # insertion-ordered: the oldest block is evicted first
        self.cache_blocks = cache_blocks
        # > 0: pace each stream at exactly token_rate tokens/s after its first token (a known rate for
        # benchmark tests) instead of step_s per step
        self.token_rate = token_rate
        # A step that needs every rank (the head of a multi-node lane): True once they all took part; False
        # when the engine died while it waited
        self.gate = gate
        # the bimodal fault: every other burst of requests (the engine going from idle to busy) runs slow
        self.bimodal = bimodal
        self.bursts = 0

    # ------------------------------------------------------------------------------------ state

    def snapshot(self) -> tuple[int, int, float]:
        with self.cond:
            return self.running, len(self.waiting), self.used / self.capacity

    def kill(self) -> None:
        with self.cond:
            self.dead = True
            self.cond.notify_all()

    def _admit(self, seat: _Seat, need: int, front: bool) -> None:
        """Queue, then wait until this seat is first in line and fits (slots and KV)."""
        with self.cond:
            if not front:  # a new request (not one back from preemption): it belongs to the current burst
                if self.running == 0 and not self.waiting:
                    self.bursts += 1
                seat.slow = self.bimodal and self.bursts % 2 == 0
            if front:
                self.waiting.appendleft(seat)
            else:
                self.waiting.append(seat)
            self.cond.notify_all()
            while not (self.waiting[0] is seat and self.running < self.max_num_seqs
                       and self.used + need <= self.capacity):
                if self.dead:
                    self.waiting.remove(seat)
                    raise EngineDead("engine is dead")
                self.cond.wait(0.25)
            self.waiting.popleft()
            self.running += 1
            self.used += need
            seat.reserved, seat.active = need, True
            self.cond.notify_all()

    def _release(self, seat: _Seat) -> None:
        with self.cond:
            if seat.active:
                self.used -= seat.reserved
                self.running -= 1
            seat.reserved, seat.active = 0, False
            self.cond.notify_all()

    def _draw(self, rng: random.Random) -> int:
        if self.garbage:
            return 0
        accepted = 0
        while accepted < self.k and rng.random() < ACCEPT_P:
            accepted += 1
        return accepted

    def _cached_tokens(self, hashes: list[str], prompt_tokens: int) -> int:
        with self.cond:
            hit = 0
            for h in hashes:
                if h not in self.cache:
                    break
                hit += 1
            for h in hashes:
                self.cache.pop(h, None)
                self.cache[h] = None
            while len(self.cache) > self.cache_blocks:
                self.cache.pop(next(iter(self.cache)))
        # vLLM always computes at least the last prompt token.
        return min(hit * BLOCK, max(prompt_tokens - 1, 0))

    # ------------------------------------------------------------------------------------ running

    def run(self, job: Job, on_finish: Callable[[str], None] | None = None) -> Iterator[list[Piece]]:
        """The job's output one engine step at a time; closing the iterator early aborts it.

        Raises ValueError at once (before anything is sent) when the prompt can never fit the KV cache.
        """
        if job.prompt_tokens > self.capacity:
            raise ValueError(f"the prompt needs {job.prompt_tokens} KV tokens but the lane has {self.capacity}")
        return self._steps(job, on_finish)

    def _steps(self, job: Job, on_finish: Callable[[str], None] | None) -> Iterator[list[Piece]]:
        m = self.metrics
        arrival = time.monotonic()
        seat = _Seat()
        self._admit(seat, job.prompt_tokens, front=False)
        admitted = time.monotonic()
        reason = "abort"
        try:
            if self.gate is not None and not self.gate():
                raise EngineDead("engine is dead")
            hit = self._cached_tokens(job.block_hashes, job.prompt_tokens)
            m.add("vllm:prefix_cache_queries", job.prompt_tokens)
            m.add("vllm:prefix_cache_hits", hit)
            if self.prefill_tps > 0:
                time.sleep((job.prompt_tokens - hit) / self.prefill_tps)
            m.add("vllm:prompt_tokens", job.prompt_tokens)
            prefilled = time.monotonic()
            rng = random.Random(job.seed)
            i, last, first_at = 0, prefilled, 0.0
            total = job.prompt_tokens
            pieces = job.pieces
            paced = self.token_rate > 0
            anchor_t, anchor_i = prefilled, 0  # paced: time and tokens emitted that the deadlines count from
            while i < len(pieces):
                # Paced, the first token is the prefill pass's own sample: alone and not a draft (as in vLLM).
                drafted = not (paced and i == 0)
                accepted = self._draw(rng) if drafted else 0
                n = min(1 + accepted, len(pieces) - i)
                if total + n > self.capacity:
                    break  # this request alone outgrows the KV pool: stop it like vLLM's length cap
                if self._grow(seat, n, total):
                    anchor_t, anchor_i = time.monotonic(), i  # back from preemption: pace from now, no catch-up
                if paced:
                    if i > 0:
                        # An absolute deadline, so a late wake-up delays one step and is not carried forward.
                        rate = self.token_rate / (BIMODAL_SLOW if seat.slow else 1.0)
                        delay = anchor_t + (i + n - anchor_i) / rate - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                else:
                    with self.cond:
                        running = self.running
                    # Batched decode slows a little with every extra running request.
                    time.sleep(self.step_s * (1 + 0.04 * max(running - 1, 0)) * (BIMODAL_SLOW if seat.slow else 1.0))
                now = time.monotonic()
                if self.k and drafted:
                    m.draft(n - 1)
                m.add("vllm:generation_tokens", n)
                if i == 0:
                    first_at = now
                    m.observe("vllm:time_to_first_token_seconds", now - arrival)
                else:
                    m.observe("vllm:inter_token_latency_seconds", now - last)
                last = now
                total += n
                yield pieces[i:i + n]
                if paced and i == 0:
                    # Pace from when the first token was handed to the client (the caller writes it before
                    # asking for the next step), so a first write delayed by busy threads is not made up for.
                    anchor_t, anchor_i = time.monotonic(), n
                i += n
            reason = job.finish if i >= len(pieces) else "length"
        finally:
            self._release(seat)
            end = time.monotonic()
            m.finished(reason)
            m.observe("vllm:e2e_request_latency_seconds", end - arrival)
            m.observe("vllm:request_queue_time_seconds", admitted - arrival)
            m.observe("vllm:request_inference_time_seconds", end - admitted)
            if reason != "abort":
                m.observe("vllm:request_prefill_time_seconds", (first_at or end) - admitted)
                m.observe("vllm:request_decode_time_seconds", end - (first_at or end))
                m.observe("vllm:request_prompt_tokens", job.prompt_tokens)
                m.observe("vllm:request_generation_tokens", total - job.prompt_tokens)
                if job.max_tokens_param:
                    m.observe("vllm:request_params_max_tokens", job.max_tokens_param)
            if on_finish:
                on_finish(reason)

    def _grow(self, seat: _Seat, n: int, total: int) -> bool:
        """Reserve KV for n more tokens; with none free, preempt this request and re-queue it at the front.

        True when the request was preempted (and has been admitted again)."""
        with self.cond:
            if self.used + n <= self.capacity:
                self.used += n
                seat.reserved += n
                return False
            self.used -= seat.reserved
            self.running -= 1
            seat.reserved, seat.active = 0, False
            self.cond.notify_all()
        self.metrics.add("vllm:num_preemptions", 1)
        # Recompute: the request comes back needing its whole context plus the new tokens.
        self._admit(seat, total + n, front=True)
        return True
