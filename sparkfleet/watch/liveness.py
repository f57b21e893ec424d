"""One liveness probe of a lane: does it generate the right answer, and what do its ranks look like?

vLLM's /health answers 200 while the engine is hung or a worker is dead (vLLM #11996, #39863), so the
verdict comes from generation: a tiny count at temperature 0 with thinking off and a bounded
max_tokens, whose answer is checked exactly (the count100 gate's judge, on 1..5). /health is kept as
evidence. Every rank's container (by label) and MemAvailable come from the node facts, one round
trip per node, in a thread of their own beside the request (`Prober`).

`judge` and `rank_states` are pure; `Prober` is the I/O (the gates' client and `gather`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field

from sparkfleet.checks.context import role_value
from sparkfleet.checks.seeds import EARLYOOM_MARGIN_BYTES, GB
from sparkfleet.fleet.gather import gather
from sparkfleet.fleet.nodefacts import Container, NodeFacts
from sparkfleet.fleet.transport import Result, Transport
from sparkfleet.gates.client import ApiClient, Reply, RequestFailed, clip
from sparkfleet.gates.env import user
from sparkfleet.gates.text import judge_count
from sparkfleet.naming import PROFILE_LABEL, RANK_LABEL, RUN_LABEL
from sparkfleet.placement import Rank
from sparkfleet.schema.profile import Profile

TOP = 5
PROMPT = f"Count from 1 to {TOP}. Write every number, separated by commas, and nothing else."
MAX_TOKENS = 48  # "1, 2, 3, 4, 5" is about 10 tokens; room for a short preamble, never a long answer
FACTS_TIMEOUT_S = 10.0  # a busy node's facts can take seconds; a silent node is reported, not fatal
GONE = ("exited", "dead")  # docker states of a rank that stopped by itself


def request_body(model: str) -> dict:
    """The probe's chat body: deterministic (temperature 0), thinking off, bounded."""
    return {"model": model, "messages": user(PROMPT), "max_tokens": MAX_TOKENS, "temperature": 0,
            "chat_template_kwargs": {"thinking": False}}


def judge(reply: Reply) -> tuple[bool, str]:
    """The answer lists exactly 1..TOP; why not otherwise (the count100 gate's rule)."""
    ok, why = judge_count(reply.content, 1, TOP)
    if not ok and reply.finish_reason == "length":
        why += f" (finish_reason length at max_tokens {MAX_TOKENS})"
    return ok, ("answered 1..5" if ok else why)


@dataclass(frozen=True)
class RankState:
    """One rank as the probe saw it."""

    rank: int
    node: str
    state: str  # docker's (running, exited, ...), or vanished (no container), or unknown (node silent)
    container: str | None = None
    run_id: str | None = None  # the container's sparkfleet.run label
    exit_code: int | None = None
    mem_available: int | None = None  # bytes
    mem_guard: int | None = None  # bytes: MemAvailable below this is inside the floor or earlyoom's margin
    guard_why: str = ""
    error: str | None = None  # why the node could not be read
    mem_error: str | None = None  # why its facts hold no MemAvailable (the node answered without it)


@dataclass(frozen=True)
class Probe:
    at: float  # unix time the probe started
    ok: bool  # the generation answered right
    why: str
    latency_s: float | None  # the generation request, None when it did not answer
    health: int | None  # /health status code, None when it did not answer
    answer: str = ""
    ranks: tuple[RankState, ...] = field(default_factory=tuple)
    facts_age_s: float | None = None  # how long before the probe the rank states' facts were gathered

    def as_dict(self) -> dict:
        return asdict(self)


def mem_guard(profile: Profile, r: Rank, f: NodeFacts) -> tuple[int | None, str]:
    """The MemAvailable line a serving rank must stay above: the lane's floor for its role, or earlyoom's
    SIGTERM line plus the seeds' margin (checks/earlyoom.py), whichever is higher."""
    lines: list[tuple[int, str]] = []
    floor = role_value(profile.expect.mem_available_floor_gb, r)
    if floor is not None:
        lines.append((int(floor[1] * GB), f"expect.mem_available_floor_gb.{floor[0]} {floor[1]:g} GB"))
    eo = f.earlyoom
    if eo is not None and eo.running and eo.sigterm_threshold_bytes is not None:
        lines.append((eo.sigterm_threshold_bytes + EARLYOOM_MARGIN_BYTES,
                      f"earlyoom SIGTERM line {eo.sigterm_threshold_bytes / GB:.1f} GB + "
                      f"{EARLYOOM_MARGIN_BYTES / GB:.1f} GB margin"))
    if not lines:
        return None, "no floor and no earlyoom line"
    return max(lines)


def _pick(found: list[Container]) -> Container:
    """Of several containers for one rank, the running one (else the newest listed)."""
    running = [c for c in found if c.state == "running"]
    return (running or found)[0]


