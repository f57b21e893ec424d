"""The one way to get an executor (fleet/op.py's executor_for, open_transport) and its background commands
(while_running): unit tests on stand-in transports, no node and no lab (issue 41 §3)."""

from __future__ import annotations

import threading

import pytest

import sparkfleet.fleet.connect as connect
from sparkfleet.fleet.op import NoConnection, OpGen, executor_for, open_transport, query, while_running
from sparkfleet.fleet.transport import Result, RunEachByRun
from sparkfleet.schema.inventory import Node, Ssh, Storage

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


def node(name: str) -> Node:
    return Node(name=name, ssh=Ssh(host="127.0.0.1"), hardware="gb10",
                storage=Storage(model_root="/models", cache_dir="/cache"), transport="local")


NODES = [node("a"), node("b")]


class Answers(RunEachByRun):
    """Every command answers ok with its own text; `release` holds the commands named 'slow' back."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.release = threading.Event()

    def run(self, nodes, command, *, stdin=None, timeout_s=60.0, env=None):  # noqa: ANN001 - Transport.run
        self.ran.append(command)
        if command == "slow":
            self.release.wait(10)
        return {n.name: Result(n.name, True, stdout=command) for n in nodes}

    def put(self, nodes, data, remote_path, *, mode=0o644):  # noqa: ANN001
        return {n.name: Result(n.name, True) for n in nodes}

    def close(self) -> None:
        pass


class Raises(Answers):
    def run(self, nodes, command, *, stdin=None, timeout_s=60.0, env=None):  # noqa: ANN001
        if command == "slow":
            raise RuntimeError("transport bug")
        return super().run(nodes, command, stdin=stdin, timeout_s=timeout_s, env=env)


def test_dry_run_opens_no_connection_and_facts_reads_open_one(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[list[str]] = []
    monkeypatch.setattr(connect, "transport_for", lambda nodes: opened.append([n.name for n in nodes]) or Answers())
    dry = executor_for(NODES, dry_run=True)
    assert isinstance(dry.transport, NoConnection) and dry.dry_run and opened == []
    reads = executor_for({n.name: n for n in NODES}, dry_run=True, reads=True)
    assert isinstance(reads.transport, Answers) and reads.reads and opened == [["a", "b"]]
    held = Answers()
    assert executor_for(NODES, transport=held).transport is held and len(opened) == 1  # the caller's: no other
    assert isinstance(open_transport(NODES, dry_run=True, reads=False), NoConnection)


def test_a_run_s_transport_is_asked_to_wait_once(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[dict] = []
    monkeypatch.setattr(connect, "transport_for", lambda nodes, **kw: asked.append(kw) or Answers())
    open_transport(NODES, wait_once=True)
    open_transport(NODES)
    assert asked == [{"wait_once": True}, {}]


def copy_then_read() -> OpGen[list[str]]:
    """A long command, then a short one: what each answered on node a."""
    first = yield query("the long one", {n.name: "slow" for n in NODES})
    second = yield query("the short one", {n.name: "quick" for n in NODES})
    return [r["a"].stdout if r else "shown" for r in (first, second)]


def test_while_running_reads_beside_a_command_left_running() -> None:
    transport = Answers()
    ticks: list[str] = []

    def tick() -> OpGen[None]:
        got = yield query("progress", {"a": "progress"})
        ticks.append(got["a"].stdout if got else "shown")
        transport.release.set()  # the long command ends once a progress read was made beside it

    assert executor_for(NODES, transport=transport).drive(while_running(copy_then_read(), 0.01, tick)) == [
        "slow", "quick"]
    assert ticks and ticks[0] == "progress" and transport.ran.index("progress") < transport.ran.index("quick")


def test_what_a_background_command_raised_is_raised_inside_the_generator() -> None:
    seen: list[BaseException] = []

    def gen() -> OpGen[None]:
        try:
            yield query("the long one", {"a": "slow"})
        except RuntimeError as exc:
            seen.append(exc)
            raise

    with pytest.raises(RuntimeError, match="transport bug"):
        executor_for(NODES, transport=Raises()).drive(while_running(gen(), 0.01))
    assert [str(e) for e in seen] == ["transport bug"]


def test_under_dry_run_the_commands_are_shown_and_nothing_ticks() -> None:
    shown: list[str] = []

    def tick() -> OpGen[None]:
        raise AssertionError("a progress read under --dry-run")
        yield

    ex = executor_for(NODES, dry_run=True, show=lambda op: shown.append(op.what))
    assert ex.drive(while_running(copy_then_read(), 0.01, tick)) == ["shown", "shown"]
    assert shown == ["the long one", "the short one"]
