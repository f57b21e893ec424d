"""Helpers for the sim engine tests (no tests here): PNG building (zlib + struct), free ports, lanes of processes."""

from __future__ import annotations

import base64
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent

PEER_TIMEOUT = 0.3  # seconds a rank takes to notice a dead peer (the engine's default is 2)
RED, GREEN, BLUE, YELLOW, WHITE = (255, 0, 0), (0, 200, 0), (0, 0, 255), (255, 255, 0), (255, 255, 255)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def png_bytes(width: int, height: int, pixel: Callable[[int, int], tuple[int, ...]], colour_type: int = 2,
              filters: tuple[int, ...] = (0,)) -> bytes:
    """Encode a PNG; row y uses filter filters[y % len(filters)], so every filter type can be exercised."""
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[colour_type]
    raw = bytearray()
    prev = bytes(width * bpp)
    for y in range(height):
        row = bytes(v for x in range(width) for v in pixel(x, y))
        assert len(row) == width * bpp
        f = filters[y % len(filters)]
        out = bytearray()
        for i, v in enumerate(row):
            left = row[i - bpp] if i >= bpp else 0
            up = prev[i]
            upleft = prev[i - bpp] if i >= bpp else 0
            pred = (0, left, up, (left + up) >> 1, _paeth(left, up, upleft))[f]
            out.append((v - pred) & 0xFF)
        raw += bytes([f]) + out
        prev = row

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(raw)))
            + chunk(b"IEND", b""))


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def stripes_png(colours: list[tuple[int, int, int]], width: int = 60, height: int = 20, **kw) -> bytes:
    band = width // len(colours)
    return png_bytes(width, height, lambda x, y: colours[min(x // band, len(colours) - 1)], **kw)


def grid_png(tl, tr, bl, br, size: int = 40) -> bytes:
    half = size // 2
    return png_bytes(size, size, lambda x, y: (tl if x < half else tr) if y < half else (bl if x < half else br),
                     filters=(1, 2, 3, 4))


def solid_png(colour: tuple[int, int, int], size: int = 16) -> bytes:
    return png_bytes(size, size, lambda x, y: colour)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


KV_BUDGET = 6 * 2**30  # the default kv's budget: dcp2's pair, 6 GiB at DCP2 for 1,888,800 tokens (HLT-20)


class Lane:
    """Sim engine ranks as real processes on loopback; each rank logs to its own file."""

    def __init__(self, tmp: Path, world: int = 1, boot: float = 0.3, key: str | None = None,
                 faults: dict[int, list[str]] | None = None, extra: list[str] | None = None,
                 rank_extra: dict[int, list[str]] | None = None, master_port: int | None = None,
                 port: int | None = None, kv: int = 1_888_800, name: str = "lane",
                 served: tuple[str, ...] = ("dsv41", "glm-5.3-flash"), env: dict[str, str] | None = None) -> None:
        self.tmp, self.world, self.boot, self.key = tmp, world, boot, key
        self.env = env or {}
        self.faults = faults or {}
        self.extra = extra or []
        self.rank_extra = rank_extra or {}
        self.master_port = master_port or free_port()
        self.port = port or free_port()
        self.kv = kv
        self.name = name
        self.served = served
        self.procs: dict[str, subprocess.Popen] = {}
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(timeout=30)  # one client: building one per request costs ~40 ms (TLS setup)

    def argv(self, rank: int) -> list[str]:
        argv = [sys.executable, "-m", "sparkfleet.simengine", "--rank", str(rank), "--world-size", str(self.world),
                "--master-addr", "127.0.0.1", "--master-port", str(self.master_port), "--host", "127.0.0.1",
                "--port", str(self.port), *[a for n in self.served for a in ("--served-name", n)],
                "--kv-tokens", str(self.kv), "--kv-memory-bytes", str(KV_BUDGET), "--boot-seconds", str(self.boot), "--step-ms", "0.2",
                "--prefill-tokens-per-s", "5000000", "--rendezvous-timeout", "30", "--stats-interval", "0.5",
                "--peer-timeout", str(PEER_TIMEOUT),
                *self.extra, *self.rank_extra.get(rank, [])]
        if self.key is not None:
            argv += ["--api-key-env", "SF_SIM_TEST_KEY"]
        for fault in self.faults.get(rank, []):
            argv += ["--fault", fault]
        return argv

    def start(self, rank: int, tag: str | None = None) -> subprocess.Popen:
        tag = tag or f"r{rank}"
        env = dict(os.environ, PYTHONPATH=str(REPO), **self.env)
        if self.key is not None:
            env["SF_SIM_TEST_KEY"] = self.key
        out = open(self.tmp / f"{self.name}-{tag}.out", "w")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(self.argv(rank) + ["--log", str(self.log_path(tag))], stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO, env=env)
        out.close()
        self.procs[tag] = proc
        return proc

    def start_all(self) -> Lane:
        """Workers first, then the head (the seeds' order)."""
        for rank in range(self.world - 1, -1, -1):
            self.start(rank)
        return self

    def log_path(self, tag: str) -> Path:
        return self.tmp / f"{self.name}-{tag}.log"

    def log(self, tag: str = "r0") -> str:
        path = self.log_path(tag)
        return path.read_text() if path.exists() else ""

    def stdout(self, tag: str = "r0") -> str:
        return (self.tmp / f"{self.name}-{tag}.out").read_text()

    def health(self) -> int | None:
        try:
            return self.http.get(self.url + "/health", timeout=2).status_code
        except httpx.HTTPError:
            return None

    def wait_health(self, timeout: float = 20) -> list[int | None]:
        """Poll /health until 200; returns every status seen (None = not listening yet)."""
        seen: list[int | None] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.health()
            seen.append(status)
            if status == 200:
                return seen
            head = self.procs.get("r0")
            if head is not None and head.poll() is not None:
                raise AssertionError(f"head exited {head.returncode}:\n{self.log()}")
            time.sleep(0.02)
        raise AssertionError(f"not healthy after {timeout}s; saw {seen[-5:]}\n{self.log()}")

    def wait_exit(self, tag: str, timeout: float = 20) -> int:
        try:
            return self.procs[tag].wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{tag} still running after {timeout}s:\n{self.log(tag)}") from None

    def wait_line(self, text: str, tag: str = "r0", timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = self.log(tag)
            if text in log:
                return log
            time.sleep(0.02)
        raise AssertionError(f"{text!r} not in {tag}'s log after {timeout}s:\n{self.log(tag)}")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def chat(self, body: dict, **kw) -> httpx.Response:
        body = {"model": "dsv41", "temperature": 0, **body}
        return self.http.post(self.url + "/v1/chat/completions", json=body,
                              headers=kw.pop("headers", self.headers()), **kw)

    def signal_stop(self) -> None:
        """SIGTERM the head; it tells the workers to exit."""
        head = self.procs.get("r0")
        if head is not None and head.poll() is None:
            head.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM the head (it tells the workers), then make sure every rank is gone."""
        self.signal_stop()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.http.close()

    def leftovers(self) -> list[int]:
        """Pids of any process still running with this lane's master port on its command line."""
        needle = f"--master-port\0{self.master_port}\0".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if needle in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found
