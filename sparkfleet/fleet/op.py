"""Node operations as data, and the one executor that runs them.

Code that needs a node does not run anything: it *yields* a `NodeCommands` (one command per node, plus
whether it changes the node) and receives each node's `Result` back, like pyinfra's operations that
yield commands. `Executor.drive` is the one place those commands are run, so dry-run is decided here
and nowhere else:

- `dry_run` off: every command runs.
- `dry_run` on (`--dry-run`): nothing runs and no connection is opened; each command is shown and the
  generator receives None, and says what it would have done.
- `dry_run` with `reads` (`--dry-run=facts`): read-only commands (`changes=False`) run, the others are
  shown.

A tunnel (`forward`) is decided here too: under --dry-run it is shown and not opened.

A command that depends on what a read would return (the stop step's container ids) is shown with a
named placeholder in angle brackets, e.g. `docker rm -f <ids of the lane's containers on reddie>`.

`executor_for` is the one way to get an Executor (and `open_transport` the one way to get the transport it
runs through): under --dry-run it is NoConnection, decided there and nowhere else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from sparkfleet.fleet.transport import Result, Transport
from sparkfleet.schema.inventory import Node

T = TypeVar("T")


@dataclass
class NodeCommands:
    """One command per node; all nodes at once, or node by node in the mapping's order when `serial`."""

    what: str  # for people: "stop the lane's containers"
    commands: dict[str, str]
    changes: bool = True  # False: a read-only query (run under --dry-run=facts)
    timeout_s: float = 120.0
    env: dict[str, str] | None = None  # set in the command's environment, never in its text
    serial: bool = False
    files: dict[str, dict[str, str | bytes]] = field(default_factory=dict)  # node -> path -> content, written first
    file_mode: int = 0o644
    stdin: dict[str, str] = field(default_factory=dict)  # node -> what the command reads on stdin
    # started and left running while the generator goes on (a server its later commands talk to): the reply
    # is a Pending, filled in when the commands end
    background: bool = False
    # names a value only a command that was not run would give (a placeholder): shown, never run under --dry-run
    placeholders: bool = False


class Pending(dict[str, Result]):
    """The reply to a background NodeCommands: empty until its commands end; `wait` for them. What running
    them raised (a transport's bug) is kept in `error`, for the waiter to raise or report."""

    def __init__(self) -> None:
        super().__init__()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once every node's command ended (its Result is in), False after `timeout_s` (None: no limit)."""
        return self.done.wait(timeout_s)


Reply = dict[str, Result] | None
OpGen = Generator[NodeCommands, Reply, T]


def query(what: str, commands: dict[str, str], timeout_s: float = 60.0,
          stdin: dict[str, str] | None = None) -> NodeCommands:
    """A read-only NodeCommands (it changes nothing on the node)."""
    return NodeCommands(what, commands, changes=False, timeout_s=timeout_s, stdin=stdin or {})


def placeholder(what: str) -> str:
    """The named stand-in for a value only a read would give (shown under --dry-run)."""
    return f"<{what}>"


def shown_as(emit: Callable[..., None]) -> Callable[[NodeCommands], None]:
    """How a command that is not run is shown: one `would` event per node (and per file it would write),
    through `emit(event, **fields)` (the run's events, or a verb's printer)."""

    def show(op: NodeCommands) -> None:
        for node, command in op.commands.items():
            for path, content in op.files.get(node, {}).items():
                text = content if isinstance(content, str) else f"<{len(content)} bytes>"
                emit("would", what=op.what, node=node, write=path, content=text)
            emit("would", what=op.what, node=node, command=command, **({"env": sorted(op.env)} if op.env else {}),
                 **({"stdin": op.stdin[node]} if node in op.stdin else {}))

    return show


class DryRunLeak(RuntimeError):
    """Something tried to reach a node under --dry-run without going through the executor: a bug."""


