"""A rank's launch on its node: the script the engine adapter rendered (its `docker run`) and its ready check.

The commands are the launch's own text (engines/base.py Launch.script and ready_check, the plan's goldens hold
them); what these operations add is how a node's answer is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.fleet.ops.base import Done, NodeError, Op, classify
from sparkfleet.fleet.transport import Result


@dataclass(frozen=True)
class StartRank(Op[str | NodeError]):
    """Start a rank: the launch's script. Its answer is the container's id, the last line `docker run -d`
    prints, or the container's name when it printed nothing."""

    script: str
    container: str
    changes = True

    def command(self) -> str:
        return self.script

    def parse(self, result: Result) -> str | NodeError:
        err = classify(result)
        if err is not None:
            return err
        out = result.stdout.strip()
        return out.splitlines()[-1] if out else self.container


@dataclass(frozen=True)
class ReadyCheck(Done):
    """The launch's own ready check, run on its node (e.g. a llama.cpp worker's rpc-server accepting)."""

    script: str

    def command(self) -> str:
        return self.script
