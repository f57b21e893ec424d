"""Command line (or JSON file) of one sim engine rank."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

FAULTS = (
    "rank-hang",  # /health stays 200 but no token is ever produced (also SIGUSR1 on a running rank)
    "serve-crash",  # the rank exits --serve-crash-after seconds after it starts serving (also SIGUSR2)
    "worker-crash",  # this rank dies with a fatal line while loading weights
    "slow-boot",  # boot takes --slow-boot-factor times longer
    "kv-low",  # this rank profiles less KV memory; the lane prints a KV size below --kv-tokens
    "missing-patch",  # ImportError traceback at model init, exit 1 (a bind-mounted patch file is missing)
    "engine-fatal",  # a fatal CUDA error line during graph capture, exit 1
    "engine-warning",  # a scary WARNING line at distributed init; boot carries on and serves
    "garbage-tokens",  # every answer is one repeated token (and the drafter accepts nothing)
    "count-off-by-one",  # counting answers skip one number
    "needle-blind",  # needle questions are never answered
    "no-tool-calls",  # answers in text where a tool call was due
    "nondeterministic",  # identical requests get different text
    "auth-open",  # the API key is not checked
    "stream-usage-missing",  # streams never carry the final usage chunk
    "memory-leak",  # every served request adds --leak-mb-per-request to --leak-file
    "engram-layer-nfs",  # the last Engram layer is read from the model directory (NFS), the others node-local
    "silent-tune",  # after the weights, no line for --silent-tune-seconds while a CPU is kept busy (FM-42)
    "boot-stall",  # after the weights, no line and no CPU until stopped (FM-42)
    "bimodal",  # every other burst of requests (idle to busy) runs 1.55x slower (FM-53)
)
DEFAULT_KV_TOKENS = 1_000_000
KV_LOW_FACTOR = 0.6  # kv-low: the rank finds 60% of the KV memory it was configured for


@dataclass
class Config:
    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    host: str = "0.0.0.0"
    port: int = 8000
    served_names: list[str] = field(default_factory=lambda: ["sim-model"])
    kv_tokens: int = DEFAULT_KV_TOKENS  # 0 on the command line means this default; below 0: no room for KV
    kv_memory_bytes: int | None = None  # the KV budget "Available KV cache memory" names (None: no such line)
    # --kv-cache-memory-bytes as the launch gave it: vLLM then skips profiling and prints no "Available KV
    # cache memory" line (v1/worker/gpu_worker.py:311-329 returns before :376, 0.13.0)
    kv_cache_memory_bytes: int | None = None
    gpu_memory_bytes: int | None = None  # the GPU memory vLLM sees; its "Initial free memory" before loading
    vllm_version: str = "0.13.0"  # whose lines the rank prints (prefix colour, process names, MoE line)
    max_model_len: int = 262_144
    model: str = "/models/DeepSeek-V4.1-Flash"
    model_gib: float = 81.58
    moe_backend: str | None = None
    engram_ranges: list[tuple[int, int, int]] = field(default_factory=list)
    engram_node_local: bool = False
    engram_dir: str = "/engram-local"
    # The FlashInfer autotune of a Station lane (shim/engine.py decides it from the launch): the engine-config hash
    # dir the rank makes when it starts, where the process opens it (autotune_dir) and where vLLM names it
    # (autotune_shown: the container's path); the tuner reads it autotune_read_seconds after the KV line and,
    # finding no autotune_configs.json there, tunes for autotune_tune_seconds and writes autotune_tuned configs.
    autotune_dir: str | None = None
    autotune_shown: str | None = None
    autotune_read_seconds: float = 3.0
    autotune_tune_seconds: float = 3.4
    autotune_tuned: int = 168
    rehome_layers: int | None = None
    boot_seconds: float = 5.0
    slow_boot_factor: float = 10.0
    silent_tune_seconds: float = 30.0
    rendezvous_timeout: float = 600.0
    # How long a rank takes to notice a peer died: NCCL only finds out at its next collective (real
    # timeouts are minutes). Long enough that the crashed rank's own fatal line is always logged first.
    peer_timeout: float = 10.0
    tensorfold: bool = False
    serve_args: str = ""
    serve_crash_after: float = 3.0  # the sim's own "a few seconds" of serving before serve-crash ends the rank
    api_key_env: str | None = None
    faults: list[str] = field(default_factory=list)
    log: str | None = None
    leak_file: str | None = None
    leak_mb_per_request: float = 64.0
    num_speculative_tokens: int = 5
    max_num_seqs: int = 8
    step_ms: float = 10.0
    prefill_tokens_per_s: float = 50_000.0
    decode_tokens_per_s: float = 0.0  # > 0: every stream decodes at exactly this rate (see engine.Engine)
    vision: bool = True
    tools: bool = True
    thinking_default: bool = False
    keep_alive_on_engine_death: bool = False
    # VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (vllm/envs.py, 300 in 0.11.0-0.20.0): how long the head's executor waits
    # for a step's answer (MultiprocExecutor.execute_model, v1/executor/multiproc_executor.py) before
    # "RPC call to execute_model timed out." kills the engine core
    execute_model_timeout: float = 300.0
    # VLLM_RINGBUFFER_WARNING_INTERVAL (vllm/envs.py, 60): while a step waits, the long-wait line every so often
    # (MessageQueue.acquire_read, distributed/device_communicators/shm_broadcast.py)
    ringbuffer_warning_interval: float = 60.0
    stats_interval: float = 10.0

    def has(self, fault: str) -> bool:
        return fault in self.faults


def parse_ranges(text: str) -> list[tuple[int, int, int]]:
    """'1:0:96000000,14:0:96000000' -> [(1, 0, 96000000), (14, 0, 96000000)]."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split(":")
        if len(parts) != 3:
            raise ValueError(f"engram range {item!r} is not LAYER:START:END")
        layer, start, end = (int(p) for p in parts)
        if end < start:
            raise ValueError(f"engram range {item!r} ends before it starts")
        out.append((layer, start, end))
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sparkfleet.simengine",
                                description="sparkfleet sim engine: a SIMULATED vLLM/TensorFold rank")
    a = p.add_argument
    a("--config", help="JSON file with any of the options below (keys with underscores); flags override it")
    a("--rank", type=int)
    a("--world-size", type=int)
    a("--master-addr")
    a("--master-port", type=int)
    a("--host")
    a("--port", type=int)
    a("--served-name", dest="served_names", action="append", help="repeat for aliases; the first is the model")
    a("--kv-tokens", type=int)
    a("--kv-memory-bytes", type=int, help="the KV budget in bytes, printed as 'Available KV cache memory'")
    a("--kv-cache-memory-bytes", type=int, help="the launch's own --kv-cache-memory-bytes (no profiling line)")
    a("--gpu-memory-bytes", type=int, help="the GPU's memory, free before the weights load")
    a("--vllm-version", help="the vLLM version whose lines are printed (0.11.0 .. 0.20.0; default 0.13.0)")
    a("--max-model-len", type=int)
    a("--model", help="model path printed in the load lines")
    a("--model-gib", type=float, help="GiB reported by 'Model loading took'")
    a("--moe-backend", help="a backend name (B12X_MXFP4_MXFP8) or the whole line to print")
    a("--engram-ranges", help="this rank's Engram rows, 'LAYER:START:END,...'")
    a("--engram-node-local", action="store_true", default=None)
    a("--engram-dir")
    a("--autotune-dir", help="the FlashInfer autotune hash dir this rank makes at start and its tuner reads")
    a("--autotune-shown", help="the hash dir as the engine names it in its lines (default: --autotune-dir)")
    a("--autotune-read-seconds", type=float, help="seconds after the KV line before the tuner reads the dir")
    a("--autotune-tune-seconds", type=float, help="how long a tune into an empty dir takes (silent, one CPU busy)")
    a("--autotune-tuned", type=int, help="how many configs a tune writes to autotune_configs.json")
    a("--rehome-layers", type=int, help="print 'rehome done layers=N' (Station pin-hot hook)")
    a("--boot-seconds", type=float)
    a("--slow-boot-factor", type=float)
    a("--silent-tune-seconds", type=float, help="silent-tune: seconds of silence with a busy CPU")
    a("--rendezvous-timeout", type=float)
    a("--peer-timeout", type=float, help="seconds before a rank notices a dead peer (default 10)")
    a("--api-key-env", help="name of the env var holding the API key (the key itself never goes on argv)")
    a("--tensorfold", action="store_true", default=None, help="TensorFold mode: its load lines, no vLLM KV line")
    a("--serve-args", help="TensorFold mode: the recipe's SERVE_ARGS (logged)")
    a("--serve-crash-after", type=float, help="serve-crash: seconds of serving before the rank exits")
    a("--fault", dest="faults", action="append", choices=FAULTS)
    a("--log", help="also append every log line to this file")
    a("--leak-file", help="memory-leak fault: total leaked kB is written here")
    a("--leak-mb-per-request", type=float)
    a("--num-speculative-tokens", type=int)
    a("--max-num-seqs", type=int)
    a("--step-ms", type=float, help="time of one decode step")
    a("--prefill-tokens-per-s", type=float)
    a("--decode-tokens-per-s", type=float,
      help="pace each stream at exactly this many tokens per second after its first token (instead of "
      "--step-ms per step); the first token comes alone, straight after prefill, as vLLM's prefill samples it")
    a("--text-only", dest="vision", action="store_false", default=None, help="refuse image inputs")
    a("--no-tools", dest="tools", action="store_false", default=None, help="no tool parser: auto tool choice is 400")
    a("--thinking-default", action="store_true", default=None)
    a("--keep-alive-on-engine-death", action="store_true", default=None)
    a("--execute-model-timeout", type=float, help="vLLM's VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (default 300): a step "
      "a worker never answers kills the engine this long after it was sent")
    a("--ringbuffer-warning-interval", type=float, help="vLLM's VLLM_RINGBUFFER_WARNING_INTERVAL (default 60)")
    a("--stats-interval", type=float)
    return p


