"""Ship node-side helpers on demand and run them: one round trip per node in the steady state.

The command sent to a node is a small `python3 -c` guard: it reads ~/.cache/sparkfleet/bin/<name>,
checks its sha256 against this sparkfleet's copy and, if it matches, runs exactly the bytes it
hashed (no window between check and run). If the file is missing or different it exits with
MISSING (97) plus a marker on stderr; only those nodes get the helper
(Transport.put, mode 0755) and are run again. A node that still differs after shipping fails.
The three commands are operations (fleet/ops/helper.py: RunHelper, ShipHelper, InlineHelper); this
module drives them.
"""

from __future__ import annotations

from collections.abc import Iterable

from sparkfleet.fleet.op import OpGen, run_ops
from sparkfleet.fleet.ops.base import on
from sparkfleet.fleet.ops.helper import (
    MARKER,
    MISSING,
    SHIP_MODE,
    InlineHelper,
    RunHelper,
    ShipHelper,
    guard_command,
    helper_bytes,
    helper_sha256,
    inline_command,
    is_missing,
    remote_path,
)
from sparkfleet.fleet.transport import Result, Transport
from sparkfleet.schema.inventory import Node

__all__ = ["MARKER", "MISSING", "ensure_helper", "guard_command", "helper_bytes", "helper_ops", "helper_sha256",
           "inline_command", "is_missing", "remote_path", "run_helper"]


def _still_differs(node: str, name: str) -> Result:
    return Result(node=node, ok=False, exit_code=MISSING, error="error",
                  message=f"{remote_path(name)} on {node} still differs from this sparkfleet's copy after "
                  f"shipping it (sha256 {helper_sha256(name)[:12]}); is ~/.cache writable and not full?")


def helper_ops(helper: str | RunHelper, nodes: list[Node], stdin_by_node: dict[str, str] | None = None,
               timeout_s: float = 30.0, *, run: bool = True, changes: bool = False) -> OpGen[dict[str, Result]]:
    """Run (or with `run=False` only verify) this sparkfleet's copy of a helper on every node (its name, or the
    operation: a `RunHelper`, whose `run` and `writes` then stand), shipping it first only where it is missing or
    differs; each node's Result (verify only: message 'current' or 'shipped'), as `RunHelper.parse` reads it.

    Steady state: one read-only round trip per node. A node whose copy is missing or changed answers 97;
    the helper is written there and run again (that node only). Under --dry-run nothing is shipped: the
    nodes that would need it fail, saying so (verify only: they answer 'would ship', so the caller goes on to
    show what it would run there). `changes`: the helper's run writes on the node (a copy), so it is not run
    under --dry-run=facts either."""
    op = helper if isinstance(helper, RunHelper) else RunHelper(helper, run=run, writes=changes)
    name, run, changes = op.name, op.run, op.writes
    stdin = dict(stdin_by_node or {})
    results = yield on(f"run {name}" if run else f"verify {name}", {n.name: op for n in nodes}, timeout_s,
                       stdin=stdin)
    if results is None:
        return {}
    stale = [n for n in nodes if op.missing(results[n.name])]
    if stale:
        ship = ShipHelper(name, run=run)
        again = yield on(f"ship {name}" + (" and run it" if run else ""), {n.name: ship for n in stale}, timeout_s,
                         stdin=stdin, file_mode=SHIP_MODE, files={n.name: ship.files() for n in stale})
        if again is None and run and not changes:  # --dry-run=facts: the same bytes run inline
            inline = InlineHelper(name)
            again = yield on(f"run {name} inline (a dry run ships nothing)", {n.name: inline for n in stale},
                             timeout_s, stdin=stdin)
        for n in stale:
            if again is None and not run:  # --dry-run=facts: the ship was shown; what comes next is shown too
                results[n.name] = Result(n.name, True, message="would ship")
            elif again is None:
                results[n.name] = Result(n.name, False, exit_code=MISSING, error="error",
                                         message=f"{remote_path(name)} on {n.name} is missing or differs from this "
                                         "sparkfleet's copy, and a dry run ships nothing")
            elif op.missing(again[n.name]):
                results[n.name] = _still_differs(n.name, name)
            else:
                results[n.name] = again[n.name]
                if not run and again[n.name].ok:
                    results[n.name] = Result(n.name, True, message="shipped", elapsed_s=again[n.name].elapsed_s)
    out = {}
    for n in nodes:
        r = results[n.name]
        if not run and r.ok and not r.message:
            r = Result(n.name, True, message="current", elapsed_s=r.elapsed_s)
        out[n.name] = RunHelper.parse(op, r)
    return out


def ensure_helper(transport: Transport, nodes: Iterable[Node], name: str = "facts.py") -> dict[str, Result]:
    """Make sure every node holds this sparkfleet's copy of `name`; ok Results say 'current' or 'shipped'."""
    nodes = list(nodes)
    return run_ops(transport, nodes, helper_ops(name, nodes, run=False))


def run_helper(transport: Transport, nodes: Iterable[Node], name: str,
               stdin_by_node: dict[str, str] | None = None, timeout_s: float = 30.0,
               changes: bool = False) -> dict[str, Result]:
    """Run `python3 ~/.cache/sparkfleet/bin/<name>` on every node now (helper_ops through the executor)."""
    nodes = list(nodes)
    return run_ops(transport, nodes, helper_ops(name, nodes, stdin_by_node, timeout_s, changes=changes))
