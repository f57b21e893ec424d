"""One rank's NCCL all-reduce in the lane's image (`check --nccl`, up's nccl step): the `docker run --rm` that
fleet/nccl.py renders from the lane's launch, and what NCCL printed, read as checks/nccl.py reads it."""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.checks.nccl import Transport, transcript
from sparkfleet.fleet.ops.base import Op
from sparkfleet.fleet.transport import Result


@dataclass(frozen=True)
class AllReduceRank(Op[Transport]):
    """Run one rank's all-reduce (its command, rendered by fleet/nccl.py commands; it starts a container).
    Its answer: the transport NCCL chose and the script's result line, from stdout and stderr together."""

    script: str
    changes = True

    def command(self) -> str:
        return self.script

    def parse(self, result: Result) -> Transport:
        return transcript(result)
