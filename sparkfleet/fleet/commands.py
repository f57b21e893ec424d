"""Node operations: each is a command the controller runs on a node plus a pure parser of its output.

The shape is pyinfra's facts (`pyinfra/facts/server.py`: `Sysctl.command()` builds the shell line,
`Sysctl.process(output)` turns the output into data): here `*_command(...)` returns the exact shell line
and `parse_*(result)` reads a `Result` (stdout, stderr, exit code) into data or a `NodeError`. Nothing
here does I/O; the runner runs the commands (or prints them under --dry-run) and hands back results.

Output formats follow the real tools (the sim's shims answer in the same formats):
- `docker ps -q --no-trunc`: one full 64-hex container id per line
  (https://docs.docker.com/reference/cli/docker/container/ls/, `--quiet`, `--no-trunc`).
- `docker inspect ID...`: a JSON array of the objects found; for an id it cannot find it writes
  `Error: No such object: ID` to stderr and exits 1, still printing the others
  (https://docs.docker.com/reference/cli/docker/inspect/). `State.Status` is one of created, running,
  paused, restarting, removing, exited, dead; `State.ExitCode` the exit code
  (https://docs.docker.com/reference/api/engine/, ContainerState).
- `docker logs ID`: the container's stdout on stdout and its stderr on stderr
  (https://docs.docker.com/reference/cli/docker/container/logs/); for an unknown container the CLI
  writes `Error response from daemon: No such container: ID` and exits 1.
- A docker CLI without its daemon: `Cannot connect to the Docker daemon at unix:///var/run/docker.sock.
  Is the docker daemon running?`; without access to the socket: `permission denied while trying to
  connect to the Docker daemon socket at unix:///var/run/docker.sock ...`
  (https://docs.docker.com/engine/install/linux-postinstall/).
- A missing binary: the shell's `docker: command not found` (bash) or `docker: not found` (dash), exit 127
  (POSIX: "If a command is not found, the exit status shall be 127").
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Any

from sparkfleet.engines.logs import split_lines
from sparkfleet.findings import Finding
from sparkfleet.fleet.transport import Result
from sparkfleet.naming import PROFILE_LABEL, RUN_LABEL
from sparkfleet.schema.inventory import Node

# `sysctl -w` rather than a redirect into /proc: it is an ordinary command, so the simulated lab's shim
# can stand in for it, and it needs root exactly as the seeds' launcher had (LCH-03).
DROP_CACHES = "sync && sysctl -q -w vm.drop_caches=3"
DROP_TIMEOUT_S = 120.0  # sync flushes dirty pages first, which can take a while on a busy node


# -- what went wrong on a node -----------------------------------------------------------------------

@dataclass(frozen=True)
class NodeError:
    """A command that did not do its job on a node, classified so the finding names the real cause."""

    node: str
    kind: str  # reach | not-run | docker-down | permission | missing-binary | no-such-container | failed
    message: str
    remedy: str

    def finding(self) -> Finding:
        return Finding(self.kind, "fail", self.message, self.remedy, node=self.node)


DAEMON_DOWN = re.compile(r"Cannot connect to the Docker daemon|Is the docker daemon running\?")
DOCKER_PERMISSION = re.compile(r"permission denied while trying to connect to the Docker daemon", re.I)
PERMISSION = re.compile(r"permission denied|operation not permitted", re.I)
NOT_FOUND = re.compile(r"(?:^|\s)(\S+): (?:command )?not found\s*$", re.M)
NO_SUCH_CONTAINER = re.compile(r"No such (?:container|object): (\S+)")
REMEDIES = {
    "reach": "bring the node back (or fix its SSH), then run again",
    "not-run": "the command never started on the node: fix how this machine enters it (the inventory's wrapper "
               "for the node, and what it says above), then run again",
    "docker-down": "start docker on the node (sudo systemctl start docker), then run again",
    "permission": "connect as a user allowed to do this (root, or a member of the docker group for docker)",
    "missing-binary": "install it on the node (or put it on the SSH user's PATH), then run again",
}


def classify(result: Result) -> NodeError | None:
    """None when the command worked; else what failed: the node not answering, or answering without
    running the command (not-run: e.g. it could not be entered), is not the same as a command that ran there
    and failed (docker down, permission, a missing binary)."""
    if result.ok:
        return None
    node = result.node
    if result.error == "not-run":  # the node answered, but the command was never started there
        return NodeError(node, "not-run", result.message or "the command could not be run on the node",
                         REMEDIES["not-run"])
    if result.error not in ("exit", None):  # unreachable, auth, host key, timeout: the transport's verdict
        return NodeError(node, "reach", result.message or result.error or "did not answer", REMEDIES["reach"])
    text = (result.stderr or "").strip() or (result.stdout or "").strip() or result.message
    last = text.splitlines()[-1] if text else f"exit {result.exit_code}"
    if DAEMON_DOWN.search(text):
        return NodeError(node, "docker-down", f"the docker daemon is not running: {last}", REMEDIES["docker-down"])
    if DOCKER_PERMISSION.search(text):
        return NodeError(node, "permission", f"no access to the docker socket: {last}", REMEDIES["permission"])
    missing = NOT_FOUND.search(text)
    if result.exit_code == 127 or missing:
        what = missing.group(1) if missing else "a command"
        return NodeError(node, "missing-binary", f"{what} is not installed on the node: {last}",
                         REMEDIES["missing-binary"])
    if PERMISSION.search(text):
        return NodeError(node, "permission", f"permission denied: {last}", REMEDIES["permission"])
    return NodeError(node, "failed", f"exit {result.exit_code}: {last}", "")


def failures(results: dict[str, Result]) -> list[Finding]:
    """One finding per node whose command failed, saying what failed."""
    return [e.finding() for e in (classify(r) for r in results.values()) if e is not None]


# -- docker: the lane's containers, their state, their logs, stopping them ---------------------------

def lane_containers_command(profile: str, running_only: bool = False, run_id: str | None = None) -> str:
    """Ids of one lane's containers (of one run, with `run_id`), by label only: another lane's or a foreign
    container never matches (docker ANDs label filters)."""
    flag = "" if running_only else " -a"
    run = f" --filter {shlex.quote(f'label={RUN_LABEL}={run_id}')}" if run_id else ""
    return f"docker ps{flag} -q --no-trunc --filter {shlex.quote(f'label={PROFILE_LABEL}={profile}')}{run}"


def parse_container_ids(result: Result) -> list[str] | NodeError:
    err = classify(result)
    if err:
        return err
    return result.stdout.split()


@dataclass(frozen=True)
class ContainerState:
    status: str  # docker's State.Status, or "missing" when docker no longer knows the container
    exit_code: int | None = None
    error: str = ""  # State.Error (e.g. an OCI runtime error) when docker gives one


def inspect_command(ids: list[str]) -> str:
    return "docker inspect " + " ".join(shlex.quote(i) for i in ids)


def parse_inspect(result: Result, refs: list[tuple[str, str]]) -> dict[str, ContainerState] | NodeError:
    """State per requested (id, name); an id docker says it has no such object of is "missing" (it vanished).

    `docker inspect` exits 1 when any id is unknown but still prints the others, so a non-zero exit
    whose stderr only names unknown ids is an answer, not a failure."""
    unknown = set(NO_SUCH_CONTAINER.findall(result.stderr or ""))
    other = [line for line in (result.stderr or "").splitlines() if line.strip() and not NO_SUCH_CONTAINER.search(line)]
    if not result.ok and (result.error != "exit" or other or not unknown):
        err = classify(result)
        if err:
            return err
    try:
        docs = json.loads(result.stdout) if result.stdout.strip() else []
    except ValueError:
        return NodeError(result.node, "failed", "docker inspect printed something that is not JSON", "")
    by_id = {d.get("Id"): d for d in docs if isinstance(d, dict)}
    by_name = {str(d.get("Name", "")).lstrip("/"): d for d in docs if isinstance(d, dict)}
    out: dict[str, ContainerState] = {}
    for cid, name in refs:
        d = by_id.get(cid) or by_name.get(name) or next(
            (v for k, v in by_id.items() if k and cid and k.startswith(cid)), None)
        if d is None:
            out[cid] = ContainerState("missing")
            continue
        state = d.get("State") or {}
        out[cid] = ContainerState(str(state.get("Status", "unknown")), state.get("ExitCode"),
                                  str(state.get("Error") or ""))
    return out


def logs_command(container: str, seen: int) -> str:
    """The log lines after the first `seen` (stdout and stderr merged, as the engine wrote them).

    The log is read whole on the node and only the new lines travel, byte for byte: `$(...)` would drop
    the trailing newlines, so a sentinel `x` and docker's exit code follow the output and are cut off again.
    Whether the last line is complete (ends with `\n`) thus survives, and `tail -n +N` counts `\n` only,
    as `parse_logs` does. When `docker logs` itself fails its message goes to stderr with its exit code, so
    a failure is never taken for the engine's log lines."""
    c = shlex.quote(container)
    return (f"out=$(docker logs {c} 2>&1; echo \"x$?\"); rc=${{out##*x}}; out=${{out%x*}}; "
            f"if [ \"$rc\" = 0 ]; then printf '%s' \"$out\" | tail -n +{seen + 1}; "
            f"else printf '%s\\n' \"$out\" >&2; exit \"$rc\"; fi")


