"""How steps touch nodes: a step yields the NodeCommands it wants run (sparkfleet/fleet/op.py) and the
run's one executor runs them, or, under --dry-run, shows exactly those commands and runs nothing (with
--dry-run=facts, only read-only ones run).

A step is either a plain function returning a StepResult, or a generator that yields NodeCommands,
receives each one's results (None for commands not run under --dry-run) and returns its StepResult.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkfleet.findings import Finding
from sparkfleet.fleet.op import NodeCommands, Reply, query

if TYPE_CHECKING:
    from sparkfleet.runner.context import RunContext
    from sparkfleet.spec.playbook import Step

__all__ = ["NodeCommands", "Reply", "StepFn", "StepGen", "StepResult", "drive", "query", "run_now"]


@dataclass
class StepResult:
    status: str  # ok | warn | fail | skip
    summary: str
    findings: list[Finding] = field(default_factory=list)
    data: dict = field(default_factory=dict)


StepGen = Generator[NodeCommands, Reply, StepResult]
StepFn = Callable[["RunContext", "Step"], StepResult | StepGen]


def drive(ctx: RunContext, out: StepResult | StepGen) -> StepResult:
    """Run a step's node commands as it yields them; the step's StepResult when it returns."""
    if isinstance(out, StepResult):
        return out
    return ctx.executor.drive(out)


def run_now(ctx: RunContext, op: NodeCommands) -> Reply:
    """One NodeCommands outside a step (Ctrl-C cleanup, the lock), under the same dry-run rule."""
    return ctx.executor.run(op)
