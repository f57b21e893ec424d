"""The playbook steps, by name: the one registry (a playbook's `step:` names one of these).

A step is a thin decision over node operations (sparkfleet/fleet/ops/): it yields the commands it
wants run per node (runner/ops.py runs them, or shows them under --dry-run) and returns a StepResult. A
step that fails stops the run; once ranks have started, the runner stops every rank of this launch before
it gives up (and keeps their last log lines in the record). DRY names what a step that needs the live lane
would do, said under --dry-run instead of running it.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkfleet.runner.context import RunContext
from sparkfleet.runner.ops import StepFn
from sparkfleet.runner.steps import build, finish, launch, preflight, prepare, stop
from sparkfleet.schema.playbook import Step

STEPS: dict[str, StepFn] = {
    "stop": stop.stop,
    "facts": preflight.facts,
    "check": preflight.check,
    "probe": preflight.probe,
    "fabric_probe": preflight.fabric_probe,
    "nccl": preflight.nccl,
    "patches": prepare.patches,
    "engine_build": build.engine_build,
    "drop_caches": prepare.drop_caches,
    "engram": prepare.engram,
    "rail2_up": prepare.rail2_up,
    "rail2_down": prepare.rail2_down,
    "pins": prepare.pins,
    "launch": launch.launch,
    "wait_ready": launch.wait_ready,
    "expect": finish.expect,
    "gates": finish.gates,
    "record": finish.record,
}

DRY: dict[str, Callable[[RunContext, Step], str]] = {
    "wait_ready": lambda ctx, st: f"would wait for {ctx.endpoint()}/health",
    "expect": lambda ctx, st: "would assert the profile's expectations",
}
