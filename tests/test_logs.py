"""Engine log lines -> facts; WARNING lines are never fatal."""

from __future__ import annotations

from sparkfleet.engines.logs import LogFacts, feed, parse
from sparkfleet.spec.load import Spec
from tests.conftest import REPO

HEAD_LOG = """\
INFO 09-11 09:10:01 [loader.py:101] Loading weights took 341.2 seconds
INFO 09-11 09:10:02 [engram.py:88] Engram DISK mode: layer 1 rows [0, 96000000)
INFO 09-11 09:10:02 [engram.py:88] Engram DISK mode: layer 14 rows [0, 96000000)
INFO 09-11 09:10:02 [engram.py:95] Engram rows read from node-local /engram-local
WARNING 09-11 09:10:03 [config.py:1] CUDA error checking is disabled; NCCL error handling defaults apply
INFO 09-11 09:12:40 [kv_cache_utils.py:775] GPU KV cache size: 1,888,800 tokens
INFO 09-11 09:12:40 [kv_cache_utils.py:779] Maximum concurrency for 500,000 tokens per request: 3.78x
INFO 09-11 09:13:00 [fused_moe.py:10] Using 'B12X_MXFP4_MXFP8' Mxfp4 MoE backend
INFO 09-11 09:20:59 [launcher.py:28] Starting vLLM API server 0 on http://0.0.0.0:8410
INFO:     Application startup complete.
"""


def signatures() -> list[str]:
    """The shipped vLLM lanes' fatal signatures."""
    return Spec(REPO).profile("dcp2").profile.fatal_signatures


def test_head_log_facts() -> None:
    f = parse(HEAD_LOG, signatures())
    assert (f.kv_tokens, f.max_concurrency, f.moe_backend) == (1888800, 3.78, "B12X_MXFP4_MXFP8")
    assert f.moe_backend_line == "Using 'B12X_MXFP4_MXFP8' Mxfp4 MoE backend"
    assert f.engram_rows == {1: (0, 96000000), 14: (0, 96000000)}
    assert f.engram_node_local and f.api_up and f.phase == "serving"
    assert f.fatal is None  # the WARNING line names CUDA and NCCL errors but is not fatal (FM-50)


def test_fatal_lines() -> None:
    for line in ("RuntimeError: CUDA error: an illegal memory access was encountered",
                 "ValueError: No common block size for 64",
                 "ERROR 10-17 [gpu_worker.py:1] Available KV cache memory: -2.61 GiB",
                 "Traceback (most recent call last):",
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"):
        assert parse("INFO ok\n" + line + "\nINFO after\n", signatures()).fatal == line
    assert parse("(EngineCore pid=1) WARNING: Available KV cache memory: -1 GiB is a guess\n", signatures()).fatal is None


def test_station_lines_and_incremental_feed() -> None:
    f = LogFacts()
    feed(f, ["INFO [autotuner.py:1] Loaded 168 configs"], [])
    assert (f.autotune_loaded, f.phase) == (168, "autotune")
    feed(f, ["INFO Preloaded 210/210 tactics, no live tune", "INFO [hook] rehome done layers=40"], [])
    assert f.autotune_preloaded == (210, 210) and f.rehome_layers == 40 and f.lines_seen == 3
