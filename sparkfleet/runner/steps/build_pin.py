"""The `engine_build` step: a lane whose engine is built from source (`sparkfleet build`) serves only the
pinned build, on every rank; restore also refuses a build other than the one the restore point served."""

from __future__ import annotations

from sparkfleet import enginebuild
from sparkfleet.engines.registry import engine_for
from sparkfleet.findings import Finding, failed
from sparkfleet.runner.context import RunContext
from sparkfleet.runner.ops import StepGen, StepResult
from sparkfleet.schema.playbook import Step


def recorded_digest(ctx: RunContext) -> str | None:
    """The build digest the restore point's run served with (None outside restore, or a run before builds)."""
    point = (ctx.options.restore_point or {}).get("point")
    served = point.record.data.engine_build if point is not None else None
    return served.digest if served else None


def engine_build(ctx: RunContext, st: Step) -> StepGen:
    b = engine_for(ctx.profile.engine).engine_build(ctx.profile)
    if b is None:
        return StepResult("skip", "the lane's engine comes in its image")
    pin = enginebuild.load_pin(b)
    remedy = f"sparkfleet build --profile {ctx.profile.name}"
    if pin is None:
        return StepResult("fail", f"{b.engine} is not built for this lane's build inputs: nothing was started",
                          [Finding("engine-build", "fail", f"no pin {enginebuild.pin_path(b)}: the "
                                   f"engine was never built with tensorfold.build as it is now", remedy)])
    was = recorded_digest(ctx)
    if was is not None and was != pin["digest"]:
        return StepResult("fail", "the engine was rebuilt since the restore point: nothing was started",
                          [Finding("engine-build", "fail", f"restore point served build {was[:16]}, the pin is now "
                                   f"{pin['digest'][:16]}", "build the restore point's inputs again, or up the lane",
                                   observed=pin["digest"], expected=was)])
    found = yield from enginebuild.verify_ops(ctx.nodes, b)
    if found is None:
        return StepResult("ok", f"would check {b.artefact_dir} against build {pin['digest'][:16]} on every rank")
    findings = enginebuild.verify_findings(found, b, pin, ctx.profile.name)
    ctx.record.data["engine_build"] = {"digest": pin["digest"], "pin": pin["key"], "dir": b.dir, "nodes": {
        n: (v if isinstance(v, str) else {"exists": v["exists"], "digest": enginebuild.tree_digest(v["files"])})
        for n, v in found.items()}}
    if failed(findings):
        return StepResult("fail", f"a rank does not hold the pinned {b.engine} build: nothing was started", findings)
    return StepResult("ok", f"{b.engine} build {pin['digest'][:16]} verified on every rank", findings)
