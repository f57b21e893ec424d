"""One run at a time per fleet: a lock file on every node of the lane naming who holds it (NodeLock), and
this controller's own lock file per inventory (FleetLock: one run at a time per state dir, and what
`watch` reads to see that the operator is acting)."""

from __future__ import annotations

import getpass
import json
import os
import posixpath
import socket
import time
from pathlib import Path

from sparkfleet.findings import Finding
from sparkfleet.fleet.ops import LockAnswer, LockRelease, LockStuck, LockTake, on
from sparkfleet.naming import node_lock_path
from sparkfleet.runner.ops import run_now
from sparkfleet.schema.errors import Busy, UserError


class FleetLock:
    """`with FleetLock(path, what):` — refuses (UserError) while another live run holds it."""

    def __init__(self, path: Path, what: str):
        self.path = path
        self.what = what
        self.held = False

    def __enter__(self) -> FleetLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "user": os.environ.get("USER", "?"),
              "command": self.what, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is not None and self._alive(holder):
                    raise Busy(
                        f"another run holds the fleet lock ({self.path}): {holder.get('command')!r} by "
                        f"{holder.get('user')}@{holder.get('host')} pid {holder.get('pid')} since "
                        f"{holder.get('since')}; wait for it, or remove the lock if that process is gone") from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise UserError(f"could not take the fleet lock {self.path}")

    def __exit__(self, *exc: object) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def live_holder(self) -> dict | None:
        """Who holds the lock now (pid, host, user, command, since), or None when nobody alive does."""
        holder = self._holder()
        return holder if holder is not None and self._alive(holder) else None

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _alive(holder: dict) -> bool:
        if holder.get("host") != socket.gethostname():
            return True  # cannot tell for another host: assume it is running
        try:
            return pid_alive(int(holder.get("pid", 0)))
        except ValueError:
            return True

# -- the fleet lock on the nodes -----------------------------------------------------------------------

# A bound, not a measurement: for a holder on another host, whose process this controller cannot see, a
# lock older than this (by the node's own clock) is taken as abandoned. A run holds the lock only while it
# runs (up, down, restore, including a soak gate); a day is far past any of those, and short enough that
# a lock left by a laptop that died does not keep the lab locked for good.
STALE_AFTER_S = 24 * 3600.0


