"""The fleet lock on a node (runner/lock.py's NodeLock): taking it, giving it back, and looking at who
holds it together with the lane's containers (watch)."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, replace

from sparkfleet.fleet.ops.base import Done, NodeError, Op, classify
from sparkfleet.fleet.ops.docker import LaneContainers
from sparkfleet.fleet.ops.files import ReadFile
from sparkfleet.fleet.transport import Result


@dataclass(frozen=True)
class LockAnswer:
    """What a node said to `LockTake`: taken, or held by `holder` (the lock file's text), `age_s` old by
    the node's own clock (None when the node could not say)."""

    taken: bool
    holder: str = ""
    age_s: float | None = None


@dataclass(frozen=True)
class LockStuck:
    """A take-over that found the stale lock but could not remove it: in a sticky directory (/run/lock is
    1777) only the file's owner or root may unlink it. Who owns it, who tried (uids and names as the node
    knows them; a name the node cannot resolve is ""), the lock directory's mode, and what `rm` said."""

    owner_uid: int
    owner: str
    me_uid: int
    me: str
    dir_mode: int
    error: str

    @property
    def sticky(self) -> bool:
        return bool(self.dir_mode & 0o1000)


@dataclass(frozen=True)
class LockTake(Op[LockAnswer | LockStuck | NodeError]):
    """Take the node's fleet lock at `path` for `holder` (its line), atomically.

    The holder's line is written to a file of its own, then hard-linked to the lock path (`ln` fails when
    the lock exists, so of two controllers exactly one wins and the lock never exists half-written). With
    `stale` (the text of a lock judged stale), that lock is first removed, but only if it still reads
    exactly so, under `flock` on the lock's directory (so two take-overs cannot both remove, the second
    then finds the first's lock and reports it, and nothing is left behind: the flock ends with the
    command). When the stale lock cannot be removed (another user's file in a sticky directory) it prints
    `stuck OWNER_UID OWNER ME_UID ME DIR_MODE` (the mode in octal) and rm's message, and takes nothing."""

    path: str
    holder: str
    stale: str | None = None
    changes = True

    def command(self) -> str:
        q = shlex.quote
        d, lock, mine = q(posixpath.dirname(self.path)), q(self.path), q(self.holder)
        take = (f"mkdir -p {d} && t={lock}.$$ && printf '%s\\n' {mine} > \"$t\" || exit $?; "
                f"if err=$(ln \"$t\" {lock} 2>&1); then rm -f \"$t\"; echo taken; "
                f"elif [ -e {lock} ]; then rm -f \"$t\"; "
                f"echo \"held $(date +%s) $(stat -c %Y {lock} 2>/dev/null || echo -)\"; cat {lock}; "
                f"else rm -f \"$t\"; printf '%s\\n' \"$err\" >&2; exit 1; fi")
        if self.stale is None:
            return take
        return (f"mkdir -p {d} && exec 9<{d} && flock -w 30 9 || exit $?; "
                f"if [ \"$(cat {lock} 2>/dev/null)\" = {q(self.stale)} ] && ! err=$(rm -f {lock} 2>&1); then "
                f"u=$(id -un 2>/dev/null) || u=-; echo \"stuck $(stat -c '%u %U' {lock}) $(id -u) $u "
                f"$(stat -c %a {d})\"; printf '%s\\n' \"$err\"; exit 0; fi; {take}")

    def parse(self, result: Result) -> LockAnswer | LockStuck | NodeError:
        err = classify(result)
        if err:
            return err
        first, _, rest = result.stdout.partition("\n")
        words = first.split()
        if words == ["taken"]:
            return LockAnswer(True)
        if len(words) == 3 and words[0] == "held":
            now, mtime = words[1], words[2]
            age = float(now) - float(mtime) if now.isdigit() and mtime.isdigit() else None
            return LockAnswer(False, rest.strip(), age)
        if len(words) == 6 and words[0] == "stuck" and all(w.isdigit() for w in words[1::2]):
            def name(w: str) -> str:  # stat's UNKNOWN and our "-": the node has no name for that uid
                return "" if w in ("UNKNOWN", "-") else w

            return LockStuck(int(words[1]), name(words[2]), int(words[3]), name(words[4]), int(words[5], 8),
                             rest.strip())
        return NodeError(result.node, "failed", f"the fleet lock command printed {first!r}", "")


@dataclass(frozen=True)
class LockRelease(Done):
    """Remove the node's fleet lock only while it is this holder's (never another controller's)."""

    path: str
    holder: str
    changes = True

    def command(self) -> str:
        lock = shlex.quote(self.path)
        return f"if [ \"$(cat {lock} 2>/dev/null)\" = {shlex.quote(self.holder)} ]; then rm -f {lock}; fi"


LOOK_SEP = "--sparkfleet-watch-look--"


@dataclass(frozen=True)
class Seen:
    """One node at a glance: the holder line of its fleet lock ("" when free) and the lane's container
    ids, or why the node could not say."""

    lock: str = ""
    ids: list[str] | None = None
    error: str = ""


@dataclass(frozen=True)
class Look(Op[Seen]):
    """The node's fleet lock at `lock_path` and the lane's containers, in one round trip (watch, before
    it acts)."""

    profile: str
    lock_path: str

    def command(self) -> str:
        return (f"{ReadFile(self.lock_path).command()} 2>/dev/null; echo {LOOK_SEP}; "
                f"{LaneContainers(self.profile).command()}")

    def parse(self, result: Result) -> Seen:
        lock, sep, rest = result.stdout.partition(LOOK_SEP + "\n")
        if not sep:
            return Seen(error=result.message or result.stderr.strip() or f"exit {result.exit_code}")
        ids = LaneContainers(self.profile).parse(replace(result, stdout=rest))
        if not isinstance(ids, list):
            return Seen(lock.strip(), error=ids.message)
        return Seen(lock.strip(), ids)
