"""What watch decides, as pure functions over probes, times and records: no I/O here.

- A lane is failing after K consecutive failed probes, or at once when a rank exited or vanished; while
  a rank's node does not answer (powered off, rebooting), watch waits for it and spends no restart.
- The memory guard: a rank whose MemAvailable stays under its line (the lane's floor, or earlyoom's
  SIGTERM line plus margin) for longer than a grace period makes watch stop the lane head first.
- The restart budget: at most N restarts per window, with a growing backoff between them; a spent
  budget leaves the lane stopped. It never loops.
- The operator wins: a run of this lane that watch did not start (an `up`, `down`, `restore` here,
  or containers of a run watch does not know, started by another controller) makes watch stand down.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from sparkfleet.runner.summaries import RunSummary
from sparkfleet.watch.liveness import GONE, Probe
from sparkfleet.watch.status import REASONS

__all__ = ["REASONS", "Budget", "Settings", "Tracker", "Verdict", "foreign_ranks", "lane_removed", "memory_unread",
           "operator_run"]

Action = Literal["ok", "suspect", "wait", "restart", "memory-stop"]


@dataclass(frozen=True)
class Settings:
    interval_s: float = 30.0
    failures: int = 2  # K
    max_restarts: int = 3  # N per window
    window_s: float = 1800.0
    backoff_s: float = 30.0  # before the 2nd restart in a window; doubles for each one after
    probe_timeout_s: float = 10.0
    memory_grace_s: float = 60.0

    def problems(self) -> list[str]:
        """Why these settings cannot be used (bad input, exit 2), one line each."""
        out = []
        if self.probe_timeout_s <= 0:
            out.append(f"--probe-timeout {self.probe_timeout_s:g}: expected seconds above 0")
        if self.interval_s < self.probe_timeout_s:
            out.append(f"--interval {self.interval_s:g} is below the probe's timeout ({self.probe_timeout_s:g} s): "
                       "a probe would still be running when the next is due; raise --interval or lower "
                       "--probe-timeout")
        if self.failures < 1:
            out.append(f"--failures {self.failures}: expected 1 or more consecutive failed probes")
        if self.max_restarts < 1:
            out.append(f"--max-restarts {self.max_restarts}: a budget of 0 restarts could only watch the lane "
                       "fail; expected 1 or more (use `sparkfleet status` to look without acting)")
        if self.window_s <= 0:
            out.append(f"--window {self.window_s:g}: expected seconds above 0")
        if self.backoff_s < 0:
            out.append(f"--backoff {self.backoff_s:g}: expected 0 or more seconds")
        if self.memory_grace_s < 0:
            out.append(f"--memory-grace {self.memory_grace_s:g}: expected 0 or more seconds")
        return out


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str = ""  # one of REASONS when action is restart or memory-stop
    why: str = ""  # one line for people
    node: str | None = None


@dataclass
class Tracker:
    """Consecutive failed probes and how long each node has been short of memory."""

    settings: Settings
    consecutive: int = 0
    low_since: dict[str, float] = field(default_factory=dict)

    def reset(self) -> None:
        self.consecutive = 0
        self.low_since.clear()

    def observe(self, probe: Probe) -> Verdict:
        now = probe.at
        silent = [r for r in probe.ranks if r.state == "unknown"]
        failing = not probe.ok or any(r.state in GONE or r.state == "vanished" for r in probe.ranks)
        if silent and failing:  # a restart now would fail at its stop step and leave the lane stopped
            r = silent[0]  # (a node powered off or lost): wait for it, spending nothing
            return Verdict("wait", why=f"waiting for {r.node} (rank {r.rank}) to answer before restarting the "
                           f"group: {r.error or 'no answer'}", node=r.node)
        for r in probe.ranks:
            if r.state in GONE:
                return Verdict("restart", "rank-exited", f"rank {r.rank} on {r.node} {r.state}", r.node)
            if r.state == "vanished":
                return Verdict("restart", "rank-vanished", f"rank {r.rank}'s container on {r.node} is gone", r.node)
        short = self._memory(probe, now)
        if short is not None:
            return short
        if probe.ok:
            self.consecutive = 0
            return Verdict("ok", why=probe.why)
        self.consecutive += 1
        k = self.settings.failures
        if self.consecutive >= k:
            return Verdict("restart", "probe-failed", f"{self.consecutive} failed probe(s) in a row "
                           f"(--failures {k}): {probe.why}")
        return Verdict("suspect", why=f"failed probe {self.consecutive} of {k}: {probe.why}")

    def _memory(self, probe: Probe, now: float) -> Verdict | None:
        low = {r.node: r for r in probe.ranks
               if r.mem_available is not None and r.mem_guard is not None and r.mem_available < r.mem_guard}
        for node in list(self.low_since):
            if node not in low:
                del self.low_since[node]
        for node, r in low.items():
            since = self.low_since.setdefault(node, now)
            if now - since >= self.settings.memory_grace_s:
                return Verdict("memory-stop", "memory",
                               f"MemAvailable on {node} (rank {r.rank}) {r.mem_available / 1e9:.1f} GB has been "
                               f"below {r.mem_guard / 1e9:.1f} GB ({r.guard_why}) for {now - since:.0f} s "
                               f"(--memory-grace {self.settings.memory_grace_s:g})", node)
        return None


def memory_unread(probe: Probe) -> dict[str, str]:
    """The nodes whose MemAvailable the probe has no reading of, each with a line saying why: the memory guard
    cannot judge them, and says so rather than pass over them as if they had memory to spare."""
    out: dict[str, str] = {}
    for r in probe.ranks:
        if r.mem_available is None and r.node not in out:
            out[r.node] = (f"memory guard: no MemAvailable reading from {r.node} (rank {r.rank}): "
                           f"{r.mem_error or r.error or 'not reported'}; its memory is not judged")
    return out


@dataclass
class Budget:
    """N restarts per sliding window; the k-th restart in a window waits backoff × 2^(k-2) (the first none)."""

    max_restarts: int
    window_s: float
    backoff_s: float
    spent: list[float] = field(default_factory=list)  # when each restart began
    by_reason: Counter[str] = field(default_factory=Counter)

    def used(self, now: float) -> int:
        return sum(1 for t in self.spent if now - t < self.window_s)

    def left(self, now: float) -> int:
        return max(0, self.max_restarts - self.used(now))

    def delay(self, now: float) -> float:
        """Seconds to wait before the next restart (0 for the first one in the window)."""
        k = self.used(now)
        return 0.0 if k == 0 else self.backoff_s * 2 ** (k - 1)

    def spend(self, now: float, reason: str) -> None:
        self.spent.append(now)
        self.by_reason[reason] += 1

    def why_spent(self, now: float) -> str:
        return (f"restart budget spent: {self.used(now)} restart(s) in the last {self.window_s:g} s "
                f"(--max-restarts {self.max_restarts} per --window {self.window_s:g})")


def operator_run(runs: list[RunSummary], ours: set[str], since: float, profile: str) -> RunSummary | None:
    """The newest run of this lane that watch did not start and that began after `since`."""
    theirs = [r for r in runs if r.profile == profile and r.run_id not in ours and r.started >= since]
    return max(theirs, key=lambda r: r.started) if theirs else None


def foreign_ranks(probe: Probe, known_runs: set[str]) -> list[str]:
    """Ranks running a container of this lane from a run watch does not know (another controller's `up`)."""
    return [f"rank {r.rank} on {r.node} runs {r.run_id}" for r in probe.ranks
            if r.run_id and r.state == "running" and r.run_id not in known_runs]


def lane_removed(probe: Probe) -> bool:
    """Every rank's container is gone at once: the lane was taken down (a `down` here or from another
    controller, or docker rm of all of it), not a failure of part of the group. Watch never brings back
    a lane someone removed whole; a reboot or a crash leaves exited containers, not none."""
    return bool(probe.ranks) and all(r.state == "vanished" for r in probe.ranks)
