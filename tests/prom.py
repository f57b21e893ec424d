"""A real Prometheus (Debian's `prometheus` package) for tests: started on a free loopback port, torn down after.

    with Prometheus(tmp_path, scrape_configs) as prom:
        prom.wait_for('up{job="x"} == 1')
        prom.query('sparkfleet_node_up')   # the result vector

When `prometheus` or `promtool` is missing the test is skipped, except with $CI set, where it fails:
CI installs them (.ci/run), so a missing binary there is a broken setup, not a reason to skip.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml


def binary(name: str) -> str:
    """The path of `name` (prometheus, promtool); skip the test without it, fail under CI."""
    path = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if path is None:
        why = f"{name} is not installed (apt-get install -y --no-install-recommends prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"CI: {why}")
        pytest.skip(why)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("promtool"), *args], input=stdin, capture_output=True, text=True, timeout=60)


class Prometheus:
    """One Prometheus server with its own config and TSDB under `workdir`, on 127.0.0.1:<free port>."""

    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]], *, evaluation_interval: str = "1s"):
        self.workdir = workdir
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump({"global": {"evaluation_interval": evaluation_interval},
                                               "scrape_configs": scrape_configs}, sort_keys=False))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "prometheus.log"
        # one client for every query: httpx.get() builds a new client (and TLS context) per call, which
        # costs more than the query itself on a busy machine
        self.http = httpx.Client(timeout=10.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_s: float = 20.0) -> Prometheus:
        exe = binary("prometheus")
        for _ in range(3):  # a free port can be taken before Prometheus binds it
            self.port = free_port()
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    [exe, f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{self.port}"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + ready_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if self.http.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            self.stop()
        raise RuntimeError(f"Prometheus did not become ready; log:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and release the HTTP client."""
        self.stop()
        self.http.close()

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (a list of {metric, value}); raises on a query error."""
        r = self.http.get(f"{self.url}/api/v1/query", params={"query": expr})
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {body.get('errorType')}: {body.get('error')}")
        result = body["data"]["result"]
        return result if isinstance(result, list) else [{"metric": {}, "value": result}]

    def wait_for(self, expr: str, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """Poll until `expr` has a non-empty result (first scrapes land ~6 s after start, TESTBED.md)."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.query(expr)
            if got:
                return got
            if time.monotonic() > deadline:
                targets = self.http.get(f"{self.url}/api/v1/targets").json()
                health = [(t["labels"].get("job"), t["health"], t.get("lastError"))
                          for t in targets["data"]["activeTargets"]]
                raise AssertionError(f"no result for {expr!r} after {timeout_s:g} s; targets: {health}")
            time.sleep(0.25)

    def targets(self) -> list[dict[str, Any]]:
        return self.http.get(f"{self.url}/api/v1/targets").json()["data"]["activeTargets"]
