"""Log lines in vLLM's layout: `(Proc pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message`, to stdout and a file.

In TensorFold mode the layout is the sim's own invention (the seeds show none of TensorFold's):
`YYYY-MM-DD HH:MM:SS LEVEL sim-tensorfold[pid] message`."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO


class Log:
    """Thread-safe writer; every line is flushed at once so a follower sees it immediately."""

    def __init__(self, path: str | None, tensorfold: bool = False) -> None:
        self.pid = os.getpid()
        self.tensorfold = tensorfold
        self.lock = threading.Lock()
        self.file: TextIO | None = open(path, "a", encoding="utf-8") if path else None

    def raw(self, line: str) -> None:
        with self.lock:
            for out in (sys.stdout, self.file):
                if out is None:
                    continue
                try:
                    out.write(line + "\n")
                    out.flush()
                except (OSError, ValueError):
                    pass  # a closed stdout (the reader went away) must not kill the engine

    def emit(self, level: str, proc: str, where: str, message: str) -> None:
        if self.tensorfold:
            self.raw(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {level} sim-tensorfold[{self.pid}] {message}")
            return
        stamp = time.strftime("%m-%d %H:%M:%S")
        self.raw(f"({proc} pid={self.pid}) {level} {stamp} [{where}] {message}")

    def info(self, proc: str, where: str, message: str) -> None:
        self.emit("INFO", proc, where, message)

    def warning(self, proc: str, where: str, message: str) -> None:
        self.emit("WARNING", proc, where, message)

    def error(self, proc: str, where: str, message: str) -> None:
        self.emit("ERROR", proc, where, message)

    def close(self) -> None:
        with self.lock:
            if self.file:
                self.file.close()
                self.file = None
