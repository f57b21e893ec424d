"""A node's facts: the node-side helper facts.py (fleet/nodeside/facts.py) run through its sha256 guard, its
one JSON line read as NodeFacts (fleet/nodefacts.py). The request (which paths, interfaces, patch files) is its
stdin; fleet/gather.py decides it and drives the run through fleet/ship.py (the ship where a node lacks it)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError

from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.fleet.ops.helper import RunHelper
from sparkfleet.fleet.transport import Result

HELPER = "facts.py"


def _failed(node: str, message: str, r: Result) -> Result:
    return Result(node=node, ok=False, stdout=r.stdout, stderr=r.stderr, exit_code=r.exit_code, error="error",
                  message=message, elapsed_s=r.elapsed_s)


def parse_facts(node: str, r: Result) -> NodeFacts | Result:
    """A helper's output as NodeFacts, or a failed Result saying what was wrong with it."""
    if not r.ok:
        return r
    text = r.stdout.strip()
    if not text:
        return _failed(node, f"{HELPER} on {node} printed nothing"
                       + (f" (stderr: {r.stderr.strip().splitlines()[-1]})" if r.stderr.strip() else ""), r)
    try:
        data = json.loads(text.splitlines()[-1])
    except ValueError as exc:
        return _failed(node, f"{HELPER} on {node} printed invalid JSON ({exc.msg} at char {exc.pos}): "
                       f"{text[:80]!r}", r)
    try:
        facts = NodeFacts.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"]) or "(document)"
        return _failed(node, f"{HELPER} on {node} printed facts that do not match this sparkfleet's schema: "
                       f"{where}: {e['msg']} ({exc.error_count()} error(s)); a helper from another version?", r)
    if facts.node != node:
        return _failed(node, f"{HELPER} on {node} answered for node {facts.node!r}", r)
    if isinstance(r.extra.get("ended_at"), float):
        facts.received_at = r.extra["ended_at"]
    return facts


@dataclass(frozen=True)
class Facts(RunHelper):
    """One node's facts (a read). Its answer is NodeFacts (`received_at` when the transport said when the
    answer came), or a failed Result saying what was wrong: the node, the helper's run, or what it printed."""

    name: str = HELPER

    def parse(self, result: Result) -> NodeFacts | Result:  # type: ignore[override]
        return parse_facts(result.node, super().parse(result))
