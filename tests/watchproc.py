"""A `sparkfleet watch --json` process for tests and the benchmark: its events as they come (not a conftest)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INTERVAL_S, PROBE_TIMEOUT_S = 2.0, 1.5
FAST = ["--interval", f"{INTERVAL_S:g}", "--probe-timeout", f"{PROBE_TIMEOUT_S:g}", "--backoff", "0", "--poll", "0.2",
        "--clock-probe-seconds", "1"]
# What watch's failure guards promise under FAST: a rank exited or vanished is a failure at the next probe; K=2
# (the default --failures) failed probes, a node not answering (wait), memory under its line for a grace of at
# most one interval (--memory-grace 1), an operator's run (stand down): at the second. So within two intervals
# and a probe's timeout of the fault (measured 2-4 s on the 2-core machine); a wait for what a guard decides is
# bounded at four times that, so a guard that broke fails its test in seconds, not at BOUND_S.
DETECT_S = 4 * (2 * INTERVAL_S + PROBE_TIMEOUT_S)
BOUND_S = 180.0  # any other wait (a restart's whole `up`, several restarts): a bound only, so nothing hangs


class WatchProc:
    """`sparkfleet watch ... --json` in its own process; `wait_for` reads its events in order."""

    def __init__(self, argv: list[str], env: dict[str, str],
                 command: tuple[str, ...] = (sys.executable, "-m", "sparkfleet.cli.main", "watch")) -> None:
        self.started = time.time()
        self.proc = subprocess.Popen([*command, *argv, "--json"],
                                     env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: list[dict] = []
        self.stderr = ""
        self._q: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                ev = json.loads(line)
                ev["_seen"] = time.time()
                self.events.append(ev)
                self._q.put(ev)
        self._q.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    def wait_for(self, pred: Callable[[dict], bool], what: str, timeout_s: float = BOUND_S) -> dict:
        """The next event matching `pred`, within `timeout_s` (DETECT_S for what a guard decides)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:  # past the deadline only what had come is read: a watch that keeps probing cannot hold the wait
                ev = self._q.get(timeout=left) if left > 0 else self._q.get_nowait()
            except queue.Empty:
                ev = None
            if ev is None:
                self.stop()
                raise AssertionError(f"watch never sent {what} within {timeout_s:g} s; exit {self.proc.poll()}; events: "
                                     f"{[(e['event'], e.get('text', e.get('step'))) for e in self.events if e['event'] != 'watch.probe'][-40:]}; "
                                     f"last probe: {next((e for e in reversed(self.events) if e['event'] == 'watch.probe'), None)}; stderr: {self.stderr[-2000:]}")
            if pred(ev):
                return ev

    def event(self, name: str, *, within: float = BOUND_S, **match) -> dict:
        return self.wait_for(lambda e: e["event"] == name and all(e.get(k) == v for k, v in match.items()),
                             f"{name} {match}", within)

    def restart_for(self, inject: Callable[[], object], *, after_ok_probe: bool = True,
                    restart_within: float = BOUND_S) -> tuple[dict, dict]:
        """The scenario watch's fault tests share: once watching (a passed probe; any probe where the lane's model
        never answers watch's question right), `inject()` the fault; the failure watch names must come within
        DETECT_S, and the restarted lane's serving within `restart_within`. Returns (failure, serving)."""
        self.wait_for(lambda e: e["event"] == "watch.probe" and (e["ok"] or not after_ok_probe),
                      "an ok probe" if after_ok_probe else "a probe")
        inject()
        failure = self.event("watch.failure", within=DETECT_S)
        return failure, self.event("watch.serving", within=restart_within)

    def end(self) -> None:
        """SIGTERM, as an operator stops it: watch ends with exit 0."""
        self.signal(signal.SIGTERM)
        code = self.wait()
        assert code == 0, (code, self.stderr[-2000:])

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = BOUND_S) -> int:
        code = self.proc.wait(timeout_s)
        time.sleep(0.1)  # let the reader threads drain the pipes
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def result(self) -> dict:
        return next(e for e in self.events if e["event"] == "result")
