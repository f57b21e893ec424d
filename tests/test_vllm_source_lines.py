"""A vLLM head's log, built from vLLM's own format strings, read by the controller's real read loop.

tests/fixtures/vllm/v<version>.json hold, per released version, the format strings the controller relies on
and the file:line each was read at (the PyPI wheels' vllm/*.py). The head log is written the way vLLM writes
it: every process's stdout/stderr behind `_add_prefix`'s wrapper (the process prefix, coloured per version,
inserted after each `\\n`), vLLM's record header (`%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] `,
repeated after `\\r\\n` on every line of a multi-line message), tqdm's bars (`\\r` + the bar on each refresh,
the bar format's own `\\n` for the weights, a `\\n` at close) and uvicorn's lines. Each write lands in a real
file; after every write the read loop runs as `up` runs it: `Logs.command()` through a real shell and `tail`
(a `docker` on PATH that prints the file, as `docker logs` prints a container's log), `Logs.parse`, `feed`.
The test fails if any complete line of the log is not read exactly once, or a fact the controller needs is
missed.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkfleet.engines.logs import LogFacts, feed, split_lines, text
from sparkfleet.engines.registry import engine_for
from sparkfleet.fleet.ops import Logs
from sparkfleet.fleet.transport import Result
from sparkfleet.opsdir import Spec
from tests.conftest import REPO

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
VERSIONS = ["0.11.0", "0.11.1", "0.12.0", "0.13.0", "0.20.0"]
CID = "f" * 64
STAMP = "12-01 10:00:00"  # vllm/logger.py _DATE_FORMAT "%m-%d %H:%M:%S"
# uvicorn 0.54.0: "%(levelprefix)s %(message)s" (config.py:89) and the access format (config.py:94)
UVICORN_STARTED = "INFO:     Started server process [%d]"  # uvicorn/server.py:101
UVICORN_WAITING = "INFO:     Waiting for application startup."  # uvicorn/lifespan/on.py:48
UVICORN_COMPLETE = "INFO:     Application startup complete."  # uvicorn/lifespan/on.py:62
UVICORN_ACCESS = 'INFO:     %s - "%s %s HTTP/1.1" %s'  # uvicorn/logging.py:107, status "200 OK" (:87)


def fixture(version: str) -> dict:
    return json.loads((FIXTURES / f"v{version}.json").read_text())


@dataclass
class Stream:
    """One process's stdout or stderr after vLLM's decorate_logs: `_add_prefix`'s write_with_prefix
    (vllm/utils/__init__.py:3460 in 0.11.0, utils/system_utils.py:176 in 0.13.0), writing into the log."""

    log: Log
    prefix: str
    start_new_line: bool = True

    def write(self, s: str) -> None:
        if not s:
            return
        if self.start_new_line:
            self.log.chunk(self.prefix)
        idx = 0
        while (nxt := s.find("\n", idx)) != -1:
            nxt += 1
            self.log.chunk(s[idx:nxt])
            if nxt == len(s):
                self.start_new_line = True
                return
            self.log.chunk(self.prefix)
            idx = nxt
        self.log.chunk(s[idx:])
        self.start_new_line = False


@dataclass
class Log:
    """The container's log file; every chunk written is followed by one poll of the read loop."""

    path: Path
    poll: object = None
    chunks: int = 0

    def chunk(self, s: str) -> None:
        with open(self.path, "a", encoding="utf-8", newline="") as f:
            f.write(s)
        self.chunks += 1
        if self.poll:
            self.poll()  # type: ignore[operator]