def parse_logs(result: Result) -> list[str] | NodeError:
    """The complete new lines (`\r` and colour kept: engines/logs.py reads them); a last line not yet
    ended by `\n` (a tqdm bar still moving) is not counted, and the next read starts at it again."""
    err = classify(result)
    if err is None:
        return split_lines(result.stdout)
    text = (result.stderr or "").strip()
    gone = NO_SUCH_CONTAINER.search(text)
    if gone and err.kind == "failed":
        return NodeError(result.node, "no-such-container", f"docker logs: no such container {gone.group(1)}", "")
    return NodeError(err.node, err.kind, "docker logs failed: " + err.message, err.remedy)


def stop_command(ids: list[str], remove: bool = True) -> str:
    """Remove (or only stop, to keep them) containers: removing leaves no old head's rendezvous (FM-01)."""
    verb = "docker rm -f" if remove else "docker stop"
    return f"{verb} {' '.join(map(shlex.quote, ids))}"


# -- rail-2 aliases ---------------------------------------------------------------------------------

def rail2_alias_command(alias: str, iface: str, add: bool) -> str:
    """Runtime only: `ip addr` never writes persistent network config (LCH-T4)."""
    a, d = shlex.quote(alias), shlex.quote(iface)
    return (f"ip addr del {a} dev {d} 2>/dev/null; ip addr add {a} dev {d}" if add
            else f"ip addr del {a} dev {d} 2>/dev/null || true")


