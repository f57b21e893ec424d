"""docker on a node: the lane's containers, their state, their logs, stopping them.

Output formats follow the real tools (the sim's shims answer in the same formats):
- `docker ps -q --no-trunc`: one full 64-hex container id per line
  (https://docs.docker.com/reference/cli/docker/container/ls/, `--quiet`, `--no-trunc`).
- `docker inspect ID...`: a JSON array of the objects found; for an id it cannot find it writes
  `Error: No such object: ID` to stderr and exits 1, still printing the others
  (https://docs.docker.com/reference/cli/docker/inspect/). `State.Status` is one of created, running,
  paused, restarting, removing, exited, dead; `State.ExitCode` the exit code
  (https://docs.docker.com/reference/api/engine/, ContainerState). `docker inspect --format` prints one
  line per container with the fields asked; `State.FinishedAt` is RFC 3339 with nanoseconds, the zero
  time `0001-01-01T00:00:00Z` for a container that never stopped.
- `docker logs ID`: the container's stdout on stdout and its stderr on stderr
  (https://docs.docker.com/reference/cli/docker/container/logs/); for an unknown container the CLI
  writes `Error response from daemon: No such container: ID` and exits 1.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
from dataclasses import dataclass

from sparkfleet.engines.logs import split_lines
from sparkfleet.fleet.ops.base import Done, NodeError, Op, classify
from sparkfleet.fleet.transport import Result
from sparkfleet.naming import PROFILE_LABEL, RANK_LABEL, RUN_LABEL

NO_SUCH_CONTAINER = re.compile(r"No such (?:container|object): (\S+)")
_DOCKER_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def docker_time(s: str | None) -> float | None:
    """Docker's RFC 3339 time with nanoseconds (2026-11-29T20:08:17.123456789Z) as unix time. Go's
    RFC3339Nano drops trailing zeros (.12Z, not .120000000Z), so two such strings do not sort as times."""
    m = _DOCKER_TIME.match(s or "")
    if not m:
        return None
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    base = dt.datetime.fromisoformat(m.group(1) + tz)
    return base.timestamp() + float("0." + (m.group(2) or "0"))
LOG_TAIL = 60  # a rank's last log lines kept as evidence (a failed launch's record, watch, the bundle)


@dataclass(frozen=True)
class LaneContainers(Op[list[str] | NodeError]):
    """Ids of one lane's containers (of one run, with `run_id`), by label only: another lane's or a foreign
    container never matches (docker ANDs label filters)."""

    profile: str
    running_only: bool = False
    run_id: str | None = None

    def command(self) -> str:
        flag = "" if self.running_only else " -a"
        run = f" --filter {shlex.quote(f'label={RUN_LABEL}={self.run_id}')}" if self.run_id else ""
        return f"docker ps{flag} -q --no-trunc --filter {shlex.quote(f'label={PROFILE_LABEL}={self.profile}')}{run}"

    def parse(self, result: Result) -> list[str] | NodeError:
        err = classify(result)
        if err:
            return err
        return result.stdout.split()


@dataclass(frozen=True)
class ContainerState:
    status: str  # docker's State.Status, or "missing" when docker no longer knows the container
    exit_code: int | None = None
    error: str = ""  # State.Error (e.g. an OCI runtime error) when docker gives one


@dataclass(frozen=True)
class Inspect(Op[dict[str, ContainerState] | NodeError]):
    """The state of containers, each asked by (id, name): by id, else by name, else by an id prefix."""

    refs: tuple[tuple[str, str], ...]

    def command(self) -> str:
        return "docker inspect " + " ".join(shlex.quote(i) for i, _ in self.refs)

    def parse(self, result: Result) -> dict[str, ContainerState] | NodeError:
        """State per requested id; an id docker says it has no such object of is "missing" (it vanished).

        `docker inspect` exits 1 when any id is unknown but still prints the others, so a non-zero exit
        whose stderr only names unknown ids is an answer, not a failure."""
        unknown = set(NO_SUCH_CONTAINER.findall(result.stderr or ""))
        other = [line for line in (result.stderr or "").splitlines()
                 if line.strip() and not NO_SUCH_CONTAINER.search(line)]
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
        for cid, name in self.refs:
            d = by_id.get(cid) or by_name.get(name) or next(
                (v for k, v in by_id.items() if k and cid and k.startswith(cid)), None)
            if d is None:
                out[cid] = ContainerState("missing")
                continue
            state = d.get("State") or {}
            out[cid] = ContainerState(str(state.get("Status", "unknown")), state.get("ExitCode"),
                                      str(state.get("Error") or ""))
        return out


@dataclass(frozen=True)
class Logs(Op[list[str] | NodeError]):
    """The log lines after the first `seen` (stdout and stderr merged, as the engine wrote them): the
    reader's poll (engines/logs.py reads them)."""

    container: str
    seen: int = 0

    def command(self) -> str:
        """The log is read whole on the node and only the new lines travel, byte for byte: `$(...)` would
        drop the trailing newlines, so a sentinel `x` and docker's exit code follow the output and are cut
        off again. Whether the last line is complete (ends with `\\n`) thus survives, and `tail -n +N`
        counts `\\n` only, as `parse` does. When `docker logs` itself fails its message goes to stderr with
        its exit code, so a failure is never taken for the engine's log lines."""
        c = shlex.quote(self.container)
        return (f"out=$(docker logs {c} 2>&1; echo \"x$?\"); rc=${{out##*x}}; out=${{out%x*}}; "
                f"if [ \"$rc\" = 0 ]; then printf '%s' \"$out\" | tail -n +{self.seen + 1}; "
                f"else printf '%s\\n' \"$out\" >&2; exit \"$rc\"; fi")

    def parse(self, result: Result) -> list[str] | NodeError:
        """The complete new lines (`\\r` and colour kept); a last line not yet ended by `\\n` (a tqdm bar
        still moving) is not counted, and the next read starts at it again."""
        err = classify(result)
        if err is None:
            return split_lines(result.stdout)
        text = (result.stderr or "").strip()
        gone = NO_SUCH_CONTAINER.search(text)
        if gone and err.kind == "failed":
            return NodeError(result.node, "no-such-container", f"docker logs: no such container {gone.group(1)}", "")
        return NodeError(err.node, err.kind, "docker logs failed: " + err.message, err.remedy)


