"""A silent boot judged by progress, not by silence alone (docs/failure-modes.md FM-42).

A Station autotune runs for up to 74 minutes at 100% GPU with a silent log, and a hung boot looks the same in
the log. So while `up` waits for a lane to serve, a lane whose ranks have all logged nothing new for the
silence window (`expect.stall_s`, `up --stall-after`) is judged by its processes: the CPU time of every
rank's container processes, read from the node's /proc, sampled half a window apart. CPU time that grew is
progress (the boot goes on, and the run says so once per window); next to none on every rank (under
BUSY_SHARE of a core), over the second half of a window of log silence, is a stalled boot, and the launch is
stopped then rather than at the end of its boot budget. A rank whose CPU time cannot be read gives no
verdict: the boot budget still bounds it. GPU use is not read (no per-process utilisation the stand-ins and
the seeds share); a tuner's host thread spins while it waits on the GPU, so its CPU time grows.

The command is plain shell on the node (docker inspect for the container's main pid, /proc for the
process tree); the judging is pure (`Silence`), so it is tested on its own and through `up` in the lab.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from sparkfleet.fleet.transport import Result

# Policy, not a seed figure: a boot that logs nothing for 10 minutes is looked at. Only a lane that also used
# no CPU over the last half of that window is stopped, so a long silent autotune (FM-42) is never stopped by it.
STALL_S = 600.0
# Policy too: progress is at least this share of one core over a sample window. A tuner keeps a core busy (the
# host thread waits on the GPU by spinning); a blocked process's housekeeping threads wake for a few ticks.
BUSY_SHARE = 0.05


def cpu_command(ids: list[str]) -> str:
    """Each container's main pid, the clock tick, then `pid ppid cpu-ticks` for every process of the node.

    /proc/PID/stat's second field (the command, in parentheses) may hold spaces: everything up to the last
    ") " is cut, so the fields that follow are counted from the state (3rd field of stat(5)) on."""
    pids = "".join(f"p=$(docker inspect -f '{{{{.State.Pid}}}}' {q} 2>/dev/null); "
                   f"printf 'pid %s %s\\n' {q} \"${{p:-0}}\"; " for q in map(shlex.quote, ids))
    return (pids + 'echo "clk $(getconf CLK_TCK)"; cat /proc/[0-9]*/stat 2>/dev/null '
            "| sed 's/^\\([0-9]*\\) .*) /\\1 /' | awk '{print $1, $3, $13 + $14}'")


def parse_cpu(result: Result, ids: list[str]) -> dict[str, float | None]:
    """Seconds of CPU used so far by each container's processes (its main process and every descendant);
    None for a container whose main pid could not be had (gone, not running, or a node that did not answer)."""
    out: dict[str, float | None] = {i: None for i in ids}
    if not result.ok:
        return out
    roots: dict[str, int] = {}
    tick = 0.0
    parent: dict[int, int] = {}
    ticks: dict[int, float] = {}
    for line in result.stdout.splitlines():
        f = line.split()
        if len(f) == 3 and f[0] == "pid" and f[1] in out:
            roots[f[1]] = int(f[2]) if f[2].isdigit() else 0
        elif len(f) == 2 and f[0] == "clk" and f[1].isdigit():
            tick = float(f[1])
        elif len(f) == 3 and all(x.isdigit() for x in f):
            parent[int(f[0])], ticks[int(f[0])] = int(f[1]), float(f[2])
    if not tick:
        return out
    for cid, root in roots.items():
        if root <= 0 or root not in ticks:
            continue
        total = 0.0
        for pid in ticks:
            p, hops = pid, 0
            while p not in (root, 0) and hops < 64:  # up the tree to the container's main process, or the top
                p, hops = parent.get(p, 0), hops + 1
            if p == root:
                total += ticks[pid]
        out[cid] = total / tick
    return out


@dataclass
class Verdict:
    kind: str  # working | stalled | unknown
    silent_s: float
    window_s: float  # how long apart the two CPU samples were
    cpu_s: dict[int, float | None]  # CPU seconds each rank used between the samples (None: not read)

    def text(self) -> str:
        used = ", ".join(f"rank {r} {'?' if s is None else f'{s:.2f} s'}" for r, s in sorted(self.cpu_s.items()))
        if self.kind == "working":
            return (f"no rank has logged a line for {self.silent_s:.0f} s, but the lane's processes used CPU "
                    f"({used} in the last {self.window_s:.0f} s): still working, not judged hung "
                    "(docs/failure-modes.md FM-42)")
        if self.kind == "stalled":
            return (f"no rank logged a line for {self.silent_s:.0f} s and no rank's processes kept a CPU busy "
                    f"(at least {BUSY_SHARE:.0%} of a core) in the last {self.window_s:.0f} s ({used}): the boot is "
                    "stalled (docs/failure-modes.md FM-42)")
        return (f"no rank has logged a line for {self.silent_s:.0f} s and the CPU use of {used} could not be "
                "read: left to the boot budget")


@dataclass
class Silence:
    """The lane's log silence during boot and the CPU samples taken in it.

    `lines(total, now)` each poll; when `due(now)` says so, the caller samples every rank's CPU and passes it
    to `sample(now, cpu)`, which gives a Verdict once a window of silence has a CPU sample half a window old."""

    stall_s: float
    quiet_since: float
    seen: int = -1
    ref: tuple[float, dict[int, float | None]] | None = None
    verdicts: list[Verdict] = field(default_factory=list)

    def lines(self, total: int, now: float) -> None:
        if total != self.seen:  # a new line on any rank: the lane is not silent, and old samples mean nothing
            self.seen, self.quiet_since, self.ref = total, now, None

    def due(self, now: float) -> bool:
        silent = now - self.quiet_since
        if self.ref is None:
            return silent >= self.stall_s / 2
        return silent >= self.stall_s and now - self.ref[0] >= self.stall_s / 2

    def sample(self, now: float, cpu: dict[int, float | None]) -> Verdict | None:
        if self.ref is None or now - self.quiet_since < self.stall_s:
            self.ref = (now, cpu)
            return None
        t0, before = self.ref
        used = {r: (None if cpu.get(r) is None or before.get(r) is None else max(0.0, cpu[r] - before[r]))
                for r in sorted(set(before) | set(cpu))}  # type: ignore[operator]
        known = [u for u in used.values() if u is not None]
        if any(u >= BUSY_SHARE * (now - t0) for u in known):
            kind = "working"
        else:  # stalled only when every rank was read: one unread rank may be the one doing the work
            kind = "stalled" if known and len(known) == len(used) else "unknown"
        self.ref = (now, cpu)
        v = Verdict(kind, now - self.quiet_since, now - t0, used)
        self.verdicts.append(v)
        return v
