"""The stop step's order (playbooks/down.yaml `order: head-first`, watch's memory stop): the head's node is
asked first and alone, the workers after it, each node's command returning before the next is sent; without
the order every node at once. Driven as the executor drives a step: each node command it yields, answered.

The lab cannot witness this order by dockerd's FinishedAt: a worker whose head is gone may exit on its own
before the stopped head has finished exiting (seen on the real daemon, CI 2026-12-05)."""

from __future__ import annotations

from types import SimpleNamespace

from sparkfleet.fleet.op import NodeCommands
from sparkfleet.fleet.transport import Result
from sparkfleet.runner.steps import stop
from sparkfleet.schema.playbook import Step

NODES = ["asusi", "bluey", "reddie", "spark4"]  # the inventory's order: the head (reddie) is not first
RANKS = {"reddie": 0, "asusi": 1, "bluey": 2, "spark4": 3}
IDS = {n: f"{i:064x}" for i, n in enumerate(NODES, 1)}


def ctx() -> SimpleNamespace:
    nodes = [SimpleNamespace(name=n) for n in NODES]
    return SimpleNamespace(
        profile=SimpleNamespace(name="dcp2"), nodes=nodes, inventory=SimpleNamespace(launcher="ssh"),
        plan=SimpleNamespace(ranks=[SimpleNamespace(node=SimpleNamespace(name=n), rank=r) for n, r in RANKS.items()]),
        options=SimpleNamespace(keep=True, stop_timeout_s=5.0))


def drive(order: str | None) -> tuple[list[NodeCommands], object]:
    """Run the step, answering: every node lists its container, every stop works, then none is left."""
    gen = stop.stop(ctx(), Step(step="stop", args={"order": order} if order else {}))
    sent: list[NodeCommands] = []
    reply = None
    try:
        while True:
            cmds = gen.send(reply)
            sent.append(cmds)
            listing = cmds.commands[next(iter(cmds.commands))].startswith("docker ps")
            left = len([c for c in sent if c.commands[next(iter(c.commands))].startswith("docker ps")]) > 1
            reply = {n: Result(n, True, "" if listing and left else IDS[n] + "\n") for n in cmds.commands}
    except StopIteration as done:
        return sent, done.value


def test_head_first_stops_the_head_alone_then_the_workers_one_by_one() -> None:
    sent, result = drive("head-first")
    stops = [c for c in sent if not c.commands[next(iter(c.commands))].startswith("docker ps")]
    assert len(stops) == 1 and stops[0].serial  # the executor runs a serial mapping node by node, in order
    assert list(stops[0].commands.items()) == [(n, f"docker stop {IDS[n]}") for n in ("reddie", "asusi", "bluey",
                                                                                        "spark4")]
    assert result.status == "ok" and list(result.data["stopped"]) == ["reddie", "asusi", "bluey", "spark4"]


def test_without_an_order_every_node_is_stopped_at_once() -> None:
    sent, result = drive(None)
    stops = [c for c in sent if not c.commands[next(iter(c.commands))].startswith("docker ps")]
    assert len(stops) == 1 and not stops[0].serial and result.status == "ok"
