"""GPU clock latch (HLT-07, FM-09) and slow state (HLT-08, FM-10), judged under load only.

Applies to hardware classes that define a latch band or fraction (GB10 by default, DESIGN OQ-11).
Without `--probe` there is only the facts snapshot, taken with no load running: it is shown, not
judged. With the probe, the samples taken while its load ran are judged by `probe.verdict`.
"""

from __future__ import annotations

from typing import Any

from sparkfleet.findings import Finding
from sparkfleet.fleet.nodefacts import Gpu, NodeFacts
from sparkfleet.fleet.nodeside import clock_probe
from sparkfleet.schema.inventory import HardwareClass, Node
from sparkfleet.schema.profile import Profile

from . import probe
from .context import CheckContext, part_error, unread
from .seeds import LATCH_REMEDY

CHECK = "clock"
SLOW = "slow-state"
SLOW_REMEDY = ("warm the lane up before benchmarking and annotate results taken after idle; the seeds saw "
               "94 vs 63 ms/step after ~13 min idle (docs/failure-modes.md FM-10; HLT-08, BEN-10)")


def judged(hw: HardwareClass) -> bool:
    """Whether this hardware class has clock-latch thresholds (GB10 by default)."""
    return hw.clock_latch_mhz is not None or hw.clock_latch_fraction is not None


def thresholds(hw: HardwareClass) -> dict[str, Any]:
    """The verdict's arguments from the class. A class with only one of band/fraction never matches the other."""
    return {"latch_band": hw.clock_latch_mhz or (0, -1), "latch_fraction": hw.clock_latch_fraction or 0.0,
            "slow_ratio": hw.slow_state_ratio if hw.slow_state_ratio is not None else float("inf")}


def expected_text(hw: HardwareClass) -> str:
    parts = []
    if hw.clock_latch_mhz:
        parts.append(f"outside {hw.clock_latch_mhz[0]}-{hw.clock_latch_mhz[1]} MHz")
    if hw.clock_latch_fraction is not None:
        parts.append(f">= {hw.clock_latch_fraction:g} x max SM clock")
    return "under load: SM clock " + " and ".join(parts) + ", unless a throttle reason explains it"


def load_for(node: Node, facts: NodeFacts | None, profile: Profile, override: str | None = None, *,
             seconds: float | None = None) -> str:
    """The probe's load on this node: the user's command, or the matmul in the lane's image for `seconds`
    (None: clock_probe.LOAD_SECONDS)."""
    if override:
        return override
    seconds = clock_probe.LOAD_SECONDS if seconds is None else seconds
    if profile.image is None:
        return clock_probe.torch_load(seconds)  # no image to run in: the host's python3 (needs torch)
    return clock_probe.image_load(profile.image.pinned, seconds)


def _snapshot(node: str, hw: HardwareClass, g: Gpu) -> Finding:
    reasons = g.clock_event_reasons
    names = probe.reason_names(reasons)
    seen = (f"GPU {g.index} SM {g.sm_clock_mhz if g.sm_clock_mhz is not None else '?'} of "
            f"{g.max_sm_clock_mhz if g.max_sm_clock_mhz is not None else '?'} MHz, reasons "
            + (f"{reasons:#x} ({', '.join(names) or 'none'})" if reasons is not None else "?"))
    why = "GpuIdle" if reasons is not None and reasons & probe.GPU_IDLE else "no load running"
    return Finding(CHECK, "unknown", f"idle: not judged ({why}); only a sample under load can show a latch",
                   "run `sparkfleet check --probe` to judge the clock under load", node=node,
                   observed=f"snapshot, {seen}", expected=expected_text(hw))