@dataclass(frozen=True)
class LogTail(Op[list[str]]):
    """The container's last `lines` lines (all with None; since `since`, docker's --since), stdout and
    stderr together, as `docker logs` prints them: what people read (`logs`, watch's incidents, the
    bundle)."""

    container: str
    lines: int | None = LOG_TAIL
    since: str | None = None

    def command(self) -> str:
        since = f" --since {shlex.quote(self.since)}" if self.since else ""
        tail = f" --tail {int(self.lines)}" if self.lines is not None else ""
        return f"docker logs{since}{tail} {shlex.quote(self.container)} 2>&1"

    def parse(self, result: Result) -> list[str]:
        """The lines as the reader (`Logs`) splits them, on `\n` only (`str.splitlines()` would also split
        on tqdm's `\r` and on \x0b, \x0c, \x1c-\x1e, \x85, \u2028), so a bar is one line here as it is
        there; a last line not yet ended is one too, as `docker logs --tail` counts it."""
        if not result.ok:
            return [f"(cannot read logs: {result.message or result.stderr.strip()})"]
        out = result.stdout
        return split_lines(out if not out or out.endswith("\n") else out + "\n")


@dataclass(frozen=True)
class EngramLines(Done):
    """The container's `Engram DISK mode` boot lines (none is not an error); the caller reads stdout."""

    container: str

    def command(self) -> str:
        return f"docker logs {shlex.quote(self.container)} 2>&1 | grep -F 'Engram DISK mode' || true"


@dataclass(frozen=True)
class Stop(Done):
    """Remove (or only stop, to keep them) containers: removing leaves no old head's rendezvous (FM-01)."""

    ids: tuple[str, ...]
    remove: bool = True
    changes = True

    def command(self) -> str:
        verb = "docker rm -f" if self.remove else "docker stop"
        return f"{verb} {' '.join(map(shlex.quote, self.ids))}"


@dataclass(frozen=True)
class Stopped(Op[list[dict] | str]):
    """Rank, state and FinishedAt of every container of the lane on the node (by label): the order the
    ranks really stopped in, by docker's own clock."""

    profile: str

    def command(self) -> str:
        ids = LaneContainers(self.profile).command()
        fmt = shlex.quote(f'{{{{index .Config.Labels "{RANK_LABEL}"}}}} {{{{.State.Status}}}} '
                          f'{{{{.State.FinishedAt}}}}')
        return f'ids=$({ids}) && if [ -n "$ids" ]; then docker inspect --format {fmt} $ids; fi'

    def parse(self, result: Result) -> list[dict] | str:
        """[{rank, state, finished_at (docker's text), finished_s (unix time, to compare)}] or why the node
        could not say."""
        if not result.ok:
            return result.message or result.stderr.strip() or f"exit {result.exit_code}"
        out = []
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) == 3:
                out.append({"rank": parts[0], "state": parts[1], "finished_at": parts[2],
                            "finished_s": docker_time(parts[2])})
        return out
