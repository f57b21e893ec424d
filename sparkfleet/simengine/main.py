"""One sim engine rank: boot in phases with vLLM's startup lines, rendezvous, then serve (head) or follow (worker).

Every vLLM line below is vLLM's own format string, cited `file:line` in the version named (0.13.0 unless said;
tests/fixtures/vllm/ has them per version); lines vLLM has no counterpart for say `simengine` or SIMULATION."""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
from collections.abc import Callable

from sparkfleet.simengine import config as cfgmod
from sparkfleet.simengine.config import KV_LOW_FACTOR, Config
from sparkfleet.simengine.log import Log, version_tuple
from sparkfleet.simengine.rendezvous import Head, Member, Worker
from sparkfleet.simengine.server import PRINTED_ROUTES, SIM_VERSION, App, Server, make_server

SITE = "/usr/local/lib/python3.12/dist-packages"
NCCL_LOST = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
             "ProcessGroupNCCL.cpp:3690, remote process exited or there was a network error, NCCL version 2.27.7")
NCCL_DETAIL = ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
               "prematurely.")
SHARDS = 48
# the weight loader's tqdm format (model_loader/weight_utils.py:507 in 0.11.0): a `\n` after every refresh
WEIGHTS_BAR = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n"
GRAPH_SIZES = 15  # the sim's capture list length (no GPU: the bar's count only)
# 0.11-0.13's MoE sentences (quantization/mxfp4.py:125/161/164 in 0.13.0) for a stock backend name; any other
# name (B12X_MXFP4_MXFP8, the seeds' b12x images) and 0.20 print "Using '%s' Mxfp4 MoE backend."
# (fused_moe/oracle/mxfp4.py:281 in 0.20.0)
MOE_0_13 = {"MARLIN": "Using Marlin backend", "TRITON": "Using Triton backend",
            "FLASHINFER_CUTLASS_MXFP4_MXFP8": "Using FlashInfer MXFP4 MXFP8 CUTLASS backend for SM100"}


