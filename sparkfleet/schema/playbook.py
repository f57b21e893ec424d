"""Playbooks: an ordered list of named steps. Unknown step names are refused when loading."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from sparkfleet.schema.base import Strict

# The one table of step names, with what each does: a playbook may name these and no other. The runner
# binds each to its implementation (runner/steps/__init__.py bind), in this order; the schema imports no
# runner, so the names live here.
STEPS: dict[str, str] = {
    "stop": "stop every container sparkfleet launched on the lane's nodes and wait until they are gone",
    "facts": "gather node facts, one round trip per node",
    "check": "preflight checks over the facts; any fail stops the run",
    "fabric_probe": "measure every pair of ranks over their fabric IPs (RTT, bandwidth); a link far off fails",
    "nccl": "an all-reduce across the ranks in the lane's image; fail when NCCL falls back to sockets",
    "patches": "verify the patch set on every rank; a missing file or wrong hash aborts",
    "engine_build": "verify every rank holds the pinned engine build (sparkfleet build); another one aborts",
    "drop_caches": "drop the page cache on every node",
    "probe": "load every rank's GPU and judge clock latch and slow state under load; a latched rank stops the run",
    "engram": "verify node-local Engram copies; report node-local or NFS per rank",
    "rail2_up": "add the rail-2 runtime IP aliases (never persisted)",
    "rail2_down": "remove the rail-2 runtime IP aliases",
    "pins": "check a restore point's pins against the fleet; refuse on drift",
    "launch": "start ranks (role: workers | head | all)",
    "wait_ready": "poll health and follow every rank's logs; fast-fail on a fatal line",
    "expect": "assert the profile's expectations (KV tokens, MoE backend, Engram, memory)",
    "gates": "answer gates against the endpoint",
    "record": "write the run record",
}


class Step(Strict):
    step: str
    role: Literal["workers", "head", "all"] | None = None
    args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _short(cls, data: Any) -> Any:
        # "- stop" and "- launch: {role: workers}" are both accepted
        if isinstance(data, str):
            return {"step": data}
        if isinstance(data, dict) and len(data) == 1 and "step" not in data:
            (name, body), = data.items()
            body = body or {}
            if not isinstance(body, dict):
                raise ValueError(f"step {name!r}: expected a mapping of arguments")
            return {"step": name, **body}
        return data

    @model_validator(mode="after")
    def _known(self) -> Step:
        if self.step not in STEPS:
            raise ValueError(f"unknown step {self.step!r}; known steps: {', '.join(STEPS)}")
        if self.step == "launch" and self.role is None:
            raise ValueError("launch needs role: workers, head or all")
        return self


class Playbook(Strict):
    name: str
    description: str = ""
    steps: list[Step] = Field(min_length=1)