def parse(argv: list[str] | None = None) -> Config:
    """Defaults, then the JSON file, then flags."""
    parser = _parser()
    ns = parser.parse_args(argv)
    values: dict = {}
    if ns.config:
        try:
            values.update(json.loads(Path(ns.config).read_text()))
        except (OSError, ValueError) as exc:
            parser.error(f"--config {ns.config}: {exc}")
    for key, value in vars(ns).items():
        if key != "config" and value is not None:
            values[key] = value
    known = set(Config.__dataclass_fields__)
    unknown = sorted(set(values) - known)
    if unknown:
        parser.error(f"unknown option(s) in --config: {', '.join(unknown)}")
    if isinstance(values.get("engram_ranges"), str):
        try:
            values["engram_ranges"] = parse_ranges(values["engram_ranges"])
        except ValueError as exc:
            parser.error(str(exc))
    else:
        values["engram_ranges"] = [tuple(r) for r in values.get("engram_ranges", [])]
    cfg = Config(**values)
    bad = [f for f in cfg.faults if f not in FAULTS]
    if bad:
        parser.error(f"unknown fault(s): {', '.join(bad)} (known: {', '.join(FAULTS)})")
    if not 0 <= cfg.rank < cfg.world_size:
        parser.error(f"--rank {cfg.rank} is outside --world-size {cfg.world_size}")
    if not cfg.served_names:
        parser.error("at least one --served-name is needed")
    if cfg.has("memory-leak") and not cfg.leak_file:
        parser.error("--fault memory-leak needs --leak-file")
    if cfg.decode_tokens_per_s < 0:
        parser.error("--decode-tokens-per-s must be 0 (off) or more")
    if cfg.kv_tokens == 0:
        cfg.kv_tokens = DEFAULT_KV_TOKENS  # an engine started by hand without a KV size still gets a cache
    return cfg