PY = "/usr/lib/python3.12"
# What the engine core's logger.exception prints when a step's RPC times out (v1/engine/core.py:868
# run_engine_core, 0.13.0): the TimeoutError of MessageQueue.acquire_read chained under the executor's own
# (multiproc_executor.py:340 get_response). Frames are 0.13.0's lines; Python 3.12's stdlib.
RPC_TIMEOUT_CAUSE = [
    (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 336, "get_response", "status, result = mq.dequeue("),
    (f"{SITE}/vllm/distributed/device_communicators/shm_broadcast.py", 616, "dequeue",
     "with self.acquire_read(timeout, cancel, indefinite) as buf:"),
    (f"{PY}/contextlib.py", 137, "__enter__", "return next(self.gen)"),
    (f"{SITE}/vllm/distributed/device_communicators/shm_broadcast.py", 536, "acquire_read", "raise TimeoutError"),
]
RPC_TIMEOUT_FRAMES = [
    (f"{SITE}/vllm/v1/engine/core.py", 859, "run_engine_core", "engine_core.run_busy_loop()"),
    (f"{SITE}/vllm/v1/engine/core.py", 886, "run_busy_loop", "self._process_engine_step()"),
    (f"{SITE}/vllm/v1/engine/core.py", 919, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
    (f"{SITE}/vllm/v1/engine/core.py", 351, "step", "model_output = future.result()"),
    (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 80, "result", "return super().result()"),
    (f"{PY}/concurrent/futures/_base.py", 449, "result", "return self.__get_result()"),
    (f"{PY}/concurrent/futures/_base.py", 401, "__get_result", "raise self._exception"),
    (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 84, "wait_for_response",
     "response = self.aggregate(get_response())"),
    (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 340, "get_response",
     'raise TimeoutError(f"RPC call to {method} timed out.") from e'),
]
# v1/engine/exceptions.py:12 (0.13.0): EngineDeadError's message
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def traceback_lines(frames: list[tuple[str, int, str, str]]) -> list[str]:
    out = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        out += [f'  File "{path}", line {line}, in {func}', f"    {code}"]
    return out


def long_wait_line(interval: float, version: str) -> str:
    """MessageQueue.acquire_read's line while a read waits (distributed/device_communicators/shm_broadcast.py:
    long_wait_time_msg, :81 in 0.13.0; 0.11.0 logs its own wording inline, :398)."""
    if version_tuple(version) < (0, 11, 1):
        return (f"No available shared memory broadcast block found in {interval:g} seconds. This typically happens "
                "when some processes are hanging or doing some time-consuming work (e.g. compilation)")
    return (f"No available shared memory broadcast block found in {interval:g} seconds. This typically happens "
            "when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv "
            "cache quantization).")


class Stop(Exception):
    """A clean stop: SIGTERM, or the head said shutdown."""


class Fatal(Exception):
    """This rank dies (its fatal lines are already printed)."""


def moe_line(value: str, version: str = "0.13.0") -> str:
    """`--moe-backend` is a backend name or the whole line a profile expects."""
    if " " in value:
        return value
    if version_tuple(version) < (0, 14) and value in MOE_0_13:
        return MOE_0_13[value]
    return f"Using '{value}' Mxfp4 MoE backend."


class Rank:
    """What every rank does: print its phases over the boot time, honouring faults and stop requests."""

    proc: str

    def __init__(self, cfg: Config, log: Log) -> None:
        self.cfg, self.log = cfg, log
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.scale = cfg.boot_seconds * (cfg.slow_boot_factor if cfg.has("slow-boot") else 1.0)
        # the engine core: EngineCore_DP0 (v1/engine/core.py:848, 0.13.0), EngineCore from 0.20 (core.py:1076)
        self.engine_proc = "EngineCore" if version_tuple(cfg.vllm_version) >= (0, 20) else "EngineCore_DP0"
        # multiproc_executor.py:852-862 (0.13.0): "Worker" + "_TP<rank>" with tensor parallelism over the nodes;
        # one GPU runs the model inside the engine core (uniproc executor), under its prefix
        self.worker_proc = f"Worker_TP{cfg.rank}" if cfg.world_size > 1 else self.engine_proc
        self.vllm_020 = version_tuple(cfg.vllm_version) >= (0, 20)
        self.hang = threading.Event()  # rank-hang, from --fault or SIGUSR1 on a running rank
        if cfg.has("rank-hang"):
            self.hang.set()
        self.crash = threading.Event()  # serve-crash, from --fault or SIGUSR2 on a running rank
        if cfg.has("serve-crash"):
            self.crash.set()
        self.crash_at: float | None = None
        self.serving_since: float | None = None

    def crash_due(self) -> bool:
        """serve-crash: True once the rank has served --serve-crash-after seconds since it was asked to crash."""
        if not self.crash.is_set() or self.serving_since is None:
            return False
        if self.crash_at is None:
            self.crash_at = max(self.serving_since, time.monotonic()) + self.cfg.serve_crash_after
        return time.monotonic() >= self.crash_at

    def crash_line(self, proc: str) -> None:
        served = time.monotonic() - (self.serving_since or time.monotonic())
        self.log.error(proc, "simengine", f"sim fault serve-crash: the engine exits after serving {served:.1f} s")

    def check(self) -> None:
        """Raise Stop or Fatal when the rank must end now."""
        if self.stop.is_set():
            raise Stop

    def pause(self, fraction: float) -> None:
        """Spend a fraction of the boot time, staying responsive to stop and to the other ranks."""
        deadline = time.monotonic() + self.scale * fraction
        while True:
            self.check()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.stop.wait(min(left, 0.05))

    def silent_phase(self) -> None:
        """silent-tune: no line for --silent-tune-seconds while one CPU stays busy (the Station's autotune at
        100% GPU, FM-42); boot-stall: no line and no CPU until stopped (a hung boot). Both stay stoppable."""
        if self.cfg.has("boot-stall"):
            self.stop.wait()
            self.check()
        if self.cfg.has("silent-tune"):
            self.busy(self.cfg.silent_tune_seconds)

    def busy(self, seconds: float) -> None:
        """Keep one CPU busy for `seconds`, staying stoppable (a tuner's host thread spinning on the GPU)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check()
            spin = time.monotonic() + 0.05
            while time.monotonic() < spin:
                pass

    def autotune_dir_made(self) -> None:
        """vLLM makes the engine-config hash dir under its persistent cache when it starts: "Every launch-flag change
        makes a new autotune hash directory", and it stays empty until a copy lands or the tuner fills it ([000]:
        "the new engine-config hash directory was empty for the 60 seconds it took me to copy the cache in")."""
        if self.cfg.autotune_dir:
            os.makedirs(self.cfg.autotune_dir, exist_ok=True)

    def autotune(self, proc: str) -> None:
        """FlashInfer's autotune of the MoE kernel, which reads the hash dir "roughly two minutes after the KV gate"
        ([000]; the sim: --autotune-read-seconds). A dir holding autotune_configs.json is loaded and nothing is
        tuned ("Loaded 168 configs", LCH-G3); an empty one is tuned, with "nothing in the log but 100% GPU" for 74
        minutes ([000]; the sim: --autotune-tune-seconds with one CPU busy), and the tuned configs written there.
        The `[Autotuner]:` lines are FlashInfer's autotuner's wording and line numbers as a vLLM log of FlashInfer
        0.6.14 shows them (the seeds quote only "Loaded 168 configs"); vLLM's log format wraps them here."""
        c = self.cfg
        if not c.autotune_dir:
            return
        deadline = time.monotonic() + c.autotune_read_seconds
        while (left := deadline - time.monotonic()) > 0:
            self.check()
            self.stop.wait(min(left, 0.05))
        path = os.path.join(c.autotune_dir, "autotune_configs.json")
        shown = os.path.join(c.autotune_shown or c.autotune_dir, "autotune_configs.json")
        try:
            with open(path) as fh:
                configs = json.load(fh).get("configs") or {}
        except (OSError, ValueError, AttributeError):
            configs = {}
        if configs:
            self.log.info(proc, "autotuner.py:1899", f"[Autotuner]: Loaded {len(configs)} configs from {shown}")
            return
        self.log.info(proc, "autotuner.py:651", "[Autotuner]: Autotuning process starts ...")
        self.busy(c.autotune_tune_seconds)
        tuned = {f"trtllm_fp4_block_scale_moe_op/{i}": i % 32 for i in range(c.autotune_tuned)}  # op/shape -> tactic
        tmp = path + f".{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump({"simulation": "sparkfleet-sim: tuned configs of no real kernel", "configs": tuned}, fh)
        os.replace(tmp, path)
        self.log.info(proc, "autotuner.py:674", "[Autotuner]: Autotuning process ends")

    def banner(self, proc: str) -> None:
        c = self.cfg
        if c.tensorfold:  # the seeds show no TensorFold boot lines: these are the sim's own
            self.log.info(proc, "simengine", f"SIMULATION: sparkfleet-sim engine {SIM_VERSION} standing in for "
                          f"TensorFold (rank {c.rank} of {c.world_size}); no GPU and no model weights are used")
            self.log.info(proc, "simengine", f"sim TensorFold: serve args: {c.serve_args}")
        else:
            self.log.info(proc, "simengine", f"SIMULATION: sparkfleet-sim engine {SIM_VERSION} standing in for vLLM "
                          f"(rank {c.rank} of {c.world_size}); no GPU and no model weights are used")
        if c.faults:
            self.log.info(proc, "simengine", f"SIMULATION: injected faults: {', '.join(c.faults)}")

    def exception(self, proc: str, where: str, message: str, frames: list[tuple[str, int, str, str]],
                  last: str, cause: tuple[list[tuple[str, int, str, str]], str] | None = None) -> None:
        """logger.exception(message): one ERROR record with the traceback in it, so every line of it carries
        the header (logging_utils/formatter.py:76) and the process prefix. `cause`: the exception it was
        raised from (`raise ... from e`), printed first, as Python prints a chain."""
        chain = [*traceback_lines(cause[0]), cause[1], "", "The above exception was the direct cause of the "
                 "following exception:", ""] if cause else []
        self.log.error(proc, where, "\n".join([message, *chain, *traceback_lines(frames), last]))

    # ------------------------------------------------------------------------------------ phases

    def model_phases(self, report_kv: Callable[[int], None]) -> None:
        """Model init, weights, KV profiling, graph capture: the lines every rank prints."""
        c, log, p = self.cfg, self.log, self.worker_proc
        if c.tensorfold:
            self.tensorfold_phases(report_kv)
            return
        # distributed/parallel_state.py:1162
        log.info(p, "parallel_state.py:1162", f"world_size={c.world_size} rank={c.rank} local_rank=0 "
                 f"distributed_init_method=tcp://{c.master_addr}:{c.master_port} backend=nccl")
        self.autotune_dir_made()
        if c.has("engine-warning"):
            # Looks fatal to a grep for "CUDA error", but it is a WARNING and the boot carries on. The sim's
            # own wording (vLLM's custom all-reduce warnings differ by version).
            log.warning(p, "custom_all_reduce.py:137", "Custom allreduce is disabled because the P2P access probe "
                        "returned a CUDA error between ranks (expected on GB10 unified memory); falling back to "
                        "NCCL all-reduce, which may be slower. To silence this warning, specify "
                        "disable_custom_all_reduce=True explicitly.")
        self.pause(0.04)
        if c.has("missing-patch"):
            # multiproc_executor.py:751 logger.exception("WorkerProc failed to start.")
            self.exception(p, "multiproc_executor.py:751", "WorkerProc failed to start.", [
                (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 722, "worker_main",
                 "worker = WorkerProc(*args, **kwargs)"),
                (f"{SITE}/vllm/model_executor/models/registry.py", 727, "_try_load_model_cls",
                 "return model.load_model_cls()"),
                (f"{SITE}/vllm/models/deepseek_v4_1/model.py", 41, "<module>",
                 "from vllm.models.deepseek_v4_1.common.engram import EngramDiskReader"),
            ], "ImportError: cannot import name 'EngramDiskReader' from 'vllm.models.deepseek_v4_1.common.engram' "
               f"({SITE}/vllm/models/deepseek_v4_1/common/engram.py)")
            raise Fatal
        log.info(p, "gpu_model_runner.py:3563", f"Starting to load model {c.model}...")  # v1/worker/
        if c.moe_backend:
            log.info(p, "mxfp4.py:125", moe_line(c.moe_backend, c.vllm_version))
        for layer, start, end in c.engram_ranges:  # the DeepSeek V4.1 patch's lines (the seeds)
            log.info(p, "engram.py:212", f"Engram DISK mode: layer {layer} rows [{start}, {end})")
        for layer, start, end in c.engram_ranges:
            local = c.engram_node_local and not (c.has("engram-layer-nfs") and layer == c.engram_ranges[-1][0])
            where = f"read from node-local {c.engram_dir}" if local else \
                "read from the model directory (no node-local copy)"
            log.info(p, "engram.py:248", f"Engram layer {layer} rows [{start}, {end}) {where}")
        if c.engram_node_local and not c.engram_ranges:
            log.info(p, "engram.py:248", f"Engram rows read from node-local {c.engram_dir}")
        loaded = time.monotonic()

        def shard(n: int) -> None:
            if n == SHARDS // 2 and c.has("worker-crash"):
                raise Fatal
            self.pause(0.5 / SHARDS)

        try:
            if c.rank == 0:  # only global rank 0 shows the bar (weight_utils.py enable_tqdm)
                log.bar(p, "Loading safetensors checkpoint shards", SHARDS, shard, WEIGHTS_BAR)
            else:
                for n in range(1, SHARDS + 1):
                    shard(n)
        except Fatal:
            self.exception(p, "multiproc_executor.py:824", "WorkerProc hit an exception.", [
                (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 819, "worker_busy_loop",
                 "output = func(*args, **kwargs)"),
                (f"{SITE}/vllm/model_executor/model_loader/weight_utils.py", 687, "safetensors_weights_iterator",
                 "param = f.get_tensor(name)"),
            ], f"OSError: [Errno 5] Input/output error: '{c.model}/model-{SHARDS // 2:05d}-of-{SHARDS:05d}"
               ".safetensors'")
            raise
        # model_loader/default_loader.py:309, v1/worker/gpu_model_runner.py:3660
        log.info(p, "default_loader.py:309", f"Loading weights took {time.monotonic() - loaded:.2f} seconds")
        log.info(p, "gpu_model_runner.py:3660", f"Model loading took {c.model_gib:.4f} GiB memory and "
                 f"{time.monotonic() - loaded:.6f} seconds")
        self.silent_phase()
        self.pause(0.1)
        kv = int(c.kv_tokens * (KV_LOW_FACTOR if c.has("kv-low") else 1.0))
        low = KV_LOW_FACTOR if c.has("kv-low") else 1
        if c.kv_cache_memory_bytes is not None:
            # v1/worker/gpu_worker.py:311-329: the budget as given, no profiling, no "Available KV cache memory"
            free = f"{c.gpu_memory_bytes / 2**30:.2f}" if c.gpu_memory_bytes else "(unknown to the sim)"
            log.info(p, "gpu_worker.py:328", f"Initial free memory {free} GiB, reserved "
                     f"{c.kv_cache_memory_bytes / 2**30:.2f} GiB memory for KV Cache as specified by "
                     "kv_cache_memory_bytes config and skipped memory profiling. This does not respect the "
                     "gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual "
                     "control of KV cache memory size. If OOM'ed, check the difference of initial free memory "
                     "between the current run and the previous run where kv_cache_memory_bytes is suggested and "
                     "update it correspondingly.")
            kv_line = None
        else:
            budget = None if c.kv_memory_bytes is None else c.kv_memory_bytes * low
            # v1/worker/gpu_worker.py:376
            kv_line = None if budget is None else f"Available KV cache memory: {budget / 2**30:.2f} GiB"
        if kv < 0 and not c.tensorfold:  # the budget left nothing for KV: vLLM's profiling refuses (FM-45)
            if kv_line:
                log.info(p, "gpu_worker.py:376", kv_line)
            # v1/engine/core.py:866 logger.exception; the ValueError from v1/core/kv_cache_utils.py
            self.exception(self.engine_proc, "core.py:866", "EngineCore failed to start.", [
                (f"{SITE}/vllm/v1/engine/core.py", 857, "run_engine_core",
                 "engine_core = EngineCoreProc(*args, **kwargs)"),
                (f"{SITE}/vllm/v1/core/kv_cache_utils.py", 687, "check_enough_kv_cache_memory",
                 "raise ValueError("),
            ], "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
               "when initializing the engine.")
            raise Fatal
        if kv_line and not c.tensorfold:  # vLLM's KV line (from the budget the launch gave); TensorFold prints none
            log.info(p, "gpu_worker.py:376", kv_line)
        report_kv(kv)
        self.autotune(p)
        captured = time.monotonic()
        if c.rank == 0:  # "Only rank 0 should print progress bar during capture" (gpu_model_runner.py:4606)
            for mode in (("mixed prefill-decode", "PIECEWISE"), ("decode", "FULL")):
                log.bar(p, "Capturing CUDA graphs ({}, {})".format(*mode), GRAPH_SIZES,  # gpu_model_runner.py:4611
                        lambda n: self.pause(0.1 / GRAPH_SIZES))
        else:
            self.pause(0.2)
        if c.has("engine-fatal"):
            # v1/engine/core.py:868 logger.exception("EngineCore encountered a fatal error.")
            self.exception(self.engine_proc, "core.py:868", "EngineCore encountered a fatal error.", [
                (f"{SITE}/vllm/v1/engine/core.py", 859, "run_engine_core", "engine_core.run_busy_loop()"),
            ], "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
               "asynchronously reported at some other API call, so the stacktrace below might be incorrect.")
            raise Fatal
        # v1/worker/gpu_model_runner.py:4588
        log.info(p, "gpu_model_runner.py:4588", f"Graph capturing finished in {time.monotonic() - captured:.0f} "
                 "secs, took 1.99 GiB")
        if c.rehome_layers is not None:  # the Station's pin-hot hook (the seeds)
            log.info(p, "pin_hot_experts_hook.py:412", f"rehome done layers={c.rehome_layers}")
        self.pause(0.05)

    def tensorfold_phases(self, report_kv: Callable[[int], None]) -> None:
        """A TensorFold rank's load. The seeds print no TensorFold boot line, so every line
        here is THE SIM'S OWN INVENTION, tagged `sim TensorFold:`; none is shaped like vLLM's."""
        c, log, p = self.cfg, self.log, f"TensorFold_R{self.cfg.rank}"
        log.info(p, "simengine", f"sim TensorFold: rank {c.rank} of {c.world_size} loading {c.model} "
                 f"(rendezvous {c.master_addr}:{c.master_port})")
        if c.has("worker-crash"):
            log.error(p, "simengine", f"sim TensorFold: rank {c.rank} failed loading {c.model}")
            raise Fatal
        loaded = time.monotonic()
        self.pause(0.5)
        log.info(p, "simengine", f"sim TensorFold: rank {c.rank} loaded in {time.monotonic() - loaded:.1f} s")
        report_kv(max(c.kv_tokens, 0))  # the ranks still tell the head they are loaded; no KV line is printed
        self.pause(0.2)

    @staticmethod
    def _clock(seconds: float) -> str:
        return f"{int(seconds) // 60:02d}:{int(seconds) % 60:02d}"


