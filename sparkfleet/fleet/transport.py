"""The one interface the controller uses to reach nodes; SSH and local transports implement it.

A transport runs a command on many nodes in parallel and returns one `Result` per node: a failure
on one node (unreachable, auth refused, host key refused, timeout, non-zero exit) is that node's
result with its cause, never an exception that loses the other nodes' results.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Literal, Protocol

from sparkfleet.schema.inventory import Node

# A CLI's pointer to its help, printed after the error it explains (docker: "See 'docker run --help'.")
USAGE_HINT = re.compile(r"^See '[^']+ --help'\.$")


def telling_line(*texts: str) -> str | None:
    """The line that says why a command failed: the last non-empty line of the first text that has one,
    a usage hint after it skipped (docker prints its error, then "See 'docker run --help'.")."""
    for text in texts:
        lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
        if lines:
            told = [ln for ln in lines if not USAGE_HINT.match(ln)]
            return (told or lines)[-1]
    return None


ErrorKind = Literal["unreachable", "auth", "hostkey-unknown", "hostkey-changed", "timeout", "exit", "error",
                    "not-run"]


@dataclass
class Result:
    node: str
    ok: bool
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    error: ErrorKind | None = None
    message: str = ""  # one line for people: what went wrong and what to do
    elapsed_s: float = 0.0
    extra: dict = field(default_factory=dict)


class Transport(Protocol):
    """Run commands on nodes; `put` copies bytes to a path on each node (mode applied).

    `run_each` is the one per-node form: a command (and stdin) of its own for each node, all at once;
    `run` is the same command everywhere. A transport subclasses this class and writes `run_each`; `run` is
    written here once, for all of them (test doubles that only have `run` use RunEachByRun instead)."""

    def run(self, nodes: list[Node], command: str, *, stdin: str | None = None,
            timeout_s: float = 60.0, env: dict[str, str] | None = None) -> dict[str, Result]:
        """Run `command` on every node at once (`run_each` with the same command and stdin for each)."""
        return self.run_each(nodes, {n.name: command for n in nodes},
                             stdin={n.name: stdin for n in nodes} if stdin else None, timeout_s=timeout_s, env=env)

    def run_each(self, nodes: list[Node], commands: Mapping[str, str], *,
                 stdin: Mapping[str, str] | None = None, timeout_s: float = 60.0,
                 env: dict[str, str] | None = None) -> dict[str, Result]:
        """`commands[node.name]` (and `stdin[node.name]`) on each of `nodes` that has a command."""
        ...

    def put(self, nodes: list[Node], data: bytes, remote_path: str, *, mode: int = 0o644) -> dict[str, Result]: ...

    def forward(self, node: Node, remote_port: int, remote_host: str = "127.0.0.1") -> AbstractContextManager[int]:
        """A local port reaching remote_host:remote_port as `node` sees it, for the block's duration."""
        ...

    def close(self) -> None: ...


class Forwards(Protocol):
    """What can open a local port forward to a node: a transport, or an executor (which, under --dry-run,
    shows the forward and yields None instead of a port)."""

    def forward(self, node: Node, remote_port: int,
                remote_host: str = "127.0.0.1") -> AbstractContextManager[int | None]: ...


class RunEachByRun:
    """`run_each` for a transport that only has `run` (test doubles): one `run` per distinct command and
    stdin, those in parallel."""

    def run_each(self, nodes: list[Node], commands: Mapping[str, str], *,
                 stdin: Mapping[str, str] | None = None, timeout_s: float = 60.0,
                 env: dict[str, str] | None = None) -> dict[str, Result]:
        groups: dict[tuple[str, str | None], list[Node]] = {}
        for n in nodes:
            if n.name in commands:
                groups.setdefault((commands[n.name], (stdin or {}).get(n.name)), []).append(n)
        out: dict[str, Result] = {}
        with ThreadPoolExecutor(max_workers=max(1, min(len(groups), 32))) as pool:
            futures = [pool.submit(self.run, members, cmd, stdin=data, timeout_s=timeout_s, env=env)  # type: ignore[attr-defined]
                       for (cmd, data), members in groups.items()]
            for f in futures:
                out.update(f.result())
        return {n.name: out[n.name] for n in nodes if n.name in out}


def fan_out(nodes: list[Node], one: Callable[[Node], Result], max_parallel: int) -> dict[str, Result]:
    """Run `one` for each distinct node in parallel threads, timing each: the one fan-out every transport
    (and the runner's per-node commands) shares. `one` turns its own failures into the node's Result."""
    unique = list({n.name: n for n in nodes}.values())
    if not unique:
        return {}

    def timed(node: Node) -> Result:
        start = time.monotonic()
        result = one(node)
        result.elapsed_s = time.monotonic() - start
        result.extra["ended_at"] = time.time()  # when the answer arrived here (facts: clock skew)
        return result

    with ThreadPoolExecutor(max_workers=min(len(unique), max_parallel)) as pool:
        return {r.node: r for r in pool.map(timed, unique)}
