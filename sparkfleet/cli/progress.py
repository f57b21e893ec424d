"""How `up`, `down`, `play`, `restore` and `watch` show a run to a person, on a terminal or in a log.

On a terminal: the runner's live view (runner/events.py HumanEvents: a result line per step, the
ranks' boot phase in a live table). Off a terminal (a pipe, a file, journald) nothing can be
redrawn, so each step's start and end is one timestamped line, and each rank's boot phase is a line
when it changes (at most one per rank every PHASE_EVERY_S; the latest change held back is printed
when that time is up or the step ends), so a log shows where a 15-minute boot is.
`-q`: only findings and the result. `-v`: also each `command` event (what a step runs on a node).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

from sparkfleet.runner.events import HumanEvents

PHASE_EVERY_S = 10.0  # a rank's phase line at most this often off a terminal
LABEL = {"start": "start", "ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}


class Progress(HumanEvents):
    """HumanEvents with timestamped lines off a terminal, and the -q / -v levels."""

    def __init__(self, console: Console, verbosity: int = 0, clock=time.time) -> None:
        super().__init__(console)
        self.verbosity = verbosity  # -1 quiet, 0 normal, 1 verbose
        self.clock = clock
        self.phases: dict[tuple[str, int], tuple[str, float]] = {}  # (node, rank) -> (phase printed, when)
        self.pending: dict[tuple[str, int], dict] = {}  # a change not printed yet (too soon after the last)

    @property
    def logging(self) -> bool:
        """Off a terminal: one line per thing, never redrawn."""
        return not self.console.is_terminal

    def line(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.clock()))
        self.console.print(f"{stamp} {text}", markup=False, highlight=False, soft_wrap=True)

    def emit(self, event: str, **data: Any) -> None:
        if self.verbosity < 0 and event not in ("findings",):
            return  # -q: the findings, and the result the command prints itself
        if event == "command":
            if self.verbosity > 0:
                self._command(data)
            return
        if not self.logging:
            super().emit(event, **data)
            return
        if event == "ranks":
            self._phases(data["ranks"])
        elif event == "step":
            if data["status"] != "start":
                self._flush()
            self._step(data)
        elif event in ("message", "run"):
            self.line(("      " if event == "message" else "") + data.get("text", ""))
        else:
            super().emit(event, **data)

    def _step(self, data: dict) -> None:
        status = data["status"]
        took = f" ({data['elapsed_s']:.1f} s)" if data.get("elapsed_s") is not None else ""
        summary = f" {data['summary']}" if data.get("summary") else ""
        self.line(f"{LABEL.get(status, status):<5} {data['step']}{summary}{took}")

    def _phases(self, rows: list[dict]) -> None:
        now = self.clock()
        for r in rows:
            key = (r["node"], r["rank"])
            phase = r.get("phase") or r.get("state") or ""
            last = self.phases.get(key)
            if last is not None and last[0] == phase:
                self.pending.pop(key, None)
                continue
            if last is None or now - last[1] >= PHASE_EVERY_S:
                self._phase(key, r, now)
            else:
                self.pending[key] = r
        for key, r in list(self.pending.items()):  # held back: out when its time is up
            if now - self.phases[key][1] >= PHASE_EVERY_S:
                self._phase(key, r, now)

    def _phase(self, key: tuple[str, int], row: dict, now: float) -> None:
        phase = row.get("phase") or row.get("state") or ""
        self.phases[key] = (phase, now)
        self.pending.pop(key, None)
        lines = f", {row['lines']} log lines" if row.get("lines") not in (None, "") else ""
        self.line(f"      rank {row['rank']} on {row['node']}: {phase} ({row.get('state', '')}{lines})")

    def _flush(self) -> None:
        now = self.clock()
        for key, row in list(self.pending.items()):
            self._phase(key, row, now)

    def _command(self, data: dict) -> None:
        text = f"      {data.get('node', '')}$ {data.get('command', '')}"
        if self.logging:
            self.line(text.strip())
        else:
            self._stop_live()
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)


def verbosity(args: Any) -> int:
    return -1 if getattr(args, "quiet", False) else 1 if getattr(args, "verbose", False) else 0
