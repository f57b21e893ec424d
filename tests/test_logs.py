"""Engine log lines -> facts; WARNING lines are never fatal."""

from __future__ import annotations

import pytest

from sparkfleet.engines.logs import LogFacts, feed, parse, split_lines, text
from sparkfleet.engines.registry import engine_for
from sparkfleet.opsdir import Spec
from tests.conftest import REPO

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

VLLM = engine_for("vllm").log  # the reader has no engine of its own: these are vLLM's lines

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
    f = parse(HEAD_LOG, signatures(), VLLM)
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
        assert parse("INFO ok\n" + line + "\nINFO after\n", signatures(), VLLM).fatal == line
    assert parse("(EngineCore pid=1) WARNING: Available KV cache memory: -1 GiB is a guess\n", signatures(), VLLM).fatal is None


def test_station_lines_and_incremental_feed() -> None:
    f = LogFacts()
    feed(f, ["INFO [autotuner.py:1] Loaded 168 configs"], [], VLLM)
    assert (f.autotune_loaded, f.phase) == (168, "autotune")
    feed(f, ["INFO Preloaded 210/210 tactics, no live tune", "INFO [hook] rehome done layers=40"], [], VLLM)
    assert f.autotune_preloaded == (210, 210) and f.rehome_layers == 40 and f.lines_seen == 3


# -- vLLM's lines as it writes them (engines/logs.py `text`) ----------------------------------------

CYAN, RESET = "\x1b[1;36m", "\x1b[0;0m"  # vllm/utils/__init__.py:120-121 (0.11.0)


def test_a_line_is_read_without_colour_prefix_or_the_bar_updates_before_the_last_carriage_return() -> None:
    bar = (f"{CYAN}(Worker_TP0 pid=77){RESET} \rLoading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]"
           "\rLoading safetensors checkpoint shards: 100% Completed | 4/4 [00:03<00:00,  1.2it/s]")
    assert text(bar) == "Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:03<00:00,  1.2it/s]"
    assert text(f"{CYAN}(APIServer pid=1){RESET} INFO 12-01 10:00:00 [launcher.py:46] Route: /health, Methods: GET") \
        == "INFO 12-01 10:00:00 [launcher.py:46] Route: /health, Methods: GET"
    assert text("(EngineCore_DP0 pid=9) INFO:     Application startup complete.") == \
        "INFO:     Application startup complete."
    # tqdm's close after a bar ending in \r (tqdm/std.py:1310): the last non-blank segment counts
    assert text("\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 67/67\r") == \
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 67/67"


def test_lines_are_what_tail_counts() -> None:
    assert split_lines("a\rb\nc\n") == ["a\rb", "c"]
    assert split_lines("a\nbar 10%\rbar 20%") == ["a"]  # a bar still moving: read again next time
    assert split_lines("") == []


def test_a_prefixed_coloured_traceback_is_fatal_and_names_its_exception() -> None:
    w = f"{CYAN}(Worker_TP1 pid=88){RESET} "
    log = (f"{w}ERROR 12-01 10:00:00 [multiproc_executor.py:597] WorkerProc failed to start.\n"
           f"{w}Traceback (most recent call last):\n"
           f'{w}  File "/usr/lib/python3/vllm/v1/executor/multiproc_executor.py", line 571, in worker_main\n'
           f"{w}    worker = WorkerProc(*args, **kwargs)\n"
           f"{w}ImportError: cannot import name 'EngramDiskReader'\n")
    f = parse(log, signatures(), VLLM)
    assert f.fatal == "ERROR 12-01 10:00:00 [multiproc_executor.py:597] WorkerProc failed to start."
    assert f.fatal_detail == "ImportError: cannot import name 'EngramDiskReader'"
    f = parse("".join(x for x in log.splitlines(keepends=True) if "WorkerProc" not in x), signatures(), VLLM)
    assert f.fatal == "Traceback (most recent call last):"  # the profile's signature, behind the prefix
    assert f.fatal_detail == "ImportError: cannot import name 'EngramDiskReader'"


