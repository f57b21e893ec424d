"""watch's node operations: a command plus a pure parser each (the runner's shape; no I/O here).

`docker inspect --format` prints one line per container with the fields asked
(https://docs.docker.com/reference/cli/docker/inspect/); `State.FinishedAt` is RFC 3339 with
nanoseconds, the zero time `0001-01-01T00:00:00Z` for a container that never stopped.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

from sparkfleet.fleet.commands import (  # noqa: F401 - log_tail_command and LOG_TAIL: watch's, from the one place
    LOG_TAIL,
    lane_containers_command,
    log_tail_command,
    parse_container_ids,
    read_file_command,
)
from sparkfleet.fleet.transport import Result
from sparkfleet.naming import PROFILE_LABEL, RANK_LABEL


def parse_log_tail(result: Result) -> list[str]:
    return result.stdout.splitlines() if result.ok else [f"(no logs: {result.message or result.stderr.strip()})"]


def stopped_command(profile: str) -> str:
    """Rank, state and FinishedAt of every container of the lane on the node (by label)."""
    ids = f"docker ps -aq --no-trunc --filter {shlex.quote(f'label={PROFILE_LABEL}={profile}')}"
    fmt = shlex.quote(f'{{{{index .Config.Labels "{RANK_LABEL}"}}}} {{{{.State.Status}}}} {{{{.State.FinishedAt}}}}')
    return f'ids=$({ids}) && if [ -n "$ids" ]; then docker inspect --format {fmt} $ids; fi'


def parse_stopped(result: Result) -> list[dict] | str:
    """[{rank, state, finished_at}] or why the node could not say."""
    if not result.ok:
        return result.message or result.stderr.strip() or f"exit {result.exit_code}"
    out = []
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append({"rank": parts[0], "state": parts[1], "finished_at": parts[2]})
    return out


LOOK_SEP = "--sparkfleet-watch-look--"


@dataclass(frozen=True)
class Look:
    """One node at a glance: the holder line of its fleet lock ("" when free) and the lane's container
    ids, or why the node could not say."""

    lock: str = ""
    ids: list[str] | None = None
    error: str = ""


def look_command(profile: str, lock_path: str) -> str:
    """The node's fleet lock (runner/lock.py's file) and the lane's containers, in one round trip."""
    return (f"{read_file_command(lock_path)} 2>/dev/null; echo {LOOK_SEP}; "
            f"{lane_containers_command(profile)}")


def parse_look(result: Result) -> Look:
    lock, sep, rest = result.stdout.partition(LOOK_SEP + "\n")
    if not sep:
        return Look(error=result.message or result.stderr.strip() or f"exit {result.exit_code}")
    ids = parse_container_ids(replace(result, stdout=rest))
    if not isinstance(ids, list):
        return Look(lock.strip(), error=ids.message)
    return Look(lock.strip(), ids)