class NoConnection:
    """The transport under --dry-run: nothing may reach a node, so any use is a bug, said loudly."""

    def _refuse(self, what: str) -> Any:
        raise DryRunLeak(f"--dry-run: {what} was called outside the executor (sparkfleet/fleet/op.py); "
                         "nothing was run on any node")

    def run(self, nodes, command, **kw):  # noqa: ANN001, ANN003 - same signature as Transport.run
        return self._refuse("transport.run")

    def run_each(self, nodes, commands, **kw):  # noqa: ANN001, ANN003
        return self._refuse("transport.run_each")

    def put(self, nodes, data, remote_path, **kw):  # noqa: ANN001, ANN003
        return self._refuse("transport.put")

    def forward(self, node, remote_port, remote_host="127.0.0.1"):  # noqa: ANN001
        return self._refuse("transport.forward")

    def close(self) -> None:
        """Nothing was opened."""


@dataclass
class Executor:
    """Runs NodeCommands on nodes through a transport, under one dry-run rule (see the module docstring)."""

    transport: Transport
    nodes: Mapping[str, Node]
    dry_run: bool = False
    reads: bool = False  # --dry-run=facts: read-only commands run under dry-run
    show: Callable[[NodeCommands], None] | None = None  # how a command that is not run is shown
    on_run: Callable[[NodeCommands], None] | None = None  # told each command as it runs (-v shows them)

    def skips(self, op: NodeCommands) -> bool:
        return self.dry_run and (op.changes or op.placeholders or not self.reads)

    def run(self, op: NodeCommands) -> Reply:
        """Run one NodeCommands now (or show it and return None): files first, and a node whose file
        could not be written runs nothing."""
        if self.skips(op):
            if self.show is not None:
                self.show(op)
            return None
        if self.on_run is not None:
            self.on_run(op)
        if op.background:
            pending = Pending()

            def run() -> None:
                try:
                    pending.update(self._run(op))
                except BaseException as exc:  # noqa: BLE001 - kept for the waiter, in its own thread
                    pending.error = exc
                finally:
                    pending.done.set()

            threading.Thread(target=run, name=f"sparkfleet {op.what}", daemon=True).start()
            return pending
        return self._run(op)

    def _run(self, op: NodeCommands) -> dict[str, Result]:
        results: dict[str, Result] = {}
        for node, files in op.files.items():
            for path, content in files.items():
                data = content.encode() if isinstance(content, str) else content
                res = self.transport.put([self.nodes[node]], data, path, mode=op.file_mode)[node]
                if not res.ok:
                    results[node] = res
                    break
        todo = {n: c for n, c in op.commands.items() if n not in results}
        groups = [{n: c} for n, c in todo.items()] if op.serial else [todo]
        for group in groups:
            if group:
                results.update(self.transport.run_each([self.nodes[n] for n in group], group, stdin=op.stdin,
                                                       timeout_s=op.timeout_s, env=op.env))
        return results

    @contextmanager
    def forward(self, node: Node, remote_port: int, remote_host: str = "127.0.0.1") -> Iterator[int | None]:
        """A local port reaching remote_host:remote_port as `node` sees it (the transport's forward, e.g. to a
        head whose API is bound to loopback), for the block's duration. Under --dry-run (also =facts: a tunnel
        is for a lane the dry run never starts) it is shown, as `ssh -L` would open it, and the block gets None."""
        if self.dry_run:
            if self.show is not None:
                self.show(NodeCommands(f"forward a local port to {remote_host}:{remote_port} on {node.name}", {
                    node.name: f"ssh -N -L {placeholder('a free local port')}:{remote_host}:{remote_port} {node.name}"},
                    changes=False))
            yield None
            return
        with self.transport.forward(node, remote_port, remote_host) as local:
            yield local

    def drive(self, gen: OpGen[T]) -> T:
        """Run a generator's NodeCommands as it yields them; what it returns. What a command raises (a
        transport's error, Ctrl-C) is raised inside the generator, so its `finally` can still yield its cleanup
        (the fabric probe's quit) before the error goes on."""
        try:
            op = next(gen)
            while True:
                try:
                    reply = self.run(op)
                except BaseException as exc:  # noqa: B036 - handed to the generator, which raises it again
                    op = gen.throw(exc)
                    continue
                op = gen.send(reply)
        except StopIteration as done:
            return done.value


