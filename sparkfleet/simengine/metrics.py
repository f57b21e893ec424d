"""vLLM's /metrics, written without prometheus_client so the sim engine stays stdlib-only.

Names, HELP texts, buckets and labels (`model_name`, `engine`, plus `finished_reason` and `position`)
follow vLLM V1 (`vllm/v1/metrics/loggers.py`, `vllm/v1/spec_decode/metrics.py`); the text layout
follows prometheus_client 0.26 (counters as `_total` plus a `_created` gauge, labels sorted, Go-style
floats). Every value comes from requests the engine served.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort")

GAUGES = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
}
COUNTERS = {
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
}
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "Number of spec decoding drafts.",
    "vllm:spec_decode_num_draft_tokens": "Number of draft tokens.",
    "vllm:spec_decode_num_accepted_tokens": "Number of accepted tokens.",
}


def go_float(value: float) -> str:
    """Format a float as prometheus_client does (Go style: +Inf, exponents for large numbers)."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10 ** exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


@dataclass
class Histogram:
    help: str
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1


def _labels(pairs: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items()))
    return "{" + inner + "}"


class Metrics:
    """Counters, gauges and histograms for one engine; thread-safe; rendered on each scrape."""

    def __init__(self, model_name: str, max_model_len: int, num_spec_tokens: int) -> None:
        self.base = {"model_name": model_name.replace("\\", "\\\\").replace('"', '\\"'), "engine": "0"}
        self.lock = threading.Lock()
        self.created = time.time()
        self.counters = dict.fromkeys(COUNTERS, 0.0)
        self.success = dict.fromkeys(FINISH_REASONS, 0.0)
        self.k = num_spec_tokens
        self.spec = dict.fromkeys(SPEC_COUNTERS, 0.0)
        self.per_pos = [0.0] * num_spec_tokens
        tokens = build_1_2_5_buckets(max_model_len)
        self.histograms = {
            "vllm:request_prompt_tokens": Histogram("Number of prefill tokens processed.", tokens),
            "vllm:request_generation_tokens": Histogram("Number of generation tokens processed.", tokens),
            "vllm:request_params_max_tokens": Histogram("Histogram of the max_tokens request parameter.", tokens),
            "vllm:time_to_first_token_seconds": Histogram("Histogram of time to first token in seconds.",
                                                          TTFT_BUCKETS),
            "vllm:inter_token_latency_seconds": Histogram("Histogram of inter-token latency in seconds.",
                                                          ITL_BUCKETS),
            "vllm:e2e_request_latency_seconds": Histogram("Histogram of e2e request latency in seconds.",
                                                          LATENCY_BUCKETS),
            "vllm:request_queue_time_seconds": Histogram("Histogram of time spent in WAITING phase for request.",
                                                         LATENCY_BUCKETS),
            "vllm:request_prefill_time_seconds": Histogram("Histogram of time spent in PREFILL phase for request.",
                                                           LATENCY_BUCKETS),
            "vllm:request_decode_time_seconds": Histogram("Histogram of time spent in DECODE phase for request.",
                                                          LATENCY_BUCKETS),
            "vllm:request_inference_time_seconds": Histogram(
                "Histogram of time spent in RUNNING phase for request.", LATENCY_BUCKETS),
        }

    # ------------------------------------------------------------------------------------ recording

    def add(self, name: str, value: float) -> None:
        with self.lock:
            self.counters[name] += value

    def observe(self, name: str, value: float) -> None:
        with self.lock:
            self.histograms[name].observe(value)

    def draft(self, accepted: int) -> None:
        """One speculative step: k tokens drafted, `accepted` of them taken (positions 0..accepted-1)."""
        if self.k <= 0:
            return
        with self.lock:
            self.spec["vllm:spec_decode_num_drafts"] += 1
            self.spec["vllm:spec_decode_num_draft_tokens"] += self.k
            self.spec["vllm:spec_decode_num_accepted_tokens"] += accepted
            for pos in range(accepted):
                self.per_pos[pos] += 1

    def finished(self, reason: str) -> None:
        with self.lock:
            self.success[reason if reason in self.success else "stop"] += 1

    # ------------------------------------------------------------------------------------ exposition

    def _counter(self, out: list[str], name: str, help_: str, samples: list[tuple[dict, float]]) -> None:
        out += [f"# HELP {name}_total {help_}", f"# TYPE {name}_total counter"]
        out += [f"{name}_total{_labels(lab)} {go_float(v)}" for lab, v in samples]
        out += [f"# HELP {name}_created {help_}", f"# TYPE {name}_created gauge"]
        out += [f"{name}_created{_labels(lab)} {go_float(self.created)}" for lab, _ in samples]

    def render(self, running: int, waiting: int, kv_usage: float) -> str:
        """The exposition text, as of now."""
        base = self.base
        out: list[str] = []
        with self.lock:
            for name, value in (("vllm:num_requests_running", running), ("vllm:num_requests_waiting", waiting),
                                ("vllm:kv_cache_usage_perc", kv_usage)):
                out += [f"# HELP {name} {GAUGES[name]}", f"# TYPE {name} gauge",
                        f"{name}{_labels(base)} {go_float(value)}"]
            for name, help_ in COUNTERS.items():
                self._counter(out, name, help_, [(base, self.counters[name])])
            self._counter(out, "vllm:request_success", "Count of successfully processed requests.",
                          [({**base, "finished_reason": r}, v) for r, v in self.success.items()])
            if self.k > 0:
                for name, help_ in SPEC_COUNTERS.items():
                    self._counter(out, name, help_, [(base, self.spec[name])])
                self._counter(out, "vllm:spec_decode_num_accepted_tokens_per_pos",
                              "Accepted tokens per draft position.",
                              [({**base, "position": str(i)}, v) for i, v in enumerate(self.per_pos)])
            for name, h in self.histograms.items():
                out += [f"# HELP {name} {h.help}", f"# TYPE {name} histogram"]
                for bound, c in zip(h.buckets, h.counts, strict=True):
                    out.append(f"{name}_bucket{_labels({**base, 'le': go_float(bound)})} {go_float(c)}")
                out.append(f"{name}_bucket{_labels({**base, 'le': '+Inf'})} {go_float(h.n)}")
                out.append(f"{name}_count{_labels(base)} {go_float(h.n)}")
                out.append(f"{name}_sum{_labels(base)} {go_float(h.total)}")
                out += [f"# HELP {name}_created {h.help}", f"# TYPE {name}_created gauge",
                        f"{name}_created{_labels(base)} {go_float(self.created)}"]
        return "\n".join(out) + "\n"
