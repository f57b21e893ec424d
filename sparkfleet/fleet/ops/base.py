"""What every node operation is, and what went wrong on a node.

An operation is one object (pyinfra's facts: `pyinfra/facts/server.py`, `Sysctl.command()` builds the
shell line, `Sysctl.process(output)` turns the output into data): its fields are what it needs,
`command()` is the exact shell line run on the node, `parse(result)` a pure reading of the node's
`Result` (stdout, stderr, exit code) into data or a `NodeError`, and `changes` says whether it writes
(a read runs under `--dry-run=facts`). Nothing here does I/O: callers put the commands in a
`NodeCommands` (`on(...)`), the one executor (fleet/op.py) runs them, and the results come back to
`parse`. The command is a shell line run by a transport, so an operation meant for the controller (a
scheduler's submit or queue) has the same shape, run by the local transport.

A failed command is classified by what the real tools print:
- A docker CLI without its daemon: `Cannot connect to the Docker daemon at unix:///var/run/docker.sock.
  Is the docker daemon running?`; without access to the socket: `permission denied while trying to
  connect to the Docker daemon socket at unix:///var/run/docker.sock ...`
  (https://docs.docker.com/engine/install/linux-postinstall/).
- A missing binary: the shell's `docker: command not found` (bash) or `docker: not found` (dash), exit 127
  (POSIX: "If a command is not found, the exit status shall be 127").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from sparkfleet.findings import Finding
from sparkfleet.fleet.op import NodeCommands
from sparkfleet.fleet.transport import Result, telling_line

T = TypeVar("T")


class Op(Generic[T]):
    """One node operation: `command()` to run, `parse(result)` of what it printed (pure)."""

    changes: ClassVar[bool] = False  # True: it writes on the node (not run under --dry-run=facts)

    def command(self) -> str:
        raise NotImplementedError

    def parse(self, result: Result) -> T:
        raise NotImplementedError


def on(what: str, ops: Mapping[str, Op], timeout_s: float, serial: bool = False, *,
       env: dict[str, str] | None = None, files: Mapping[str, Mapping[str, str | bytes]] | None = None,
       file_mode: int = 0o644, stdin: Mapping[str, str] | None = None, background: bool = False) -> NodeCommands:
    """One NodeCommands of per-node operations (node -> operation, run in the mapping's order when
    `serial`); it changes the nodes when any of them does, so a read stays a read under --dry-run=facts.
    `env`, `files`, `file_mode`, `stdin` and `background` as NodeCommands takes them."""
    return NodeCommands(what, {n: op.command() for n, op in ops.items()},
                        changes=any(op.changes for op in ops.values()), timeout_s=timeout_s, serial=serial,
                        env=env, files={n: dict(f) for n, f in (files or {}).items()}, file_mode=file_mode,
                        stdin=dict(stdin or {}), background=background)


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
    last = telling_line(text) or f"exit {result.exit_code}"
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


class Done(Op[NodeError | None]):
    """An operation whose only answer is whether it worked (None) or what failed (a NodeError)."""

    def parse(self, result: Result) -> NodeError | None:
        return classify(result)