class HeadRank(Rank):
    """Rank 0: the rendezvous, its own share of the model, then the API server."""

    def __init__(self, cfg: Config, log: Log) -> None:
        super().__init__(cfg, log)
        self.app = App(cfg, log)
        self.rdv: Head | None = None
        self.lane_kv = cfg.kv_tokens
        self.httpd: Server | None = None
        self.listening = False

    def lost(self) -> list[Member]:
        """Workers gone for longer than --peer-timeout: the head notices at its next collective, not at once."""
        return self.rdv.lost(self.cfg.peer_timeout) if self.rdv else []

    def check(self) -> None:
        super().check()
        lost = self.lost()
        if lost:
            self.report_lost(lost[0])
            raise Fatal

    def report_lost(self, m: Member) -> None:
        """A remote worker died: this node's worker fails its next collective, exits, and the engine core and
        the API server follow (vLLM prints no line naming the remote rank)."""
        ago = time.monotonic() - (m.lost_at or time.monotonic())
        self.log.info(self.engine_proc, "simengine", f"SIMULATION: rank {m.rank} (pid {m.pid} on {m.link.peer}) "
                      f"went away {ago:.1f} s ago; this rank notices at its next collective")
        self.exception(self.worker_proc, "multiproc_executor.py:824", "WorkerProc hit an exception.", [
            (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 819, "worker_busy_loop",
             "output = func(*args, **kwargs)"),
        ], f"{NCCL_LOST}\n{NCCL_DETAIL}")
        self.death_lines()

    def death_lines(self) -> None:
        """The engine's own workers gone: multiproc_executor.py:232 (the executor's monitor) and, in the API
        server, core_client.py:607 (0.13.0); 0.20's client says nothing more (no such line in core_client.py)."""
        self.log.error(self.engine_proc, "multiproc_executor.py:232",
                       "Worker proc VllmWorker-0 died unexpectedly, shutting down executor.")
        if not self.vllm_020:
            self.log.error("APIServer", "core_client.py:607",
                           f"Engine core proc {self.engine_proc} died unexpectedly, shutting down client.")

    def _joined(self, m: Member, extra: bool) -> None:
        self.log.info(self.engine_proc, "simengine", f"rank {m.rank} joined the rendezvous from {m.link.peer} "
                      f"(pid {m.pid}){' after the world was complete' if extra else ''}")

    def run(self) -> int:
        c, log = self.cfg, self.log
        self.banner("APIServer")
        if not c.tensorfold:
            # entrypoints/utils.py:253, then openai/api_server.py:1351 (0.13.0); 0.20 prints its logo instead
            # (entrypoints/utils.py:277-300) with "version" and "model" in it
            log.info("APIServer", "utils.py:253", f"non-default args: {{'model': '{c.model}', 'host': '{c.host}', "
                     f"'port': {c.port}}}")
            if self.vllm_020:
                log.info("APIServer", "utils.py:300", "\n       █     █     █▄   ▄█\n"
                         f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {SIM_VERSION}\n"
                         f"  █▄█▀ █     █     █     █  model   {c.model}\n   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀\n")
            else:
                log.info("APIServer", "api_server.py:1351", f"vLLM API server version {SIM_VERSION}")
        if c.tensorfold:
            pass
        elif c.api_key_env and self.app.key:
            log.info("APIServer", "api_server.py:1895", f"API key authentication is on for /v1 (key from "
                     f"${c.api_key_env}; never logged)")
        elif c.api_key_env:
            log.warning("APIServer", "api_server.py:1897", f"${c.api_key_env} is not set: the API is open")
        try:
            self.rdv = Head(c.master_addr, c.master_port, c.world_size, self._joined)
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, "UNKNOWN")
            self.exception(self.engine_proc, "core.py:866", "EngineCore failed to start.",
                           [(f"{SITE}/torch/distributed/rendezvous.py", 189, "_create_c10d_store",
                             "return TCPStore(")],
                           "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
                           f"network address. port: {c.master_port}, useIpv6: false, code: -{exc.errno}, name: "
                           f"{code}, message: {exc.strerror}")
            return 1
        try:
            # vLLM binds its socket first and listens only once uvicorn starts (create_server_socket,
            # openai/api_server.py:1809 in 0.11.0, binds without listen): connection refused while booting
            httpd = make_server(self.app, c.host, c.port)
        except OSError as exc:
            log.line("APIServer", f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                     f"('{c.host}', {c.port}): {exc.strerror}")
            self.rdv.shutdown()
            return 1
        self.httpd = httpd
        code = 0
        try:
            code = self._boot_and_serve()
        except Stop:
            if not c.tensorfold:
                log.info("APIServer", "launcher.py:80", "Shutting down FastAPI HTTP server.")
        except Fatal:
            code = 1
        finally:
            self.app.released.set()
            self.rdv.shutdown()
            if self.listening:
                httpd.shutdown()
            httpd.server_close()
        return code

    def _boot_and_serve(self) -> int:
        c, log, rdv = self.cfg, self.log, self.rdv
        assert rdv is not None
        if c.tensorfold:  # the recipe starts ranks 3, 2, 1, then 0 (LCH-T5); the head waits for them in that order
            for r in range(c.world_size - 1, 0, -1):
                log.info("TensorFold_R0", "simengine", f"sim TensorFold: waiting for rank {r}")
                if not rdv.wait_rank(r, c.rendezvous_timeout, self._aborting):
                    break
            log.info("TensorFold_R0", "simengine", "sim TensorFold: rank 0 (this rank) joins last")
        elif c.world_size > 1:
            log.info(self.engine_proc, "simengine", f"waiting for {c.world_size - 1} worker(s) on the rendezvous "
                     f"{c.master_addr}:{c.master_port}")
        if not rdv.wait(lambda world: True, c.rendezvous_timeout, self._aborting):
            self.check()
            self.exception(self.engine_proc, "core.py:866", "EngineCore failed to start.",
                           [(f"{SITE}/torch/distributed/rendezvous.py", 189, "_create_c10d_store",
                             "return TCPStore(")],
                           f"torch.distributed.DistStoreError: Timed out after {c.rendezvous_timeout:.0f} seconds "
                           f"waiting for clients. {rdv.joined()}/{c.world_size} clients joined.")
            raise Fatal
        rdv.send_go()
        self.model_phases(self._sync_kv)
        if not rdv.wait(lambda world: all(m.ready for m in world), c.rendezvous_timeout, self._aborting):
            self.check()
            log.error(self.engine_proc, "simengine", "SIMULATION: the workers did not get ready")
            log.error(self.engine_proc, "core.py:866", "EngineCore failed to start.")
            raise Fatal
        api = "APIServer"
        if c.tensorfold:
            log.info("TensorFold_R0", "simengine", f"sim TensorFold: serving {', '.join(c.served_names)} on "
                     f"http://{c.host}:{c.port} after {time.monotonic() - self.started:.2f} s")
        else:
            # v1/engine/core.py:260 (0.13.0; 0.20 ends "took %.2f s", core.py:307)
            took = time.monotonic() - self.started
            log.info(self.engine_proc, "core.py:260", "init engine (profile, create kv cache, warmup model) took "
                     + (f"{took:.2f} s" if self.vllm_020 else f"{took:.2f} seconds"))
            self.pause(0.05)
            if self.vllm_020:  # entrypoints/openai/api_server.py:602 (0.20.0)
                log.info(api, "api_server.py:602", f"Starting vLLM server on http://{c.host}:{c.port}")
            else:  # entrypoints/openai/api_server.py:1426 (0.13.0)
                log.info(api, "api_server.py:1426", f"Starting vLLM API server 0 on http://{c.host}:{c.port}")
            log.info(api, "launcher.py:38", "Available routes are:")  # entrypoints/launcher.py:38-46
            for path, methods in PRINTED_ROUTES:
                log.info(api, "launcher.py:46", f"Route: {path}, Methods: {methods}")
        # uvicorn's lines (the ASGI server either engine's OpenAI server runs on; the TensorFold adapter's
        # readiness line, engines/tensorfold.py), bare in TensorFold mode, under vLLM's process prefix otherwise:
        # uvicorn/server.py:101, lifespan/on.py:48 and :62 (uvicorn 0.54.0)
        uv = None if c.tensorfold else api
        log.line(uv, f"INFO:     Started server process [{log.pid}]")
        log.line(uv, "INFO:     Waiting for application startup.")
        # a multi-node vLLM head: every request's step needs each remote worker (the rendezvous' step round trip)
        self.app.start_serving(self.lane_kv, self._step_gate if c.world_size > 1 and not c.tensorfold else None)
        log.line(uv, "INFO:     Application startup complete.")
        assert self.httpd is not None
        self.httpd.server_activate()  # uvicorn listens after the lifespan startup (server.py startup)
        self.listening = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        threading.Thread(target=self._stats, daemon=True).start()
        self.serving_since = time.monotonic()
        reported, warned, stuck_at = 0, 0, None
        while not self.stop.wait(0.1):
            if self.hang.is_set() or (self.rdv and self.rdv.any_hung()):
                self.app.hung.set()
            if self.crash_due():
                self.crash_line(self.engine_proc)
                self.death_lines()
                self.app.engine_died()
                return 1
            if c.tensorfold:  # the sim's own rule for TensorFold (no source to follow): a dead peer ends the lane
                lost = self.lost()
                if len(lost) > reported:
                    self.report_lost(lost[reported])
                    reported = len(lost)
                    self.app.engine_died()
                    if not c.keep_alive_on_engine_death:
                        return 1
                continue
            lost = rdv.lost()
            for m in lost[reported:]:
                # vLLM prints nothing here: the executor's monitor waits on this node's worker processes only
                # (MultiprocExecutor.start_worker_monitor, v1/executor/multiproc_executor.py:216, 0.13.0)
                log.info(self.engine_proc, "simengine", f"SIMULATION: rank {m.rank} (pid {m.pid} on {m.link.peer}) "
                         "closed its connection; vLLM's head notices nothing until a step needs that rank")
            reported = len(lost)
            since = rdv.stuck_since() if self.app.state == "serving" else None
            if since != stuck_at:  # a new wait: MessageQueue.acquire_read counts its warnings per read
                stuck_at, warned = since, 0
            if since is None:
                continue
            waited = time.monotonic() - since
            if waited > c.ringbuffer_warning_interval * (warned + 1) and waited < c.execute_model_timeout:
                warned += 1  # shm_broadcast.py:542 (0.13.0), under the engine core, which reads the step's answer
                log.info(self.engine_proc, "shm_broadcast.py:542",
                         long_wait_line(c.ringbuffer_warning_interval, c.vllm_version))
            if waited >= c.execute_model_timeout:
                self.step_timed_out()
                if not c.keep_alive_on_engine_death:
                    return self.exit_after_engine_death(uv)
        if not c.tensorfold:
            log.info(api, "launcher.py:80", "Shutting down FastAPI HTTP server.")
        log.line(uv, "INFO:     Shutting down")  # uvicorn/server.py
        log.line(uv, f"INFO:     Finished server process [{log.pid}]")
        return 1 if self.app.state == "dead" else 0

    def _step_gate(self) -> bool:
        """A request's step: every remote worker must take part; waits while one cannot (engine.Engine.gate)."""
        assert self.rdv is not None
        return self.rdv.step(lambda: self.stop.is_set() or self.app.state == "dead")

    def step_timed_out(self) -> None:
        """A step no remote worker answered for VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: the executor's TimeoutError
        kills the engine core (v1/engine/core.py:868, 0.13.0), which tells the API server it is dead
        (_send_engine_dead); the server's output handler fails (v1/engine/async_llm.py:538 output_handler, the
        EngineDeadError raised by core_client.py:895 get_output_async), and every request waiting gets
        EngineDeadError. The client's process monitor prints nothing then: engine_dead is already set
        (core_client.py:600 monitor_engine_cores)."""
        self.exception(self.engine_proc, "core.py:868", "EngineCore encountered a fatal error.", RPC_TIMEOUT_FRAMES,
                       "TimeoutError: RPC call to execute_model timed out.", cause=(RPC_TIMEOUT_CAUSE, "TimeoutError"))
        self.exception("APIServer", "async_llm.py:538", "AsyncLLM output_handler failed.", [
            (f"{SITE}/vllm/v1/engine/async_llm.py", 490, "output_handler",
             "outputs = await engine_core.get_output_async()"),
            (f"{SITE}/vllm/v1/engine/core_client.py", 895, "get_output_async",
             "raise self._format_exception(outputs) from None"),
        ], f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD}")
        self.app.engine_died()

    def exit_after_engine_death(self, uv: str | None) -> int:
        """The requests that met the dead engine are answered (500, no body), then uvicorn exits: the launcher's
        exception handler (entrypoints/launcher.py:128 terminate_if_errored, or its 5 s watchdog_loop) sets
        should_exit, and uvicorn shuts down (uvicorn/server.py Server.shutdown, lifespan/on.py shutdown)."""
        self.app.drained(5.0)
        for text in ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.",
                     f"Finished server process [{self.log.pid}]"):
            self.log.line(uv, f"INFO:     {text}")
        return 1

    def _aborting(self) -> bool:
        return self.stop.is_set() or bool(self.lost())

    def _sync_kv(self, own: int) -> None:
        """The lane's KV is the smallest any rank found (vLLM sizes the cache by the tightest rank)."""
        c, rdv = self.cfg, self.rdv
        assert rdv is not None
        if not rdv.wait(lambda world: all(m.kv is not None for m in world), c.rendezvous_timeout, self._aborting):
            self.check()
            raise Fatal
        with rdv.cond:
            kvs = [m.kv for m in rdv.state.members.values() if m.rank < c.world_size and m.kv is not None]
        self.lane_kv = min([own, *kvs])
        if c.tensorfold:  # TensorFold prints no vLLM KV line
            self.log.info(self.engine_proc, "simengine", f"sim TensorFold: {c.world_size} rank(s) loaded")
            return
        # v1/core/kv_cache_utils.py:1291 and :1297 (0.13.0)
        self.log.info(self.engine_proc, "kv_cache_utils.py:1291", f"GPU KV cache size: {self.lane_kv:,} tokens")
        self.log.info(self.engine_proc, "kv_cache_utils.py:1297", f"Maximum concurrency for {c.max_model_len:,} "
                      f"tokens per request: {self.lane_kv / c.max_model_len:.2f}x")

    def _stats(self) -> None:
        """vLLM's periodic line, when there was traffic in the last interval."""
        m = self.app.metrics
        last = (0.0, 0.0)
        while not self.stop.wait(self.cfg.stats_interval):
            with m.lock:
                now = (m.counters["vllm:prompt_tokens"], m.counters["vllm:generation_tokens"])
                queries, hits = m.counters["vllm:prefix_cache_queries"], m.counters["vllm:prefix_cache_hits"]
            if now == last or self.app.engine is None:
                continue
            running, waiting, usage = self.app.engine.snapshot()
            dt = self.cfg.stats_interval
            self.log.info("APIServer", "loggers.py:123", f"Engine 000: Avg prompt throughput: "
                          f"{(now[0] - last[0]) / dt:.1f} tokens/s, Avg generation throughput: "
                          f"{(now[1] - last[1]) / dt:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} "
                          f"reqs, GPU KV cache usage: {usage * 100:.1f}%, Prefix cache hit rate: "
                          f"{(hits / queries * 100) if queries else 0.0:.1f}%")
            last = now