def test_vllm_death_lines_are_fatal_without_a_traceback() -> None:
    for line in ("ERROR 12-01 10:00:00 [multiproc_executor.py:155] Worker proc VllmWorker-1 died unexpectedly, "
                 "shutting down executor.",
                 "ERROR 12-01 10:00:00 [core_client.py:565] Engine core proc EngineCore_DP0 died unexpectedly, "
                 "shutting down client.",
                 "ERROR 12-01 10:00:00 [core.py:708] EngineCore failed to start.",
                 "ERROR 12-01 10:00:00 [core.py:1232] EngineCore encountered a fatal error.",
                 "TimeoutError: RPC call to execute_model timed out."):
        f = parse(f"{CYAN}(EngineCore_DP0 pid=5){RESET} INFO ok\n{CYAN}(EngineCore_DP0 pid=5){RESET} {line}\n", [],
                  VLLM)
        assert f.fatal == line
    f = parse("ERROR [core.py:708] EngineCore failed to start.\nTraceback (most recent call last):\n"
              '  File "x.py", line 1, in f\nValueError: No available memory for the cache blocks.\n', [], VLLM)
    assert f.fatal_detail == "ValueError: No available memory for the cache blocks."


def vocab(version: str | None):
    p = Spec(REPO).profile("dcp2").profile
    image = p.image.model_copy(update={"engine_version": version}) if p.image else None
    expect = p.expect.model_copy(update={"log_lines": ["rehome done layers=40"]})
    return engine_for("vllm").log_for(p.model_copy(update={"image": image, "expect": expect}))


MOE_LINES = {  # the backend line as each version prints it (tests/fixtures/vllm/ cites file:line)
    "0.11.0": ("INFO 12-01 [mxfp4.py:69] Using FlashInfer MXFP4 MXFP8 CUTLASS backend for SM100",
               "FlashInfer MXFP4 MXFP8 CUTLASS"),
    "0.13.0": ("INFO 12-01 [mxfp4.py:161] Using Marlin backend", "Marlin"),
    "0.20.0": ("INFO 12-01 [mxfp4.py:281] Using 'FLASHINFER_CUTLASS_MXFP4_MXFP8' Mxfp4 MoE backend.",
               "FLASHINFER_CUTLASS_MXFP4_MXFP8"),
}


def test_the_moe_line_is_the_declared_versions() -> None:
    fp8 = "INFO 12-01 [fp8.py:238] Using TRITON Fp8 MoE backend out of potential backends: ['TRITON']."
    for version, (line, backend) in MOE_LINES.items():
        assert parse(line + "\n", [], vocab(version)).moe_backend == backend
        new = version.startswith("0.20")
        others = [x for v, (x, _) in MOE_LINES.items() if v.startswith("0.20") != new]  # the other form
        assert others and all(parse(x + "\n", [], vocab(version)).moe_backend is None for x in others)
        assert parse(line + "\n", [], vocab(None)).moe_backend == backend  # undeclared: any version's form
    assert parse(fp8 + "\n", [], vocab("0.20.0")).moe_backend == "TRITON"
    # attention backends are not MoE lines (platforms/cuda.py, 0.11.0; platforms/xpu.py)
    for line in ("INFO [cuda.py:1] Using Triton backend on V1 engine.", "INFO [xpu.py:1] Using Triton backend."):
        assert parse(line + "\n", [], vocab("0.11.0")).moe_backend is None


def test_expected_lines_are_matched_as_they_arrive_not_on_a_tail() -> None:
    f = LogFacts()
    v = vocab("0.11.0")
    feed(f, [f"{CYAN}(Worker_TP0 pid=3){RESET} INFO [hook.py:1] rehome done layers=40"], [], v)
    feed(f, [f"INFO [launcher.py:46] Route: /r{i}, Methods: GET" for i in range(200)], [], v)
    assert f.expected_seen == {"rehome done layers=40": "INFO [hook.py:1] rehome done layers=40"}


def test_a_logged_traceback_has_the_header_on_every_line_and_still_names_its_exception() -> None:
    # logger.exception("EngineCore failed to start.") (v1/engine/core.py:708, 0.11.0): the formatter repeats
    # the header after "\r\n" on every line of the message (logging_utils/formatter.py:78)
    h = "ERROR 12-01 10:00:00 [core.py:708] "
    msg = "EngineCore failed to start.\nTraceback (most recent call last):\n  File \"core.py\", line 1, in run\n" \
          "ValueError: No available memory for the cache blocks."
    record = h + msg.replace("\n", "\r\n" + h) + "\n"
    wrapped = "".join(f"{CYAN}(EngineCore_DP0 pid=4){RESET} {x}" for x in record.splitlines(keepends=True))
    f = parse(wrapped, signatures(), VLLM)
    assert f.fatal == h + "EngineCore failed to start."
    assert f.fatal_detail == "ValueError: No available memory for the cache blocks."
