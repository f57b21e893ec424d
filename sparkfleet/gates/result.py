"""What a gate reports: its checks, each with what was sent, what came back and why it failed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from sparkfleet.gates.client import RequestFailed

Status = Literal["pass", "fail", "skip"]


@dataclass
class Check:
    """One observation inside a gate (T1, V2, a needle size, a soak node...). ok None means skipped."""

    name: str
    ok: bool | None
    sent: str = ""
    got: str = ""
    why: str = ""
    elapsed_s: float = 0.0

    def as_dict(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "ok": self.ok}
        for k in ("sent", "got", "why"):
            if getattr(self, k):
                d[k] = getattr(self, k)
        d["elapsed_s"] = round(self.elapsed_s, 3)
        return d


@dataclass
class GateResult:
    name: str
    status: Status
    summary: str
    checks: list[Check] = field(default_factory=list)
    elapsed_s: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)  # measurements (sizes, percentiles, samples)

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "summary": self.summary,
                "elapsed_s": round(self.elapsed_s, 3), "checks": [c.as_dict() for c in self.checks],
                **({"data": self.data} if self.data else {})}


def skipped(name: str, why: str) -> GateResult:
    return GateResult(name, "skip", why)


def verdict(name: str, checks: list[Check], started: float, ok_summary: str,
            data: dict[str, Any] | None = None) -> GateResult:
    """pass when no check failed (and one ran); fail names the failed checks and the first reason."""
    bad = [c for c in checks if c.ok is False]
    ran = [c for c in checks if c.ok is not None]
    elapsed = time.monotonic() - started
    if bad:
        first = bad[0]
        summary = f"{len(bad)} of {len(ran)} check(s) failed: " + ", ".join(c.name for c in bad)
        summary += f" ({first.name}: {first.why})" if first.why else ""
        return GateResult(name, "fail", summary, checks, elapsed, data or {})
    if not ran:
        reasons = "; ".join(sorted({c.why for c in checks if c.why})) or "nothing to check"
        return GateResult(name, "skip", reasons, checks, elapsed, data or {})
    return GateResult(name, "pass", ok_summary, checks, elapsed, data or {})


class Recorder:
    """Collects a gate's checks; `step` times one and turns a failed request into a failed check."""

    def __init__(self) -> None:
        self.checks: list[Check] = []

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    @contextmanager
    def step(self, name: str, sent: str = "") -> Iterator[Check]:
        check = Check(name, None, sent=sent)
        t0 = time.monotonic()
        try:
            yield check
        except RequestFailed as exc:
            check.ok, check.why = False, str(exc)
        finally:
            check.elapsed_s = time.monotonic() - t0
            if check.ok is None and not check.why:
                check.ok, check.why = False, "the check reached no verdict"
            self.checks.append(check)

    def judge(self, check: Check, ok_why: tuple[bool, str], got: str | None = None) -> None:
        check.ok, check.why = ok_why
        if got is not None:
            check.got = got


Judge = Callable[[str], tuple[bool, str]]