class WorkerRank(Rank):
    """Ranks 1..N-1: join the head, boot, report, then wait for shutdown (or die when the head goes)."""

    def __init__(self, cfg: Config, log: Log) -> None:
        super().__init__(cfg, log)
        self.link: Worker | None = None
        self.told_head_lost = False

    def check(self) -> None:
        super().check()
        if self.link is None:
            return
        if self.link.shutdown.is_set():
            raise Stop
        if self.link.head_lost.is_set() and self.serving_since is not None and not self.cfg.tensorfold:
            # A serving headless worker waits for the head's next broadcast with no timeout
            # (WorkerProc.worker_busy_loop: rpc_broadcast_mq.dequeue(cancel=..., indefinite=True),
            # v1/executor/multiproc_executor.py:810, 0.13.0), and no collective runs to fail: it blocks, printing
            # nothing, until it is stopped (run_headless's SIGTERM handler, entrypoints/cli/serve.py:104).
            if not self.told_head_lost:
                self.told_head_lost = True
                self.log.info(self.worker_proc, "simengine", "SIMULATION: the head's connection closed; this "
                              "headless worker waits for the head's next step and does not exit")
            return
        if self.link.head_lost.is_set() and time.monotonic() - self.link.lost_at >= self.cfg.peer_timeout:
            self.log.info(self.worker_proc, "simengine", "SIMULATION: the head went away; this rank notices at its "
                          "next collective")
            self.exception(self.worker_proc, "multiproc_executor.py:824", "WorkerProc hit an exception.", [
                (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 819, "worker_busy_loop",
                 "output = func(*args, **kwargs)"),
            ], f"{NCCL_LOST}\n{NCCL_DETAIL}")
            raise Fatal

    def run(self) -> int:
        c, log, p = self.cfg, self.log, self.worker_proc
        self.banner(p)
        log.info(p, "simengine", f"connecting to the rendezvous at {c.master_addr}:{c.master_port} "
                 f"(headless worker, rank {c.rank})")
        deadline = time.monotonic() + c.rendezvous_timeout
        self.link = Worker.connect(c.master_addr, c.master_port, deadline, self.stop)
        if self.link is None:
            if self.stop.is_set():
                return 0
            log.error(p, "simengine", "SIMULATION: could not reach the head")
            log.line(p, f"torch.distributed.DistNetworkError: The client socket has timed out after "
                     f"{c.rendezvous_timeout:.0f}s while trying to connect to ({c.master_addr}, {c.master_port}).")
            return 1
        try:
            self.link.send({"op": "join", "rank": c.rank, "world_size": c.world_size, "pid": os.getpid()})
            if not self.link.welcome.wait(10):
                self.check()
                log.error(p, "simengine", "SIMULATION: the rendezvous did not answer")
                log.line(p, NCCL_LOST)
                return 1
            log.info(p, "simengine", f"joined the rendezvous at {c.master_addr}:{c.master_port}")
            waited = time.monotonic()
            while not self.link.go.wait(0.05):
                self.check()
                if time.monotonic() - waited > c.rendezvous_timeout:
                    log.line(p, f"torch.distributed.DistStoreError: Timed out after {c.rendezvous_timeout:.0f} "
                             "seconds waiting for the other ranks.")
                    return 1
            self.model_phases(lambda kv: self.link.send({"op": "kv", "tokens": kv}) if self.link else None)
            self.link.send({"op": "ready"})
            log.info(p, "simengine", "worker ready; serving through the head")
            self.serving_since = time.monotonic()
            told_hang = False
            while True:
                self.check()
                if self.hang.is_set() and not told_hang:
                    told_hang = self.link.send({"op": "hang"})
                if self.crash_due():
                    self.crash_line(p)
                    return 1
                self.stop.wait(0.1)
        except Stop:
            why = "the head asked" if self.link.shutdown.is_set() else "stop signal"
            if c.tensorfold:
                log.info(p, "simengine", f"sim TensorFold: rank {c.rank} shutting down ({why})")
            else:
                log.info(p, "multiproc_executor.py:753", "WorkerProc shutting down.")  # multiproc_executor.py:753
                log.info(p, "simengine", f"SIMULATION: {why}")
            return 0
        except Fatal:
            return 1
        finally:
            self.link.link.close()


def main(argv: list[str] | None = None) -> int:
    cfg = cfgmod.parse(argv)
    log = Log(cfg.log, tensorfold=cfg.tensorfold, version=cfg.vllm_version)
    rank: Rank = HeadRank(cfg, log) if cfg.rank == 0 else WorkerRank(cfg, log)

    def on_signal(signum: int, _frame: object) -> None:
        rank.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    def on_hang(_signum: int, _frame: object) -> None:
        """The sim's rank-hang fault on a running rank: a serving head stops producing tokens at once (its
        serving loop would only see it at its next 0.1 s tick, so a request sent right after the fault acted
        could still be answered)."""
        rank.hang.set()
        if isinstance(rank, HeadRank):
            rank.app.hung.set()

    signal.signal(signal.SIGUSR1, on_hang)
    signal.signal(signal.SIGUSR2, lambda *_: rank.crash.set())  # the sim's serve-crash fault on a running rank
    try:
        return rank.run()  # type: ignore[attr-defined]
    finally:
        log.close()
