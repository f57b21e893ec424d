"""The node's kernel: dropping the page cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkfleet.fleet.op import run_commands
from sparkfleet.fleet.ops.base import Op, on
from sparkfleet.fleet.transport import Result
from sparkfleet.schema.inventory import Node


@dataclass(frozen=True)
class DropCaches(Op[bool | str | None]):
    """Drop the page cache. `sysctl -w` rather than a redirect into /proc: it is an ordinary command, so
    the simulated lab's shim can stand in for it, and it needs root exactly as the seeds' launcher had
    (LCH-03)."""

    changes = True
    timeout_s = 120.0  # sync flushes dirty pages first, which can take a while on a busy node

    def command(self) -> str:
        return "sync && sysctl -q -w vm.drop_caches=3"

    def parse(self, result: Result) -> bool | str | None:
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
    op = DropCaches()
    results = run_commands(transport, nodes, on("drop the page cache", {n.name: op for n in nodes}, op.timeout_s))
    done = {name: op.parse(r) for name, r in results.items()}
    return {k: v for k, v in done.items() if v is not None}
