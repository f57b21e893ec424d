"""Log lines as vLLM writes them, to stdout and a file.

Each of a rank's processes (APIServer, EngineCore_DP0, Worker_TP<r>) writes through vLLM's
`decorate_logs` wrapper: the prefix `(Name pid=N) ` goes in front of every line, inserted after each `\\n`
of whatever is written (`_add_prefix`, vllm/utils/__init__.py:3460 in 0.11.0, utils/system_utils.py:176
in 0.13.0). It is cyan in 0.11 always (`\\x1b[1;36m`, utils/__init__.py:120), in 0.12-0.13 unless NO_COLOR
(`\\x1b[0;36m`, system_utils.py:178), from 0.20 only on a tty or with VLLM_LOGGING_COLOR=1
(system_utils.py:203-207); a container's log is no tty. A record is `LEVEL MM-DD HH:MM:SS [file.py:line]
message` (vllm/logger.py:25-27, 0.11.0), the header repeated after `\\r\\n` on every further line of a
multi-line message (logging_utils/formatter.py:78). tqdm's bars (`bar`) write `\\r` and the bar on each
refresh (tqdm/std.py:457) and `\\n` at close (std.py:1310).

In TensorFold mode the layout is the sim's own invention (the seeds show none of TensorFold's):
`YYYY-MM-DD HH:MM:SS LEVEL sim-tensorfold[pid] message`."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

RESET = "\x1b[0;0m"  # vllm/utils/__init__.py:121 (0.11.0), utils/system_utils.py:26 (0.13.0)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("+")[0].split(".")[:3] if x.isdigit())


def prefix_colour(version: str, env: dict[str, str] | os._Environ) -> str | None:
    """The prefix's colour code in this vLLM version under this environment, or None for a plain prefix."""
    v = version_tuple(version)
    if v < (0, 12):
        return "\x1b[1;36m"  # 0.11: always, NO_COLOR or not
    no_color = env.get("NO_COLOR", "0") != "0"  # vllm/envs.py:632 (0.12.0)
    if v < (0, 20):
        return None if no_color else "\x1b[0;36m"
    forced = env.get("VLLM_LOGGING_COLOR")
    return "\x1b[0;36m" if not no_color and forced == "1" else None  # no tty in a container's log


class Log:
    """Thread-safe writer; every write is flushed at once so a follower sees it immediately."""

    def __init__(self, path: str | None, tensorfold: bool = False, version: str = "0.13.0") -> None:
        self.pid = os.getpid()
        self.tensorfold = tensorfold
        self.version = version
        self.colour = prefix_colour(version, os.environ)
        self.lock = threading.RLock()
        self.file: TextIO | None = open(path, "a", encoding="utf-8", newline="") if path else None
        self.new_line: dict[str, bool] = {}  # per process: the next write starts a line (start_new_line)

    def _out(self, s: str) -> None:
        for out in (sys.stdout, self.file):
            if out is None:
                continue
            try:
                out.write(s)
                out.flush()
            except (OSError, ValueError):
                pass  # a closed stdout (the reader went away) must not kill the engine

    def prefix(self, proc: str) -> str:
        name = f"({proc} pid={self.pid})"
        return f"{self.colour}{name}{RESET} " if self.colour else f"{name} "

    def write(self, proc: str | None, s: str) -> None:
        """One write() by process `proc` (None: no decorate_logs, as TensorFold's lines): vLLM's
        write_with_prefix (utils/__init__.py:3466-3482 in 0.11.0)."""
        if not s:
            return
        with self.lock:
            if proc is None or self.tensorfold:
                self._out(s)
                return
            prefix = self.prefix(proc)
            if self.new_line.get(proc, True):
                self._out(prefix)
            idx = 0
            while (nxt := s.find("\n", idx)) != -1:
                nxt += 1
                self._out(s[idx:nxt])
                if nxt == len(s):
                    self.new_line[proc] = True
                    return
                self._out(prefix)
                idx = nxt
            self._out(s[idx:])
            self.new_line[proc] = False

    def line(self, proc: str | None, text: str) -> None:
        """A print()ed line (uvicorn's, a traceback's): the text and its newline through proc's stream."""
        self.write(proc, text + "\n")

    def raw(self, line: str) -> None:
        """A line no vLLM process prefixes (the sim's TensorFold mode)."""
        self.write(None, line + "\n")

    def emit(self, level: str, proc: str, where: str, message: str) -> None:
        if self.tensorfold:
            self.raw(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {level} sim-tensorfold[{self.pid}] {message}")
            return
        header = f"{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] "
        self.write(proc, header + message.replace("\n", "\r\n" + header) + "\n")

    def info(self, proc: str, where: str, message: str) -> None:
        self.emit("INFO", proc, where, message)

    def warning(self, proc: str, where: str, message: str) -> None:
        self.emit("WARNING", proc, where, message)

    def error(self, proc: str, where: str, message: str) -> None:
        self.emit("ERROR", proc, where, message)

    def bar(self, proc: str, desc: str, total: int, step: object, bar_format: str | None = None) -> None:
        """A tqdm bar over `total` items, `step(n)` called before item n is done (it may raise to end the
        bar early, as a crash mid-load does): a display at construction, one per item, one at close and
        its `\\n` (tqdm/std.py:1305-1310); each display is `\\r`, the bar, padding to the last length
        (status_printer, std.py:455-458). `bar_format` as vLLM's weight loader passes it
        (model_loader/weight_utils.py:507, ending in `\\n`), else tqdm's `{l_bar}{bar}{r_bar}`."""
        started = time.monotonic()
        last = 0

        def show(n: int) -> None:
            nonlocal last
            elapsed = time.monotonic() - started
            rate = f"{n / elapsed:.2f}it/s" if n and elapsed > 0 else "?it/s"
            left = self.clock(elapsed / n * (total - n)) if n and elapsed > 0 else "?"
            pct = 100 * n / total if total else 100.0
            if bar_format is not None:
                s = bar_format.format(desc=desc, percentage=pct, n_fmt=n, total_fmt=total,
                                      elapsed=self.clock(elapsed), remaining=left, rate_fmt=rate)
            else:
                full = int(10 * n / total) if total else 10
                s = (f"{desc}: {pct:3.0f}%|{'█' * full}{' ' * (10 - full)}| {n}/{total} "
                     f"[{self.clock(elapsed)}<{left}, {rate}]")
            self.write(proc, "\r" + s + " " * max(last - len(s), 0))
            last = len(s)

        show(0)
        done = 0
        try:
            for n in range(1, total + 1):
                step(n)  # type: ignore[operator]
                done = n
                show(n)
        finally:  # tqdm.__iter__ closes the bar however the loop ends (std.py:1199-1201)
            show(done)
            self.write(proc, "\n")

    @staticmethod
    def clock(seconds: float) -> str:
        return f"{int(seconds) // 60:02d}:{int(seconds) % 60:02d}"

    def close(self) -> None:
        with self.lock:
            if self.file:
                self.file.close()
                self.file = None