@dataclass
class Head:
    """A vLLM head (node rank 0 of a two-node TP lane): APIServer, EngineCore and Worker_TP0 in one container."""

    fx: dict
    log: Log
    color: bool
    streams: dict[str, Stream] = field(default_factory=dict)

    def stream(self, proc: str) -> Stream:
        if proc not in self.streams:
            name = {"EngineCore": self.fx["prefix"]["engine_process"], "Worker": "Worker_TP0"}.get(proc, proc)
            pid = 100 + len(self.streams)
            p = f"({name} pid={pid})"
            p = f"{self.fx['prefix']['colour']}{p}{self.fx['prefix']['reset']} " if self.color else f"{p} "
            self.streams[proc] = Stream(self.log, p)
        return self.streams[proc]

    def record(self, key: str, *args: object, fmt: str | None = None) -> str:
        """logger.<level>(format, *args): one write of the formatted record and its newline (StreamHandler)."""
        e = self.fx["lines"][key]
        message = (fmt or e["format"]) % args if args else (fmt or e["format"])
        file, line = e["at"].rsplit(":", 1)
        header = f"{e['level'] if e['level'] in ('INFO', 'ERROR', 'WARNING') else 'INFO'} {STAMP} " \
                 f"[{file.rsplit('/', 1)[-1]}:{line}] "
        self.stream(e["process"]).write(header + message.replace("\n", "\r\n" + header) + "\n")
        return message

    def raw(self, proc: str, line: str) -> None:
        self.stream(proc).write(line + "\n")

    def bar(self, desc: str, total: int, bar_format: str | None) -> None:
        """tqdm (tqdm/std.py): a display at construction, one per update, one at close, then `\\n` (std.py:1310);
        each display is `\\r` + the bar + padding to the last length (status_printer, std.py:457)."""
        out = self.stream("Worker")
        last = 0
        for n in [*range(total + 1), total]:
            elapsed = n * 2
            pct = 100 * n / total
            if bar_format:
                rate = f"{n / elapsed:.2f}it/s" if elapsed else "?it/s"
                rem = f"00:{(total - n) * 2:02d}" if n else "?"
                s = bar_format.format(desc=desc, percentage=pct, n_fmt=n, total_fmt=total,
                                      elapsed=f"00:{elapsed:02d}", remaining=rem, rate_fmt=rate)
            else:  # tqdm's default "{l_bar}{bar}{r_bar}"
                full = int(10 * n / total)
                s = f"{desc}: {pct:3.0f}%|{'█' * full}{' ' * (10 - full)}| {n}/{total} [00:{elapsed:02d}<00:00]"
            out.write("\r" + s + " " * max(last - len(s), 0))
            last = len(s)
        out.write("\n")

    def boot(self, moe: str, kv_memory: bool) -> None:
        """What a head prints from `vllm serve` to uvicorn's `Application startup complete.`, in order."""
        v = self.fx["version"]
        self.record("non_default_args", "{'model': '/models/repo', 'nnodes': 2, 'node_rank': 0}")
        if "logo" in self.fx["lines"]:
            self.record("logo", v, "/models/repo")
        else:
            self.record("api_version", v)
        self.record("engine_init", v, "model='/models/repo', speculative_config=None, tokenizer='/models/repo'")
        self.record("dist_init", 2, 0, 0, "tcp://192.168.192.11:29551", "nccl")
        self.record("load_model", "/models/repo")
        if moe == "moe_fp8":
            self.record(moe, fmt="Using TRITON Fp8 MoE backend out of potential backends: ['TRITON', 'DEEPGEMM'].")
        elif moe == "moe" and v >= "0.20":
            self.record(moe, fmt="Using 'FLASHINFER_CUTLASS_MXFP4_MXFP8' Mxfp4 MoE backend.")
        else:
            self.record(moe)
        self.bar(self.fx["lines"]["weights_desc"]["format"], 8, self.fx["lines"]["weights_bar"]["format"])
        self.record("weights_took", 341.21)
        self.record("model_took", 61.4419, 342.518044)
        if kv_memory:  # not printed under --kv-cache-memory-bytes (gpu_worker.py returns before it)
            self.record("kv_memory", 18.39)
        self.record("kv_tokens", "1,888,800")
        self.record("max_concurrency", "500,000", 3.78)
        graphs = self.fx["lines"]["graphs_desc"]["format"]
        self.bar(graphs.format("mixed prefill-decode", "PIECEWISE"), 12, None)
        self.bar(graphs.format("decode", "FULL"), 6, None)
        self.record("graphs_took", 21, 1.99)
        self.record("engine_took", 412.77)
        if v >= "0.20":
            self.record("api_starting", "http://0.0.0.0:8410")
        else:
            self.record("api_starting", 0, "http://0.0.0.0:8410")
        self.record("routes")
        for path in self.fx["routes"]["fastapi"]:
            self.record("route", path, "GET, HEAD")
        for r in self.fx["routes"]["vllm"]:
            self.record("route", r["path"], r["methods"])
        self.raw("APIServer", UVICORN_STARTED % 100)
        self.raw("APIServer", UVICORN_WAITING)
        self.raw("APIServer", UVICORN_COMPLETE)


class Reader:
    """follow()'s read of one rank (runner/ranks.py): Logs.command(), Logs.parse, feed, with the profile's vocabulary."""

    def __init__(self, tmp: Path, logfile: Path, version: str, expected: list[str]) -> None:
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        (bin_dir / "docker").write_text(f'#!/bin/sh\n[ "$1" = logs ] && [ "$2" = {CID} ] && exec cat {logfile}\n'
                                        "echo \"Error response from daemon: No such container: $2\" >&2; exit 1\n")
        (bin_dir / "docker").chmod(0o755)
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        p = Spec(REPO).profile("dcp2").profile
        assert p.image is not None
        p = p.model_copy(update={"image": p.image.model_copy(update={"engine_version": version}),
                                 "expect": p.expect.model_copy(update={"log_lines": expected})})
        self.vocab = engine_for("vllm").log_for(p)
        self.signatures = p.fatal_signatures
        self.facts = LogFacts()
        self.read: list[str] = []

    def poll(self) -> None:
        op = Logs(CID, self.facts.lines_seen)
        proc = subprocess.run(["bash", "-c", op.command()], env=self.env, capture_output=True, timeout=30)
        res = Result("head", proc.returncode == 0, proc.stdout.decode(), proc.stderr.decode(),
                     exit_code=proc.returncode, error=None if proc.returncode == 0 else "exit")
        lines = op.parse(res)
        assert isinstance(lines, list), lines
        self.read += lines
        feed(self.facts, lines, self.signatures, self.vocab)