def from_probe(node: str, hw: HardwareClass, run: dict[str, Any]) -> list[Finding]:
    v = probe.verdict(run, **thresholds(hw))
    c = v["clock"]
    state = c["state"]
    n = c.get("samples", {}).get("under_load", 0)
    seen = (f"GPU {c.get('gpu', '?')} SM {c.get('sm_mhz', '?')} of {c.get('max_mhz', '?')} MHz "
            + (f"(median of {n} samples under load)" if n else "(no sample under load)")
            + f", reasons {', '.join(c.get('reasons') or []) or 'none'}")
    expected = expected_text(hw)
    out: list[Finding] = []
    if state == "error":
        out.append(Finding(CHECK, "unknown", f"clock probe did not run: {c.get('error')}",
                           "run it again, or give a load that runs there: --probe-command CMD", node=node,
                           expected=expected))
    elif state == "load-failed":
        load = v["load"]
        tail = (run.get("load") or {}).get("stderr_tail", "").strip().splitlines()
        out.append(Finding(CHECK, "unknown", f"clock probe's load exited {load.get('rc')} before reaching the GPU: "
                           f"not judged" + (f" ({tail[-1]})" if tail else ""),
                           "give a load that runs there: --probe-command CMD", node=node,
                           observed=f"load: {load.get('command')}", expected=expected))
    elif state == "unknown":
        out.append(Finding(CHECK, "unknown", "clock probe could not read the SM clock under load: not judged"
                           + (f" ({c['error']})" if c.get("error") else ""),
                           "check nvidia-smi on the node", node=node, observed=seen, expected=expected))
    elif state == "idle":
        out.append(Finding(CHECK, "unknown", "idle: not judged (no sample while the probe's load ran showed the GPU "
                           "busy)", "check that the probe's load uses the GPU (--probe-command CMD)",
                           node=node, observed=seen, expected=expected))
    elif state == "latched":
        out.append(Finding(CHECK, "fail", f"GPU clock latched: {c['sm_mhz']} MHz under load with no throttle "
                           "reason; every TP step waits for this rank", LATCH_REMEDY, node=node,
                           observed=seen, expected=expected))
    elif state == "throttled":
        out.append(Finding(CHECK, "warn", f"low SM clock under load ({c['sm_mhz']} MHz), explained by "
                           f"{', '.join(c.get('reasons') or [])}: not a latch",
                           "check power, cooling and clock settings (nvidia-smi -q -d PERFORMANCE)",
                           node=node, observed=seen, expected=expected))
    else:
        out.append(Finding(CHECK, "ok", f"SM clock under load {c['sm_mhz']} of {c['max_mhz']} MHz",
                           node=node, observed=seen, expected=expected))
    s = v["slow"]
    if hw.slow_state_ratio is None:
        return out
    slow_expected = f"after-idle / back-to-back step time <= {hw.slow_state_ratio:g}"
    if s["state"] == "not-measured":
        why = s.get("why") or "the probe's load printed no step timings"
        out.append(Finding(SLOW, "unknown", f"not measured: {why}", node=node, expected=slow_expected))
        return out
    pause = s.get("pause_s")
    after = f"after a {pause:g} s idle pause" if isinstance(pause, int | float) else "first steps after idle"
    seen = f"{s['after_idle_ms']:g} ms/step {after} vs {s['back_to_back_ms']:g} back to back (ratio {s['ratio']:g})"
    if s["state"] == "slow":
        out.append(Finding(SLOW, "warn", f"slow state: steps after idle are {s['ratio']:g}x slower than back to "
                           "back", SLOW_REMEDY, node=node, observed=seen, expected=slow_expected))
    else:
        out.append(Finding(SLOW, "ok", f"no slow state (ratio {s['ratio']:g})", node=node, observed=seen,
                           expected=slow_expected))
    return out


def check(ctx: CheckContext) -> list[Finding]:
    out: list[Finding] = []
    for r, f in ctx.ranks():
        node = r.node.name
        hw = ctx.hardware(r.node)
        if not judged(hw):
            continue  # no latch thresholds for this class (GB300 by default)
        run = ctx.probes.get(node)
        if run is not None:
            out += from_probe(node, hw, run)
        elif not f.gpus and (error := part_error(f, "nvidia-smi")):
            out.append(unread(CHECK, node, error, expected_text(hw)))
        elif not f.gpus:
            out.append(Finding(CHECK, "warn", "no GPU reported: the clock cannot be checked",
                               "see the facts errors; is nvidia-smi installed and the driver loaded?", node=node,
                               observed="; ".join(f.errors) or "no GPU", expected=expected_text(hw)))
        else:
            out += [_snapshot(node, hw, g) for g in f.gpus]
    return out