def rank_states(facts: dict[str, NodeFacts | Result], ranks: list[Rank], profile: Profile) -> list[RankState]:
    """Each rank's container (by this lane's labels, never by name) and memory, from one facts answer per node."""
    out = []
    for r in ranks:
        f = facts.get(r.node.name)
        if not isinstance(f, NodeFacts):
            why = (f.message or f.error or "no answer") if isinstance(f, Result) else "not asked"
            out.append(RankState(r.rank, r.node.name, "unknown", error=why))
            continue
        avail = f.meminfo.mem_available_bytes if f.meminfo else None
        # the facts' own words for a missing reading ("meminfo: no MemAvailable line"), as checks/memory.py
        mem_error = None if f.meminfo else (
            "; ".join(e for e in f.errors if e.startswith("meminfo")) or "the node did not report /proc/meminfo")
        guard, guard_why = mem_guard(profile, r, f)
        if f.docker is None or not f.docker.available:
            why = (f.docker.error if f.docker else None) or "docker state not reported"
            out.append(RankState(r.rank, r.node.name, "unknown", mem_available=avail, mem_guard=guard,
                                 guard_why=guard_why, error=why, mem_error=mem_error))
            continue
        found = [c for c in f.docker.containers if c.labels.get(PROFILE_LABEL) == profile.name
                 and c.labels.get(RANK_LABEL) == str(r.rank)]
        if not found:
            out.append(RankState(r.rank, r.node.name, "vanished", mem_available=avail, mem_guard=guard,
                                 guard_why=guard_why, mem_error=mem_error))
            continue
        c = _pick(found)
        out.append(RankState(r.rank, r.node.name, c.state, c.name, c.labels.get(RUN_LABEL), None, avail, guard,
                             guard_why, mem_error=mem_error))
    return out


def _ask(client: ApiClient, model: str, timeout_s: float) -> tuple[bool, str, float | None, str]:
    t0 = time.monotonic()
    try:
        reply = client.chat(request_body(model), timeout_s=timeout_s)
    except RequestFailed as exc:
        return False, f"no answer within {timeout_s:g} s: {exc}" if "Timeout" in str(exc) else str(exc), None, ""
    ok, why = judge(reply)
    return ok, why, time.monotonic() - t0, clip(reply.content, 120)


def _health(client: ApiClient, timeout_s: float) -> int | None:
    try:
        return client.request("GET", "/health", timeout_s=timeout_s).status_code
    except RequestFailed:
        return None


class Prober:
    """Probes on schedule. The generation and /health run in every probe; the nodes' facts run in a thread
    of their own: a probe waits for them only until the next probe is due (`wait_s`) and otherwise uses
    the newest facts that finished, so a slow facts round trip never delays the generation's verdict.
    After watch acts, `invalidate()`: the next probe waits for facts gathered after that moment."""

    def __init__(self, client: ApiClient, transport: Transport, ranks: list[Rank], profile: Profile,
                 timeout_s: float) -> None:
        self.client, self.transport, self.ranks, self.profile, self.timeout_s = (
            client, transport, ranks, profile, timeout_s)
        self.facts: dict[str, NodeFacts | Result] = {}
        self.facts_started: float | None = None  # when the gather behind `facts` began
        self.valid_after = 0.0
        self._thread: threading.Thread | None = None
        self._thread_started = 0.0
        self._lock = threading.Lock()

    def invalidate(self) -> None:
        self.valid_after = time.time()

    def _gather(self, started: float) -> None:
        got = gather(self.transport, [r.node for r in self.ranks], {},
                     timeout_s=max(self.timeout_s, FACTS_TIMEOUT_S))
        with self._lock:
            self.facts, self.facts_started = got, started

    def _start(self) -> threading.Thread:
        if self._thread is None or not self._thread.is_alive():
            self._thread_started = time.time()
            self._thread = threading.Thread(target=self._gather, args=(self._thread_started,),
                                            name="sparkfleet-watch-facts", daemon=True)
            self._thread.start()
        return self._thread

    def _valid(self) -> bool:
        return self.facts_started is not None and self.facts_started >= self.valid_after

    def probe(self, model: str, wait_s: float | None = None) -> tuple[Probe, dict[str, NodeFacts | Result]]:
        """One probe; facts are waited for fully when none valid exist yet (first probe, after acting)."""
        at = time.time()
        t = self._start()
        health: list[int | None] = []
        h = threading.Thread(target=lambda: health.append(_health(self.client, self.timeout_s)), daemon=True)
        h.start()
        ok, why, latency, answer = _ask(self.client, model, self.timeout_s)
        h.join(self.timeout_s + 5.0)
        limit = max(self.timeout_s, FACTS_TIMEOUT_S) + 5.0
        if self._valid():  # usable facts exist: wait for the running gather only until the next probe is due
            t.join(limit if wait_s is None else max(0.0, wait_s - 0.05 - (time.time() - at)))
        else:  # none yet (first probe, or watch just acted): wait for a gather that began after that
            t.join(limit)
            if not self._valid():
                self._start().join(limit)
        with self._lock:
            facts = dict(self.facts)
            age = at - self.facts_started if self.facts_started is not None else None
        probe = Probe(at, ok, why, latency, health[0] if health else None, answer,
                      tuple(rank_states(facts, self.ranks, self.profile)),
                      round(max(0.0, age), 3) if age is not None else None)
        return probe, facts
