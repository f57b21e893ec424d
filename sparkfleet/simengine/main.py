"""One sim engine rank: boot in phases with vLLM's startup lines, rendezvous, then serve (head) or follow (worker)."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from collections.abc import Callable

from sparkfleet.simengine import config as cfgmod
from sparkfleet.simengine.config import KV_LOW_FACTOR, Config
from sparkfleet.simengine.log import Log
from sparkfleet.simengine.rendezvous import Head, Member, Worker
from sparkfleet.simengine.server import ROUTES, SIM_VERSION, App, make_server

SITE = "/usr/local/lib/python3.12/dist-packages"
NCCL_LOST = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
             "ProcessGroupNCCL.cpp:3690, remote process exited or there was a network error, NCCL version 2.27.7")
NCCL_DETAIL = ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
               "prematurely.")
SHARDS = 48


class Stop(Exception):
    """A clean stop: SIGTERM, or the head said shutdown."""


class Fatal(Exception):
    """This rank dies (its fatal lines are already printed)."""


def moe_line(value: str) -> str:
    """`--moe-backend` is a backend name or the whole line a profile expects."""
    return value if " " in value else f"Using '{value}' Mxfp4 MoE backend."


class Rank:
    """What every rank does: print its phases over the boot time, honouring faults and stop requests."""

    proc: str

    def __init__(self, cfg: Config, log: Log) -> None:
        self.cfg, self.log = cfg, log
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.scale = cfg.boot_seconds * (cfg.slow_boot_factor if cfg.has("slow-boot") else 1.0)
        self.worker_proc = f"Worker_TP{cfg.rank}"
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

    def traceback(self, frames: list[tuple[str, int, str, str]], last: str) -> None:
        self.log.raw("Traceback (most recent call last):")
        for path, line, func, code in frames:
            self.log.raw(f'  File "{path}", line {line}, in {func}')
            self.log.raw(f"    {code}")
        self.log.raw(last)

    # ------------------------------------------------------------------------------------ phases

    def model_phases(self, report_kv: Callable[[int], None]) -> None:
        """Model init, weights, KV profiling, graph capture: the lines every rank prints."""
        c, log, p = self.cfg, self.log, self.worker_proc
        if c.tensorfold:
            self.tensorfold_phases(report_kv)
            return
        log.info(p, "parallel_state.py:1165", f"world_size={c.world_size} rank={c.rank} local_rank=0 "
                 f"distributed_init_method=tcp://{c.master_addr}:{c.master_port} backend=nccl")
        if c.has("engine-warning"):
            # Looks fatal to a grep for "CUDA error", but it is a WARNING and the boot carries on.
            log.warning(p, "custom_all_reduce.py:137", "Custom allreduce is disabled because the P2P access probe "
                        "returned a CUDA error between ranks (expected on GB10 unified memory); falling back to "
                        "NCCL all-reduce, which may be slower. To silence this warning, specify "
                        "disable_custom_all_reduce=True explicitly.")
        self.pause(0.04)
        if c.has("missing-patch"):
            log.error(p, "multiproc_executor.py:597", "WorkerProc failed to start.")
            self.traceback([
                (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 571, "worker_main",
                 "worker = WorkerProc(*args, **kwargs)"),
                (f"{SITE}/vllm/model_executor/models/registry.py", 1049, "_try_load_model_cls",
                 "return model.load_model_cls()"),
                (f"{SITE}/vllm/models/deepseek_v4_1/model.py", 41, "<module>",
                 "from vllm.models.deepseek_v4_1.common.engram import EngramDiskReader"),
            ], "ImportError: cannot import name 'EngramDiskReader' from 'vllm.models.deepseek_v4_1.common.engram' "
               f"({SITE}/vllm/models/deepseek_v4_1/common/engram.py)")
            raise Fatal
        log.info(p, "gpu_model_runner.py:2338", f"Starting to load model {c.model}...")
        if c.moe_backend:
            log.info(p, "mxfp4.py:352", moe_line(c.moe_backend))
        for layer, start, end in c.engram_ranges:
            log.info(p, "engram.py:212", f"Engram DISK mode: layer {layer} rows [{start}, {end})")
        for layer, start, end in c.engram_ranges:
            local = c.engram_node_local and not (c.has("engram-layer-nfs") and layer == c.engram_ranges[-1][0])
            where = f"read from node-local {c.engram_dir}" if local else \
                "read from the model directory (no node-local copy)"
            log.info(p, "engram.py:248", f"Engram layer {layer} rows [{start}, {end}) {where}")
        if c.engram_node_local and not c.engram_ranges:
            log.info(p, "engram.py:248", f"Engram rows read from node-local {c.engram_dir}")
        loaded = time.monotonic()
        for done in range(0, SHARDS + 1, SHARDS // 4):
            pct = 100 * done // SHARDS
            log.raw(f"Loading safetensors checkpoint shards: {pct:3d}% Completed | {done}/{SHARDS} "
                    f"[{self._clock(time.monotonic() - loaded)}]")
            if done == SHARDS // 2 and c.has("worker-crash"):
                log.error(p, "multiproc_executor.py:597", "WorkerProc hit an exception.")
                self.traceback([
                    (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 571, "worker_main",
                     "worker = WorkerProc(*args, **kwargs)"),
                    (f"{SITE}/vllm/model_executor/model_loader/weight_utils.py", 512, "safetensors_weights_iterator",
                     "for name, param in f.items():"),
                ], f"OSError: [Errno 5] Input/output error: '{c.model}/model-{done:05d}-of-{SHARDS:05d}"
                   ".safetensors'")
                raise Fatal
            if done < SHARDS:
                self.pause(0.5 / 4)
        log.info(p, "gpu_model_runner.py:2370", f"Model loading took {c.model_gib:.4f} GiB memory and "
                 f"{time.monotonic() - loaded:.6f} seconds")
        self.pause(0.1)
        kv = int(c.kv_tokens * (KV_LOW_FACTOR if c.has("kv-low") else 1.0))
        budget = None if c.kv_memory_bytes is None else c.kv_memory_bytes * (KV_LOW_FACTOR if c.has("kv-low") else 1)
        kv_line = None if budget is None else f"Available KV cache memory: {budget / 2**30:.2f} GiB"
        if kv < 0 and not c.tensorfold:  # the budget left nothing for KV: vLLM's profiling refuses (FM-45)
            if kv_line:
                log.info(p, "gpu_worker.py:298", kv_line)
            log.error(p, "core.py:708", "EngineCore failed to start.")
            log.raw("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                    "when initializing the engine.")
            raise Fatal
        if kv_line and not c.tensorfold:  # vLLM's KV line (from the budget the launch gave); TensorFold prints none
            log.info(p, "gpu_worker.py:298", kv_line)
        report_kv(kv)
        if c.autotune_configs is not None:
            log.info(p, "autotuner.py:283", f"Loaded {c.autotune_configs} configs from the FlashInfer autotune cache")
        captured = time.monotonic()
        self.pause(0.2)
        log.raw("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 15/15")
        if c.has("engine-fatal"):
            log.error(p, "core.py:708", "EngineCore encountered a fatal error.")
            log.raw("RuntimeError: CUDA error: an illegal memory access was encountered")
            log.raw("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                    "below might be incorrect.")
            raise Fatal
        log.info(p, "gpu_model_runner.py:3480", f"Graph capturing finished in {time.monotonic() - captured:.0f} "
                 "secs, took 1.99 GiB")
        if c.rehome_layers is not None:
            log.info(p, "pin_hot_experts_hook.py:412", f"rehome done layers={c.rehome_layers}")
        self.pause(0.05)

    def tensorfold_phases(self, report_kv: Callable[[int], None]) -> None:
        """A TensorFold rank's load. The seeds print no TensorFold boot line (CATALOG §5.2), so every line
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
        ago = time.monotonic() - (m.lost_at or time.monotonic())
        self.log.error("EngineCore_DP0", "core.py:718", f"EngineCore failed: rank {m.rank} (pid {m.pid} on "
                       f"{m.link.peer}) went away; noticed {ago:.1f} s later, at the next collective")
        self.log.raw(NCCL_LOST)
        self.log.raw(NCCL_DETAIL)

    def _joined(self, m: Member, extra: bool) -> None:
        self.log.info("EngineCore_DP0", "simengine", f"rank {m.rank} joined the rendezvous from {m.link.peer} "
                      f"(pid {m.pid}){' after the world was complete' if extra else ''}")

    def run(self) -> int:
        c, log = self.cfg, self.log
        self.banner("APIServer")
        if not c.tensorfold:
            log.info("APIServer", "api_server.py:1880", f"vLLM API server version {SIM_VERSION}")
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
            log.error("EngineCore_DP0", "core.py:708", "EngineCore failed to start.")
            self.traceback([(f"{SITE}/torch/distributed/rendezvous.py", 189, "_create_c10d_store",
                             "return TCPStore(")],
                           "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
                           f"network address. port: {c.master_port}, useIpv6: false, code: -{exc.errno}, name: "
                           f"{code}, message: {exc.strerror}")
            return 1
        try:
            httpd = make_server(self.app, c.host, c.port)
        except OSError as exc:
            log.raw(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                    f"('{c.host}', {c.port}): {exc.strerror}")
            self.rdv.shutdown()
            return 1
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
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
            log.info("EngineCore_DP0", "simengine", f"waiting for {c.world_size - 1} worker(s) on the rendezvous "
                     f"{c.master_addr}:{c.master_port}")
        if not rdv.wait(lambda world: True, c.rendezvous_timeout, self._aborting):
            self.check()
            log.error("EngineCore_DP0", "core.py:708", "EngineCore failed to start.")
            log.raw(f"torch.distributed.DistStoreError: Timed out after {c.rendezvous_timeout:.0f} seconds waiting "
                    f"for clients. {rdv.joined()}/{c.world_size} clients joined.")
            raise Fatal
        rdv.send_go()
        self.model_phases(self._sync_kv)
        if not rdv.wait(lambda world: all(m.ready for m in world), c.rendezvous_timeout, self._aborting):
            self.check()
            log.error("EngineCore_DP0", "core.py:708", "EngineCore failed to start: workers did not get ready")
            raise Fatal
        api = "APIServer"
        if c.tensorfold:
            log.info("TensorFold_R0", "simengine", f"sim TensorFold: serving {', '.join(c.served_names)} on "
                     f"http://{c.host}:{c.port} after {time.monotonic() - self.started:.2f} s")
        else:
            log.info("EngineCore_DP0", "core.py:210", "init engine (profile, create kv cache, warmup model) took "
                     f"{time.monotonic() - self.started:.2f} seconds")
            self.pause(0.05)
            log.info(api, "api_server.py:1971", f"Starting vLLM API server 0 on http://{c.host}:{c.port}")
            log.info(api, "launcher.py:37", "Available routes are:")
            for path, method in ROUTES:
                log.info(api, "launcher.py:45", f"Route: {path}, Methods: {method}")
        # uvicorn's lines (the ASGI server either engine's OpenAI server runs on; the TensorFold adapter's
        # readiness line, engines/tensorfold.py), bare in TensorFold mode, under vLLM's process prefix otherwise
        uv = "" if c.tensorfold else f"({api} pid={log.pid}) "
        log.raw(f"{uv}INFO:     Started server process [{log.pid}]")
        log.raw(f"{uv}INFO:     Waiting for application startup.")
        self.app.start_serving(self.lane_kv)
        log.raw(f"{uv}INFO:     Application startup complete.")
        threading.Thread(target=self._stats, daemon=True).start()
        self.serving_since = time.monotonic()
        reported = 0
        while not self.stop.wait(0.1):
            if self.hang.is_set() or (self.rdv and self.rdv.any_hung()):
                self.app.hung.set()
            if self.crash_due():
                self.crash_line("EngineCore_DP0")
                self.app.engine_died()
                return 1
            lost = self.lost()
            if len(lost) > reported:
                self.report_lost(lost[reported])
                reported = len(lost)
                self.app.engine_died()
                if not c.keep_alive_on_engine_death:
                    return 1
        if not c.tensorfold:
            log.info(api, "launcher.py:80", "Shutting down FastAPI HTTP server.")
        log.raw(f"{uv}INFO:     Shutting down")
        log.raw(f"{uv}INFO:     Finished server process [{log.pid}]")
        return 1 if self.app.state == "dead" else 0

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
            self.log.info("EngineCore_DP0", "simengine", f"sim TensorFold: {c.world_size} rank(s) loaded")
            return
        self.log.info("EngineCore_DP0", "kv_cache_utils.py:1087", f"GPU KV cache size: {self.lane_kv:,} tokens")
        self.log.info("EngineCore_DP0", "kv_cache_utils.py:1091", f"Maximum concurrency for {c.max_model_len:,} "
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

    def check(self) -> None:
        super().check()
        if self.link is None:
            return
        if self.link.shutdown.is_set():
            raise Stop
        if self.link.head_lost.is_set() and time.monotonic() - self.link.lost_at >= self.cfg.peer_timeout:
            self.log.error(self.worker_proc, "multiproc_executor.py:612", "the head went away")
            self.log.raw(NCCL_LOST)
            self.log.raw(NCCL_DETAIL)
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
            log.error(p, "multiproc_executor.py:612", "could not reach the head")
            log.raw(f"torch.distributed.DistNetworkError: The client socket has timed out after "
                    f"{c.rendezvous_timeout:.0f}s while trying to connect to ({c.master_addr}, {c.master_port}).")
            return 1
        try:
            self.link.send({"op": "join", "rank": c.rank, "world_size": c.world_size, "pid": os.getpid()})
            if not self.link.welcome.wait(10):
                self.check()
                log.error(p, "multiproc_executor.py:612", "the rendezvous did not answer")
                log.raw(NCCL_LOST)
                return 1
            log.info(p, "simengine", f"joined the rendezvous at {c.master_addr}:{c.master_port}")
            waited = time.monotonic()
            while not self.link.go.wait(0.05):
                self.check()
                if time.monotonic() - waited > c.rendezvous_timeout:
                    log.raw(f"torch.distributed.DistStoreError: Timed out after {c.rendezvous_timeout:.0f} seconds "
                            "waiting for the other ranks.")
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
                log.info(p, "multiproc_executor.py:540", f"Worker shutting down ({why}).")
            return 0
        except Fatal:
            return 1
        finally:
            self.link.link.close()


def main(argv: list[str] | None = None) -> int:
    cfg = cfgmod.parse(argv)
    log = Log(cfg.log, tensorfold=cfg.tensorfold)
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