MOE = {"0.11.0": ("moe", "FlashInfer MXFP4 MXFP8 CUTLASS"), "0.11.1": ("moe_marlin", "Marlin"),
       "0.12.0": ("moe", "FlashInfer MXFP4 MXFP8 CUTLASS"), "0.13.0": ("moe_marlin", "Marlin"),
       "0.20.0": ("moe", "FLASHINFER_CUTLASS_MXFP4_MXFP8")}


def run_head(tmp_path: Path, version: str, color: bool, kv_memory: bool = True, moe: str | None = None):
    logfile = tmp_path / "head.log"
    logfile.touch()
    reader = Reader(tmp_path, logfile, version, ["Route: /v1/models, Methods: GET", "Application startup complete"])
    log = Log(logfile, reader.poll)
    head = Head(fixture(version), log, color)
    head.boot(moe or MOE[version][0], kv_memory)
    return head, reader, logfile


@pytest.mark.parametrize("version", VERSIONS)
def test_every_line_a_real_head_prints_is_read_once(tmp_path: Path, version: str) -> None:
    color = not version.startswith("0.20")  # 0.20 colours only on a tty (fixture's prefix.coloured)
    head, reader, logfile = run_head(tmp_path, version, color)
    written = split_lines(logfile.read_bytes().decode())
    got, want = [text(x) for x in reader.read], [text(x) for x in written]
    print(f"vLLM {version}: boot lines read {len(got)} of {len(want)} ({head.log.chunks} writes, a poll after each)")
    assert got == want
    assert any("\r" in x for x in written) and (not color or any("\x1b[" in x for x in written))
    f = reader.facts
    assert (f.kv_tokens, f.max_concurrency, f.moe_backend) == (1888800, 3.78, MOE[version][1])
    assert f.started and f.loaded and f.api_up and f.phase == "serving" and f.fatal is None
    assert set(f.expected_seen) == {"Route: /v1/models, Methods: GET", "Application startup complete"}
    assert f.lines_seen == len(written)

    # after boot: the gates' requests in uvicorn's access log, then the engine dies (no traceback of its own)
    for path in ("/health", "/v1/models", "/v1/chat/completions"):
        head.raw("APIServer", UVICORN_ACCESS % ("192.168.192.11:51234", "GET", path, "200 OK"))
    if version >= "0.20":
        died = head.record("worker_died", "VllmWorker-0")
    else:
        died = head.record("engine_died", "EngineCore_DP0")
    assert f.fatal is not None and f.fatal.endswith(died)
    assert f.lines_seen == len(split_lines(logfile.read_bytes().decode()))


def test_no_color_and_the_kv_cache_memory_bytes_boot(tmp_path: Path) -> None:
    """0.13 under NO_COLOR prints the prefix plain (utils/system_utils.py:178); with --kv-cache-memory-bytes
    no `Available KV cache memory` line comes (gpu_worker.py:311-329 returns before :376)."""
    head, reader, logfile = run_head(tmp_path, "0.13.0", color=False, kv_memory=False)
    written = split_lines(logfile.read_bytes().decode())
    assert [text(x) for x in reader.read] == [text(x) for x in written]
    assert not any("\x1b[" in x for x in written)
    assert not any("Available KV cache memory" in x for x in written)
    assert reader.facts.kv_tokens == 1888800 and reader.facts.api_up


def test_the_0_20_fp8_moe_line_unquoted(tmp_path: Path) -> None:
    _, reader, _ = run_head(tmp_path, "0.20.0", color=False, moe="moe_fp8")
    assert reader.facts.moe_backend == "TRITON"


def test_a_traceback_under_engine_core_failed_to_start_names_its_exception(tmp_path: Path) -> None:
    """logger.exception("EngineCore failed to start.") (core.py:708 in 0.11.0): the traceback is part of the
    record, the header repeated after `\\r\\n` on every line, all behind the coloured prefix."""
    logfile = tmp_path / "head.log"
    logfile.touch()
    reader = Reader(tmp_path, logfile, "0.11.0", [])
    head = Head(fixture("0.11.0"), Log(logfile, reader.poll), color=True)
    head.record("engine_init", "0.11.0", "model='/models/repo'")
    tb = ("EngineCore failed to start.\nTraceback (most recent call last):\n"
          '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 699, in run_engine_core\n'
          "    engine_core = EngineCoreProc(*args, **kwargs)\n"
          "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
          "initializing the engine.")
    head.record("failed_to_start", fmt=tb)
    f = reader.facts
    assert f.fatal == "ERROR 12-01 10:00:00 [core.py:708] EngineCore failed to start."
    assert f.fatal_detail is not None and f.fatal_detail.startswith("ValueError: No available memory")
