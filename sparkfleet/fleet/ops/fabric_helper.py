"""The fabric probe's helper (fleet/nodeside/fabric_probe.py) on a node: one request on its stdin (serve, drive
or quit), run through the helper's sha256 guard (fleet/fabric_measure.py verifies or ships the helper first, and
builds the requests from the lane's fabric IPs). The helper prints one JSON line last."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sparkfleet.fleet.ops.base import Op
from sparkfleet.fleet.ops.helper import guard_command
from sparkfleet.fleet.transport import Result

HELPER = "fabric_probe.py"


def answer(r: Result) -> dict[str, Any] | None:
    """The helper's last line as a JSON object; None when it failed or printed none."""
    if not r.ok:
        return None
    try:
        doc = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return doc if isinstance(doc, dict) else None


def why(r: Result) -> str:
    """Why a run gave no answer, in one line."""
    return r.message or (r.stderr.strip().splitlines() or [f"exit {r.exit_code}"])[-1]


@dataclass(frozen=True)
class FabricProbe(Op[dict[str, Any] | str]):
    """One request to the probe helper on a node: a server on its fabric IP (`serve`, left running until
    `quit`), the measurement of one link driven from its lower rank (`drive`), or the servers' `quit`. Each
    opens sockets on the fabric, so none runs under --dry-run=facts. Its answer: the helper's JSON object, or why
    there is none."""

    request: dict[str, Any]
    changes = True

    def stdin(self) -> str:
        return json.dumps(self.request)

    def command(self) -> str:
        return guard_command(HELPER)

    def parse(self, result: Result) -> dict[str, Any] | str:
        doc = answer(result)
        return doc if doc is not None else why(result)
