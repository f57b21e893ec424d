"""The playbook steps, by name: the one registry (a playbook's `step:` names one of these).

A step is a thin decision over node operations (sparkfleet/fleet/ops/): it yields the commands it
wants run per node (runner/ops.py runs them, or shows them under --dry-run) and returns a StepResult. A
step that fails stops the run; once ranks have started, the runner stops every rank of this launch before
it gives up (and keeps their last log lines in the record). Under --dry-run the steps that need the live
lane (wait_ready, expect, gates) show their node commands too, and say what they would do
(RunContext.lane_shown_only).
"""

from __future__ import annotations

from sparkfleet.runner.ops import StepFn
from sparkfleet.runner.steps import build, finish, launch, preflight, prepare, stop

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
