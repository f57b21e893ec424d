"""What a run tells its watcher: JSON lines for scripts, a live display for people."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from sparkfleet.findings import Finding

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim", "start": "cyan",
                "unknown": "magenta"}


class Events:
    """Base: every event is a dict; subclasses decide how it shows."""

    def emit(self, event: str, **data: Any) -> None:
        raise NotImplementedError

    def step(self, name: str, status: str, summary: str = "", **data: Any) -> None:
        self.emit("step", step=name, status=status, summary=summary, **data)

    def findings(self, step: str, findings: list[Finding]) -> None:
        self.emit("findings", step=step, findings=[f.as_dict() for f in findings])

    def ranks(self, rows: list[dict]) -> None:
        """Per-rank progress while waiting (node, rank, phase, state)."""
        self.emit("ranks", ranks=rows)

    def close(self) -> None:
        pass


class JsonEvents(Events):
    def __init__(self, stream=None):
        self.stream = stream  # None: whatever sys.stdout is when an event is written

    def emit(self, event: str, **data: Any) -> None:
        stream = self.stream or sys.stdout
        stream.write(json.dumps({"event": event, "t": round(time.time(), 3), **data}, default=str) + "\n")
        stream.flush()


class HumanEvents(Events):
    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self.live: Live | None = None

    def emit(self, event: str, **data: Any) -> None:
        if event == "ranks":
            self._ranks(data["ranks"])
            return
        self._stop_live()
        if event == "step":
            status = data["status"]
            if status == "start":  # people see the result line; scripts get both
                return
            style = STATUS_STYLE.get(status, "")
            label = {"start": "..", "ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}.get(status, status)
            self.console.print(f"[{style}]{label:>4}[/] {data['step']:<12} {data.get('summary', '')}")
        elif event == "findings":
            for f in data["findings"]:
                if f["status"] == "ok":
                    continue
                where = f.get("node") or f.get("where") or ""
                self.console.print(f"       [{STATUS_STYLE[f['status']]}]{f['status']}[/] {f['check']}"
                                   + (f" ({where})" if where else "") + f": {f['message']}", highlight=False)
                if f.get("remedy"):
                    self.console.print(f"            -> {f['remedy']}", markup=False)
        elif event == "would":  # --dry-run: exactly what would run where
            if "write" in data:
                self.console.print(f"       would write {data['write']} on {data['node']}:", markup=False)
                self.console.print(_indent(data.get("content", "")), markup=False)
            else:
                self.console.print(f"       would run on {data['node']}:", markup=False)
                self.console.print(_indent(data.get("command", "")), markup=False)
                if data.get("stdin"):  # what it reads (sbatch: the job's script)
                    self.console.print("       reading on stdin:", markup=False)
                    self.console.print(_indent(data["stdin"]), markup=False)
        elif event == "message":
            self.console.print("       " + data.get("text", ""), markup=False)
        elif event == "run":
            self.console.print(f"[bold]{data.get('text', '')}[/]")

    def _ranks(self, rows: list[dict]) -> None:
        table = Table(show_header=True, header_style="dim", box=None, pad_edge=False)
        for col in ("node", "rank", "state", "phase", "log lines"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["node"], str(r["rank"]), r.get("state", ""), r.get("phase", ""), str(r.get("lines", "")))
        if self.console.is_terminal:
            if self.live is None:
                self.live = Live(table, console=self.console, refresh_per_second=4, transient=True)
                self.live.start()
            else:
                self.live.update(table)

    def _stop_live(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def close(self) -> None:
        self._stop_live()


def _indent(text: str) -> str:
    return "\n".join("         " + line for line in text.splitlines())