def open_transport(nodes: Iterable[Node], *, dry_run: bool = False, reads: bool = False,
                   wait_once: bool = False) -> Transport:
    """The transport an executor of these nodes runs through: under --dry-run (not =facts) NoConnection, so
    nothing reaches a node and no connection is opened; else `transport_for` (fleet/connect.py, with its
    `wait_once`). The caller closes it."""
    if dry_run and not reads:
        return NoConnection()  # any use of it is a bug, said loudly
    # here, not at the top: the transports bring paramiko (a half second of every verb's start-up), and
    # fleet/connect.py is looked up when called, so a test's stand-in for transport_for is the one used
    from sparkfleet.fleet.connect import transport_for

    listed = list(nodes)  # wait_once passed only when asked: the tests' stand-ins take the nodes alone
    return transport_for(listed, wait_once=True) if wait_once else transport_for(listed)


def executor_for(nodes: Mapping[str, Node] | Iterable[Node], *, transport: Transport | None = None,
                 dry_run: bool = False, reads: bool = False, wait_once: bool = False,
                 show: Callable[[NodeCommands], None] | None = None,
                 on_run: Callable[[NodeCommands], None] | None = None) -> Executor:
    """The one way to get an Executor: for these nodes (by name, or a list), under this dry-run (`reads`:
    --dry-run=facts), through `transport` when the caller holds one, else through `open_transport`'s (the
    caller closes `ex.transport`). `show` and `on_run` as Executor takes them."""
    by_name = dict(nodes) if isinstance(nodes, Mapping) else {n.name: n for n in nodes}
    if transport is None:
        transport = open_transport(by_name.values(), dry_run=dry_run, reads=reads, wait_once=wait_once)
    return Executor(transport, by_name, dry_run=dry_run, reads=reads, show=show, on_run=on_run)


def run_ops(transport: Transport, nodes: list[Node], gen: OpGen[T]) -> T:
    """Drive `gen` now, no dry-run (for commands that only read or that the user asked to change)."""
    return executor_for(nodes, transport=transport).drive(gen)


def run_commands(transport: Transport, nodes: list[Node], op: NodeCommands) -> dict[str, Result]:
    """One NodeCommands run now through the executor, no dry-run (a verb's reads: logs, bundle, watch)."""
    reply = executor_for(nodes, transport=transport).run(op)
    assert reply is not None  # no dry run here
    return reply


def while_running(gen: OpGen[T], every_s: float, tick: Callable[[], OpGen[None]] | None = None) -> OpGen[T]:
    """`gen`, each of its commands left running (background) while `tick`'s commands run every `every_s`
    seconds beside it (a long copy's progress, read from its status file): the executor runs both, so the
    caller needs no thread of its own. What a command raised, or Ctrl-C while waiting, is raised inside `gen`,
    as `Executor.drive` does; under --dry-run the commands are shown and `tick` never runs."""
    try:
        op = next(gen)
        while True:
            try:
                reply = yield replace(op, background=True)
                if isinstance(reply, Pending):  # None: shown, not run
                    while not reply.wait(every_s):
                        if tick is not None:
                            yield from tick()
                    if reply.error is not None:
                        raise reply.error
                    reply = dict(reply)
            except GeneratorExit:  # closed while suspended: so is `gen`
                gen.close()
                raise
            except BaseException as exc:  # noqa: B036 - handed to the generator, which raises it again
                op = gen.throw(exc)
                continue
            op = gen.send(reply)
    except StopIteration as done:
        return done.value