def holder_text(run_id: str, command: str, profile: str) -> str:
    """The one line a node's lock file holds: who, from where, which process and run, since when."""
    return json.dumps({"user": os.environ.get("USER") or _user(), "host": socket.gethostname(), "pid": os.getpid(),
                       "run_id": run_id, "command": command, "lane": profile,
                       "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, sort_keys=True)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "?"


def parse_holder(text: str) -> dict:
    """A lock file's holder; {} when it is not one this code wrote (then only its age can judge it)."""
    try:
        holder = json.loads(text)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def stale_why(holder: dict, age_s: float | None, me: dict, alive, bound_s: float = STALE_AFTER_S) -> str | None:
    """Why a held lock may be taken over (None: it may not). `me` is this controller's holder; `alive(pid)`
    says whether a process of this host runs. On this host the holder's process decides; for another host
    (or a lock this code cannot read) only its age can, against the bound."""
    if holder.get("host") == me["host"]:
        pid = holder.get("pid")
        if pid == me["pid"]:
            return f"left by an earlier run of this process (run {holder.get('run_id')})"
        if isinstance(pid, int) and not alive(pid):
            return f"its process {pid} on {me['host']} is gone"
        return None
    if age_s is not None and age_s > bound_s:
        return f"it is {age_s / 3600:.1f} h old (older than {bound_s / 3600:.1f} h) and its host cannot be asked"
    return None


def describe(node: str, path: str, text: str) -> str:
    h = parse_holder(text)
    if not h:
        return f"{node}: the fleet lock {path} holds {text[:120]!r}"
    return f"{node}: {_run_of(h)}"


def _run_of(h: dict) -> str:
    return (f"{h.get('command')!r} by {h.get('user')}@{h.get('host')} pid {h.get('pid')} "
            f"(run {h.get('run_id')}) since {h.get('since')}")


def stuck_text(node: str, path: str, text: str, why: str, stuck) -> str:
    """The refusal when a stale lock is another user's file in a sticky directory (/run/lock is 1777: only
    its owner or root may remove it): whose it is, who could not, and what to run where."""
    def who(name: str, uid: int) -> str:
        return f"{name} (uid {uid})" if name else f"uid {uid}"

    owner, h = who(stuck.owner, stuck.owner_uid), parse_holder(text)
    where = (f"{posixpath.dirname(path)} is sticky (mode {stuck.dir_mode:o}: only a file's owner or root may "
             "remove it)" if stuck.sticky else f"{posixpath.dirname(path)} has mode {stuck.dir_mode:o}")
    return (f"{node}: the fleet lock {path} is stale ({why}) but belongs to {owner}, and this run's user there, "
            f"{who(stuck.me, stuck.me_uid)}, cannot remove it: {where}; rm said: {stuck.error or '(nothing)'}; "
            f"it holds {_run_of(h) if h else repr(text[:120])}; nothing was done: on {node}, run "
            f"`sudo rm {path}` (or remove it as {owner}), then run again")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


class NodeLock:
    """The fleet lock on every node of the lane (naming.node_lock_path, one per node, shared by every lane
    on it): `take()` writes it everywhere or refuses (Busy, naming node and holder) after giving back what
    it took; `release()` removes it wherever it is still this run's. Nodes that do not answer are not
    locked (the run's own steps then report them). Under --dry-run it only shows what it would run."""

    def __init__(self, ctx):

        self.ctx = ctx
        self.path = node_lock_path()
        self.text = holder_text(ctx.record.run_id, ctx.record.command, ctx.profile.name)
        self.nodes = list(dict.fromkeys(n.name for n in ctx.nodes))
        self.held: list[str] = []  # where the lock may be ours (release asks only these)

    def take(self) -> None:
        try:
            self._take()
        except BaseException:
            self.release()
            raise

    def _take(self) -> None:

        ctx = self.ctx
        take = LockTake(self.path, self.text)
        reply = run_now(ctx, on("take the fleet lock", dict.fromkeys(self.nodes, take), 30.0))
        if reply is None:  # --dry-run
            return
        me = parse_holder(self.text)
        answers = {n: take.parse(r) for n, r in reply.items()}
        # a take that did not run, or ran and failed before it took (NodeError of a known kind), took nothing;
        # only an answer or a failure this code cannot read may leave this run's lock behind
        self.held = [n for n in self.nodes if getattr(answers.get(n), "kind", "failed") == "failed"]
        stale = {}
        for n, a in answers.items():
            if isinstance(a, LockAnswer) and not a.taken:
                if a.holder == self.text:  # two inventory nodes that are one machine: already ours
                    answers[n] = LockAnswer(True)
                    continue
                why = stale_why(parse_holder(a.holder), a.age_s, me, pid_alive)
                if why:
                    stale[n] = (a.holder, why)
        if stale:
            over = {n: LockTake(self.path, self.text, stale=old) for n, (old, _) in stale.items()}
            again = run_now(ctx, on("take over a stale fleet lock", over, 60.0)) or {}
            warned = []
            for n, res in again.items():
                answers[n] = over[n].parse(res)
                if isinstance(answers[n], LockAnswer) and answers[n].taken:
                    warned.append(Finding("fleet-lock", "warn", f"took over a stale fleet lock ({stale[n][1]}): "
                                          f"{describe(n, self.path, stale[n][0])}", node=n))
            if warned:
                ctx.events.findings("lock", warned)
                ctx.record.data.setdefault("fleet_lock", {})["taken_over"] = [f.as_dict() for f in warned]
        busy = [(n, a) for n, a in answers.items() if isinstance(a, LockAnswer) and not a.taken]
        if busy:
            n, a = busy[0]
            more = f" (and on {', '.join(x for x, _ in busy[1:])})" if busy[1:] else ""
            raise Busy(f"another run holds the fleet lock {self.path} on {describe(n, self.path, a.holder)}{more}; "
                       f"wait for it to end, or, if that controller is gone, remove {self.path} on {n}")
        stuck = [(n, a) for n, a in answers.items() if isinstance(a, LockStuck)]
        if stuck:
            n, a = stuck[0]
            more = f" (and on {', '.join(x for x, _ in stuck[1:])})" if stuck[1:] else ""
            raise Busy(stuck_text(n, self.path, stale[n][0], stale[n][1], a) + more)
        failed = [a for a in answers.values() if not isinstance(a, (LockAnswer, LockStuck)) and a.kind != "reach"]
        if failed:
            e = failed[0]
            what = "its command could not be run there" if e.kind == "not-run" else "its command failed there"
            raise UserError(f"{e.node}: could not take the fleet lock {self.path} ({what}): {e.message}"
                            + (f"; {e.remedy}" if e.remedy else ""))
        ctx.record.data.setdefault("fleet_lock", {})["nodes"] = [n for n, a in answers.items()
                                                                  if isinstance(a, LockAnswer)]

    def release(self) -> None:
        """Give the lock back wherever it may be this run's (also after a failure or Ctrl-C)."""

        if not self.held:
            return
        nodes, self.held = self.held, []
        give = LockRelease(self.path, self.text)
        reply = run_now(self.ctx, on("give back the fleet lock", dict.fromkeys(nodes, give), 30.0)) or {}
        left = [e for e in (give.parse(r) for r in reply.values()) if e is not None]
        if left:
            self.ctx.events.findings("lock", [Finding("fleet-lock", "warn", f"could not give back the fleet lock "
                                                      f"{self.path}: {e.message}", f"remove {self.path} on {e.node}",
                                                      node=e.node) for e in left])
