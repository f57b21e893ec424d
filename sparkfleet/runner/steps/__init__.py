"""The playbook steps' implementations, bound to the one table of step names.

The names, with what each step does, are sparkfleet/schema/playbook.py STEPS: the schema refuses a
playbook naming another one, and it stays free of runner imports, so the runner takes its names from
there. A step's implementation is the function of that name in one of the modules here; `bind` pairs
them and refuses (at import) a name without an implementation or an implementation without a name.

A step is a thin decision over node operations (sparkfleet/fleet/ops/): it yields the commands it
wants run per node (runner/ops.py runs them, or shows them under --dry-run) and returns a StepResult. A
step that fails stops the run; once ranks have started, the runner stops every rank of this launch before
it gives up (and keeps their last log lines in the record). Under --dry-run the steps that need the live
lane (wait_ready, expect, gates) show their node commands too, and say what they would do
(RunContext.lane_shown_only).
"""

from __future__ import annotations

from collections.abc import Iterable

from sparkfleet.runner.ops import StepFn
from sparkfleet.runner.steps import build_pin, finish, launch, preflight, prepare, stop
from sparkfleet.schema.playbook import STEPS as NAMES

# Every step's implementation; its function's name is its step's name (in the schema's table).
IMPLEMENTATIONS: tuple[StepFn, ...] = (
    stop.stop,
    preflight.facts, preflight.check, preflight.probe, preflight.fabric_probe, preflight.nccl,
    prepare.patches, prepare.drop_caches, prepare.engram, prepare.rail2_up, prepare.rail2_down, prepare.pins,
    build_pin.engine_build,
    launch.launch, launch.wait_ready,
    finish.expect, finish.gates, finish.record,
)


class StepTableError(RuntimeError):
    """The step names and their implementations disagree: a bug in sparkfleet, not in a playbook."""


def bind(names: Iterable[str], implementations: Iterable[StepFn]) -> dict[str, StepFn]:
    """Each step name with its implementation, in the names' order (the schema's). A name with no
    implementation, an implementation no name calls for, or two implementations of one name raise."""
    names = list(names)
    by_name: dict[str, StepFn] = {}
    for fn in implementations:
        if fn.__name__ in by_name:
            raise StepTableError(f"step {fn.__name__!r} is implemented twice ({by_name[fn.__name__].__module__} "
                                 f"and {fn.__module__})")
        by_name[fn.__name__] = fn
    missing = [n for n in names if n not in by_name]
    unnamed = [f"{fn.__module__}.{n}" for n, fn in by_name.items() if n not in names]
    if missing or unnamed:
        raise StepTableError("the step table (sparkfleet/schema/playbook.py STEPS) and the implementations "
                             "(sparkfleet/runner/steps/__init__.py IMPLEMENTATIONS) disagree: "
                             + "; ".join(part for part in (
                                 f"named but not implemented: {', '.join(missing)}" if missing else "",
                                 f"implemented but not named: {', '.join(unnamed)}" if unnamed else "") if part))
    return {n: by_name[n] for n in names}


STEPS: dict[str, StepFn] = bind(NAMES, IMPLEMENTATIONS)
