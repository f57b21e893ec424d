"""The GPU clock probe's verdict on what its command printed, and the probe's standalone entry point.

The command and the document it prints are the node-side part (fleet/nodeside/clock_probe.py): a sampler
of nvidia-smi's clocks around a load, run on the node, and `parse_output` to find its document again.

The verdict is pure: samples and step timings in, states out. Only samples taken while the load ran
and without the GpuIdle reason bit are judged (an idle H200 reads 345 of 1980 MHz with reason 0x1,
REFERENCE.md §4); the thresholds are arguments, taken from the inventory's hardware class.

Standard library only (this module and the node-side part), so `python3 -m sparkfleet.checks.probe` works
on a GPU machine that has a copy of this repository but none of sparkfleet's dependencies
(docs/clock-probe.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from sparkfleet.fleet.nodeside.clock_probe import LOAD_SECONDS, image_load, parse_output, probe_command, torch_load

# NVML clock-event reason bits (REFERENCE.md §4)
GPU_IDLE = 0x1
REASONS: dict[int, str] = {0x1: "GpuIdle", 0x2: "ApplicationsClocksSetting", 0x4: "SwPowerCap",
                           0x8: "HwSlowdown", 0x10: "SyncBoost", 0x20: "SwThermalSlowdown",
                           0x40: "HwThermalSlowdown", 0x80: "HwPowerBrakeSlowdown", 0x100: "DisplayClockSetting"}


def reason_names(mask: int | None, *, without: int = 0) -> list[str]:
    """Names of the bits set in a clock-event reason mask (bits in `without` left out)."""
    if mask is None:
        return []
    return [name for bit, name in REASONS.items() if mask & bit and not without & bit]


def classify(sample: dict[str, Any], band: tuple[int, int], fraction: float) -> str:
    """One sample: idle (not judged), unknown, fast, latched, or throttled (low, with a throttle reason)."""
    reasons, sm, top = sample.get("reasons"), sample.get("sm"), sample.get("max")
    if not sample.get("load") or (reasons is not None and reasons & GPU_IDLE):
        return "idle"
    if reasons is None or sm is None or top is None:
        return "unknown"
    low = band[0] <= sm <= band[1] or sm < fraction * top
    if not low:
        return "fast"
    # a clock held down by power, heat or an applications-clock setting is explained, not latched
    return "throttled" if reasons & ~GPU_IDLE else "latched"


SEVERITY = {"latched": 5, "throttled": 4, "unknown": 3, "fast": 2, "idle": 1}


def _gpu_verdict(samples: list[dict[str, Any]], band: tuple[int, int], fraction: float) -> dict[str, Any]:
    kinds = [classify(s, band, fraction) for s in samples]
    judged = [s for s, k in zip(samples, kinds, strict=True) if k in ("fast", "latched", "throttled")]
    counts = {k: kinds.count(k) for k in ("fast", "latched", "throttled", "idle", "unknown")}
    n = len(judged)
    # the state most samples under load were in: one sample taken while the clock ramped decides nothing
    if n == 0:
        state = "unknown" if counts["unknown"] else "idle"
    elif counts["latched"] * 2 > n:
        state = "latched"
    elif (counts["latched"] + counts["throttled"]) * 2 > n:
        state = "throttled"
    else:
        state = "fast"
    shown = judged or samples
    mask = 0
    for s in judged:
        mask |= s.get("reasons") or 0
    last = shown[-1] if shown else {}
    return {
        "state": state,
        "sm_mhz": int(statistics.median(s["sm"] for s in judged)) if judged else last.get("sm"),
        "max_mhz": max(s["max"] for s in judged) if judged else last.get("max"),
        "reasons": reason_names(mask if judged else last.get("reasons"), without=GPU_IDLE if judged else 0),
        "samples": {"under_load": n, **counts},
    }


def verdict(probe: dict[str, Any], *, latch_band: tuple[int, int], latch_fraction: float,
            slow_ratio: float) -> dict[str, Any]:
    """The clock state under load (worst GPU) and the slow-state ratio, from one probe document."""
    if "error" in probe:
        return {"clock": {"state": "error", "error": probe["error"]}, "slow": {"state": "not-measured"}}
    band = (int(latch_band[0]), int(latch_band[1]))
    per_gpu: dict[int, list[dict[str, Any]]] = {}
    for s in probe.get("samples") or []:
        per_gpu.setdefault(int(s.get("gpu", 0)), []).append(s)
    gpus = {i: _gpu_verdict(ss, band, latch_fraction) for i, ss in sorted(per_gpu.items())}
    load = probe.get("load") or {}
    if gpus:
        worst = max(gpus, key=lambda i: SEVERITY[gpus[i]["state"]])
        clock = {"gpu": worst, **gpus[worst]}
    else:
        clock = {"state": "unknown", "samples": {"under_load": 0}}
    if clock["state"] in ("idle", "unknown") and load.get("rc") not in (0, None):
        clock["state"] = "load-failed"  # the load never reached the GPU: nothing to judge
    if probe.get("errors") and not gpus:
        clock["error"] = "; ".join(probe["errors"])
    clock.update(band=list(band), fraction=latch_fraction)
    return {"clock": clock, "gpus": gpus, "slow": slow_verdict(probe.get("step_ms"), slow_ratio),
            "load": {k: load.get(k) for k in ("command", "rc", "killed", "ended_s")}}


def slow_verdict(step_ms: dict[str, Any] | None, slow_ratio: float) -> dict[str, Any]:
    """Median step time after an idle pause over the median back to back; above `slow_ratio` is slow.

    A load that says the GPU was not idle before its first steps (`idle_seen: false`: something else ran
    on it, or a previous load had just ended) measured nothing after idle: not measured, whatever the ratio.
    """
    after = [float(x) for x in (step_ms or {}).get("after_idle") or []]
    b2b = [float(x) for x in (step_ms or {}).get("back_to_back") or []]
    if not after or not b2b or statistics.median(b2b) <= 0:
        return {"state": "not-measured", "threshold": slow_ratio}
    if (step_ms or {}).get("idle_seen") is False:
        return {"state": "not-measured", "threshold": slow_ratio, "pause_s": (step_ms or {}).get("pause_s"),
                "why": "the GPU was not idle before the load's first steps"}
    a, b = statistics.median(after), statistics.median(b2b)
    ratio = a / b
    return {"state": "slow" if ratio > slow_ratio else "fast", "after_idle_ms": round(a, 3),
            "back_to_back_ms": round(b, 3), "ratio": round(ratio, 3), "threshold": slow_ratio,
            "steps": {"after_idle": len(after), "back_to_back": len(b2b)},
            "pause_s": (step_ms or {}).get("pause_s"), "idle_seen": (step_ms or {}).get("idle_seen")}


def main(argv: list[str] | None = None) -> int:
    """`python3 -m sparkfleet.checks.probe command|verdict`: the probe's command line, and its verdict."""
    p = argparse.ArgumentParser(prog="python3 -m sparkfleet.checks.probe",
                                description="sparkfleet's GPU clock probe, runnable without sparkfleet's deps.")
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("command", help="print the exact shell command `sparkfleet check --probe` runs")
    load = c.add_mutually_exclusive_group()
    load.add_argument("--load", metavar="CMD", help="the load command (like `check --probe-command CMD`)")
    load.add_argument("--image", metavar="IMAGE", help="the built-in matmul load inside this image (docker)")
    c.add_argument("--seconds", type=float, default=LOAD_SECONDS, help=f"load duration (default {LOAD_SECONDS:g})")
    c.add_argument("--python", default="python3", help="python with torch, for the host matmul load (default)")
    v = sub.add_parser("verdict", help="judge a probe's JSON output; thresholds from the hardware class")
    v.add_argument("--samples", required=True, metavar="FILE", help="the probe's output ('-' for stdin)")
    v.add_argument("--latch-band", type=int, nargs=2, required=True, metavar=("LO", "HI"),
                   help="clock_latch_mhz of the hardware class (GB10: 630 950)")
    v.add_argument("--latch-fraction", type=float, required=True, help="clock_latch_fraction (GB10: 0.5)")
    v.add_argument("--slow-ratio", type=float, required=True, help="slow_state_ratio (GB10: 1.25)")
    args = p.parse_args(argv)
    if args.what == "command":
        if args.load:
            cmd = args.load
        elif args.image:
            cmd = image_load(args.image, args.seconds)
        else:
            cmd = torch_load(args.seconds, python=args.python)
        print(probe_command(cmd))
        return 0
    if args.samples == "-":
        text = sys.stdin.read()
    else:
        with open(args.samples, encoding="utf-8") as f:
            text = f.read()
    doc = parse_output(text)
    result = verdict(doc, latch_band=tuple(args.latch_band), latch_fraction=args.latch_fraction,
                     slow_ratio=args.slow_ratio)
    print(json.dumps(result, indent=2))
    return 0 if result["clock"]["state"] in ("fast", "idle") and result["slow"]["state"] != "slow" else 1


if __name__ == "__main__":
    sys.exit(main())
