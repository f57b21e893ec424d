"""Files on a node."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sparkfleet.fleet.ops.base import NodeError, Op, classify
from sparkfleet.fleet.transport import Result


@dataclass(frozen=True)
class ReadFile(Op[str | NodeError]):
    """A file's text (`cat`)."""

    path: str

    def command(self) -> str:
        return f"cat {shlex.quote(self.path)}"

    def parse(self, result: Result) -> str | NodeError:
        return classify(result) or result.stdout
