"""The clock probe on a node (`check --probe`, up's probe step): the node's GPU loaded by `load` (a shell
command line, checks/clock.py load_for: the matmul in the lane's image, or the user's) while the sampler
(fleet/nodeside/clock_probe.py) reads nvidia-smi's clocks; its answer is the sampler's JSON document, which
checks/probe.py judges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from sparkfleet.fleet.nodeside.clock_probe import PROBE_MAX_S, parse_output, probe_command
from sparkfleet.fleet.ops.base import Op, classify
from sparkfleet.fleet.transport import Result


@dataclass(frozen=True)
class ClockProbe(Op[dict[str, Any]]):
    """Load the node's GPU and sample its clock (it starts a container: a change, never run under
    --dry-run=facts). Its answer: the probe's run, or {"error": why} when the probe did not run or report."""

    load: str
    changes = True
    timeout_s: ClassVar[float] = PROBE_MAX_S + 30  # the sampler kills a load that runs PROBE_MAX_S, then reports

    def command(self) -> str:
        return probe_command(self.load)

    def parse(self, result: Result) -> dict[str, Any]:
        err = classify(result)
        return parse_output(result.stdout) if err is None else {"error": err.message}
