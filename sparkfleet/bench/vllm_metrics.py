"""An engine's /metrics as the bench reads it: counters summed over label sets, deltas, DSpark acceptance.

The series names are the engine adapter's (`MetricNames`: vLLM's below, llama.cpp's `llamacpp:*`); a
name the engine does not export leaves its counter None.

Names follow vLLM V1 (REFERENCE.md §1): counters are exposed with `_total`; spec decoding adds
`vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total` and the per-position counter
`vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0..k-1"}`. Acceptance uses the vLLM
dashboard's formulas over counter deltas:

    mean acceptance length = 1 + Δaccepted / Δdrafts
    acceptance rate        = Δaccepted / Δdraft_tokens
    per position i         = Δaccepted_per_pos{position=i} / Δdrafts
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from sparkfleet.engines.base import MetricNames
from sparkfleet.engines.registry import NAMES, engine_for

# what a Snapshot holds, whatever the engine; each engine's adapter names the series (engines/*.py `METRICS`)
KEYS = ("generation_tokens", "prompt_tokens", "requests", "preemptions", "prefix_cache_queries",
        "prefix_cache_hits", "drafts", "draft_tokens", "accepted")


def names_for(text: str) -> MetricNames | None:
    """The engine whose names the exposition uses (by its prefix); None when no engine's names are there."""
    for name in NAMES:
        m = engine_for(name).metrics
        if m is not None and m.prefix in text:
            return m
    return None


@dataclass
class Snapshot:
    """One scrape: counter totals (None when the engine does not export one), gauges, start time."""

    counters: dict[str, float | None] = field(default_factory=dict)
    per_pos: dict[int, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    started: float | None = None  # unix time the engine's process (or its metrics) started

    def delta(self, before: Snapshot) -> Delta:
        counters: dict[str, float | None] = {}
        for key in KEYS:
            now, then = self.counters.get(key), before.counters.get(key)
            counters[key] = None if now is None or then is None else now - then
        per_pos = {p: v - before.per_pos.get(p, 0.0) for p, v in sorted(self.per_pos.items())}
        # A restarted engine resets its counters: a negative delta says so.
        restarted = any(v is not None and v < 0 for v in counters.values()) or (
            self.started is not None and before.started is not None and self.started > before.started + 1)
        return Delta(counters, per_pos, restarted)


@dataclass
class Delta:
    counters: dict[str, float | None]
    per_pos: dict[int, float]
    restarted: bool = False

    def get(self, key: str) -> float | None:
        return self.counters.get(key)

    def acceptance(self) -> dict | None:
        """DSpark acceptance over this delta, or None without spec-decode counters or drafts."""
        drafts, accepted, draft_tokens = self.get("drafts"), self.get("accepted"), self.get("draft_tokens")
        if self.restarted or not drafts or accepted is None:
            return None
        return {
            "drafts": int(drafts),
            "accepted_tokens": int(accepted),
            "draft_tokens": int(draft_tokens) if draft_tokens is not None else None,
            "mean_acceptance_length": 1 + accepted / drafts,
            "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
            "per_position": [self.per_pos[p] / drafts for p in sorted(self.per_pos)],
        }


_POSITION = re.compile(r'position="(\d+)"')


def samples(text: str) -> Iterator[tuple[str, str, float]]:
    """(name, label text, value) of every sample line of a Prometheus text exposition.

    A small reader rather than prometheus_client's parser: a vLLM /metrics page is mostly histogram
    buckets the bench never reads, and the full parser takes over ten times the CPU for them."""
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            close = line.rfind("}")
            if close < brace:
                continue
            name, labels, rest = line[:brace], line[brace + 1:close], line[close + 1:]
        else:
            name, _, rest = line.partition(" ")
            labels = ""
        fields = rest.split()
        if not fields:
            continue
        try:
            yield name.strip(), labels, float(fields[0])
        except ValueError:
            continue


def parse(text: str, names: MetricNames | None = None) -> Snapshot:
    """A /metrics exposition (Prometheus text format) as a Snapshot, read with the engine's names
    (found from the text when not given)."""
    names = names or names_for(text)
    if names is None:  # no engine's series at all (an empty or foreign exposition): nothing to read
        return Snapshot()
    by_name = {v: k for k, v in names.counters.items()}
    gauge_by_name = {v: k for k, v in names.gauges.items()}
    snap = Snapshot()
    created: list[float] = []
    for name, labels, value in samples(text):
        key = by_name.get(name)
        if key is not None:
            snap.counters[key] = (snap.counters.get(key) or 0.0) + value
        elif names.per_pos is not None and name == names.per_pos:
            m = _POSITION.search(labels)
            if m:
                pos = int(m.group(1))
                snap.per_pos[pos] = snap.per_pos.get(pos, 0.0) + value
        elif name in gauge_by_name:
            gauge = gauge_by_name[name]
            snap.gauges[gauge] = snap.gauges.get(gauge, 0.0) + value
        elif name == "process_start_time_seconds":
            snap.started = value
        elif name.startswith(names.prefix) and name.endswith("_created"):
            created.append(value)
    if snap.started is None and created:
        # Without process metrics (vLLM with --api-server-count > 1 drops them) the counters' creation
        # time is when the engine set its metrics up: near enough to the lane's start for an uptime.
        snap.started = min(created)
    return snap
