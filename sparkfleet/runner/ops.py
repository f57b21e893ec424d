"""How steps touch nodes: a step yields the commands it wants run per node; the runner runs them, or,
under --dry-run, prints exactly those commands and runs nothing that changes a node. This is the one
place dry-run is decided for node commands.

A step is either a plain function returning a StepResult, or a generator that yields NodeCommands,
receives each one's results (None under --dry-run for commands that change nodes) and returns its
StepResult.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkfleet.findings import Finding
from sparkfleet.fleet.transport import Result

if TYPE_CHECKING:
    from sparkfleet.runner.context import RunContext
    from sparkfleet.spec.playbook import Step


@dataclass
class StepResult:
    status: str  # ok | warn | fail | skip
    summary: str
    findings: list[Finding] = field(default_factory=list)
    data: dict = field(default_factory=dict)


@dataclass
class NodeCommands:
    """One command per node; all nodes at once, or node by node in the mapping's order when `serial`."""

    what: str  # for people: "stop the lane's containers"
    commands: dict[str, str]
    changes: bool = True  # False: a read-only query, run under --dry-run too
    timeout_s: float = 120.0
    env: dict[str, str] | None = None  # set in the command's environment, never in its text
    serial: bool = False
    files: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> path -> content, written first


Reply = dict[str, Result] | None
StepGen = Generator[NodeCommands, Reply, StepResult]
StepFn = Callable[["RunContext", "Step"], StepResult | StepGen]


def query(what: str, commands: dict[str, str], timeout_s: float = 60.0) -> NodeCommands:
    return NodeCommands(what, commands, changes=False, timeout_s=timeout_s)


def execute(ctx: RunContext, op: NodeCommands) -> dict[str, Result]:
    """Run one NodeCommands now: files first (a node whose file could not be written runs nothing)."""
    results: dict[str, Result] = {}
    for node, files in op.files.items():
        for path, content in files.items():
            res = ctx.transport.put([ctx.node(node)], content.encode(), path)[node]
            if not res.ok:
                results[node] = res
                break
    todo = {n: c for n, c in op.commands.items() if n not in results}
    if op.serial:
        for n, c in todo.items():
            results.update(ctx.run_each({n: c}, timeout_s=op.timeout_s, env=op.env))
    else:
        results.update(ctx.run_each(todo, timeout_s=op.timeout_s, env=op.env))
    return results


def show(ctx: RunContext, op: NodeCommands) -> None:
    """Under --dry-run: say exactly what would run where (and what would be written)."""
    for node, command in op.commands.items():
        for path, content in op.files.get(node, {}).items():
            ctx.events.emit("would", what=op.what, node=node, write=path, content=content)
        ctx.events.emit("would", what=op.what, node=node, command=command,
                        **({"env": sorted(op.env)} if op.env else {}))


def drive(ctx: RunContext, out: StepResult | StepGen) -> StepResult:
    """Run a step's node commands as it yields them; the step's StepResult when it returns."""
    if isinstance(out, StepResult):
        return out
    try:
        op = next(out)
        while True:
            if ctx.options.dry_run and op.changes:
                show(ctx, op)
                reply: Reply = None
            else:
                reply = execute(ctx, op)
            op = out.send(reply)
    except StopIteration as done:
        return done.value


def run_now(ctx: RunContext, op: NodeCommands) -> Reply:
    """One NodeCommands outside a step (Ctrl-C cleanup, the gates step), under the same dry-run rule."""
    if ctx.options.dry_run and op.changes:
        show(ctx, op)
        return None
    return execute(ctx, op)