# -- drop caches ------------------------------------------------------------------------------------

def parse_drop_caches(result: Result) -> bool | str | None:
    """True when dropped; why not when the command ran and failed; None when the node did not answer
    (gathering facts reports it as unreachable)."""
    if result.ok:
        return True
    if result.error in ("exit", "timeout"):
        lines = (result.stderr or result.message or "").strip().splitlines()
        return lines[-1] if lines else f"exit {result.exit_code}"
    return None


def drop_caches(transport: Any, nodes: list[Node]) -> dict[str, bool | str]:
    """Drop the page cache everywhere at once (for `check --drop-caches`; `up` runs the same command)."""
    results = transport.run(nodes, DROP_CACHES, timeout_s=DROP_TIMEOUT_S)
    done = {name: parse_drop_caches(r) for name, r in results.items()}
    return {k: v for k, v in done.items() if v is not None}



# -- files -------------------------------------------------------------------------------------------

def read_file_command(path: str) -> str:
    return f"cat {shlex.quote(path)}"


# -- the fleet lock on a node ------------------------------------------------------------------------

@dataclass(frozen=True)
class LockAnswer:
    """What a node said to `lock_take_command`: taken, or held by `holder` (the lock file's text),
    `age_s` old by the node's own clock (None when the node could not say)."""

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


def lock_take_command(path: str, holder: str, stale: str | None = None) -> str:
    """Take the node's fleet lock atomically: the holder's line is written to a file of its own, then
    hard-linked to the lock path (`ln` fails when the lock exists, so of two controllers exactly one wins
    and the lock never exists half-written). With `stale` (the text of a lock judged stale), that lock is
    first removed, but only if it still reads exactly so, under `flock` on the lock's directory (so two
    take-overs cannot both remove, the second then finds the first's lock and reports it, and nothing is
    left behind: the flock ends with the command). When the stale lock cannot be removed (another user's
    file in a sticky directory) it prints `stuck OWNER_UID OWNER ME_UID ME DIR_MODE` (the mode in octal)
    and rm's message, and takes nothing."""
    q = shlex.quote
    d, lock, mine = q(posixpath.dirname(path)), q(path), q(holder)
    take = (f"mkdir -p {d} && t={lock}.$$ && printf '%s\\n' {mine} > \"$t\" || exit $?; "
            f"if err=$(ln \"$t\" {lock} 2>&1); then rm -f \"$t\"; echo taken; "
            f"elif [ -e {lock} ]; then rm -f \"$t\"; "
            f"echo \"held $(date +%s) $(stat -c %Y {lock} 2>/dev/null || echo -)\"; cat {lock}; "
            f"else rm -f \"$t\"; printf '%s\\n' \"$err\" >&2; exit 1; fi")
    if stale is None:
        return take
    return (f"mkdir -p {d} && exec 9<{d} && flock -w 30 9 || exit $?; "
            f"if [ \"$(cat {lock} 2>/dev/null)\" = {q(stale)} ] && ! err=$(rm -f {lock} 2>&1); then "
            f"u=$(id -un 2>/dev/null) || u=-; echo \"stuck $(stat -c '%u %U' {lock}) $(id -u) $u $(stat -c %a {d})\"; "
            f"printf '%s\\n' \"$err\"; exit 0; fi; {take}")


def parse_lock_take(result: Result) -> LockAnswer | LockStuck | NodeError:
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


def lock_release_command(path: str, holder: str) -> str:
    """Remove the node's fleet lock only while it is this holder's (never another controller's)."""
    lock = shlex.quote(path)
    return f"if [ \"$(cat {lock} 2>/dev/null)\" = {shlex.quote(holder)} ]; then rm -f {lock}; fi"


# -- docker logs: every other reader of a container's log ---------------------------------------------

LOG_TAIL = 60  # a rank's last log lines kept as evidence (a failed launch's record, watch, the bundle)


def log_tail_command(container: str, lines: int = LOG_TAIL) -> str:
    """The container's last `lines` lines, stdout and stderr together, as `docker logs` prints them."""
    return f"docker logs --tail {int(lines)} {shlex.quote(container)} 2>&1"


def engram_lines_command(container: str) -> str:
    """The container's `Engram DISK mode` boot lines (none is not an error)."""
    return f"docker logs {shlex.quote(container)} 2>&1 | grep -F 'Engram DISK mode' || true"
