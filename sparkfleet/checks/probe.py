"""The GPU clock probe: the command it runs on a node, and the verdict on what that command printed.

Standard library only, so `python3 -m sparkfleet.checks.probe` works on a GPU machine that has a copy
of this repository but none of sparkfleet's dependencies (docs/clock-probe.md).

The node-side part is a `python3 -c` one-liner (no helper file to ship): it starts a load command in
the background and, while the load runs, samples
`nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks_event_reasons.active` every 0.2 s, then prints
one JSON document: the samples, the load's exit status and output tail, and the step timings the load
printed (if any) as a JSON line `{"step_ms": {"after_idle": [...], "back_to_back": [...]}}`.

The verdict is pure: samples and step timings in, states out. Only samples taken while the load ran
and without the GpuIdle reason bit are judged (an idle H200 reads 345 of 1980 MHz with reason 0x1,
REFERENCE.md §4); the thresholds are arguments, taken from the inventory's hardware class.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from typing import Any

# NVML clock-event reason bits (REFERENCE.md §4)
GPU_IDLE = 0x1
REASONS: dict[int, str] = {0x1: "GpuIdle", 0x2: "ApplicationsClocksSetting", 0x4: "SwPowerCap",
                           0x8: "HwSlowdown", 0x10: "SyncBoost", 0x20: "SwThermalSlowdown",
                           0x40: "HwThermalSlowdown", 0x80: "HwPowerBrakeSlowdown", 0x100: "DisplayClockSetting"}

QUERY = "clocks.sm,clocks.max.sm,clocks_event_reasons.active"
SAMPLE_INTERVAL_S = 0.2

# How the built-in load runs. These are method settings, not pass/fail thresholds: 5 s of work as the
# sim's `sim-gpu-load 5`, and the number of first steps that make the "after idle" side of the ratio.
LOAD_SECONDS = 5.0
AFTER_IDLE_STEPS = 5  # timed first; their median is the "after idle" step time
MATMUL_N = 8192
# A load that never ends is killed after this long (docker start + torch import + CUDA init included);
# the transport's timeout sits above it.
PROBE_MAX_S = 120.0

# The sampler, run on the node as `python3 -c SAMPLER LOAD INTERVAL MAX_S` (stdlib only).
SAMPLER = r'''
import json, os, signal, subprocess, sys, tempfile, time
load, interval, max_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
query = ["nvidia-smi", "--query-gpu=@QUERY@", "--format=csv,noheader,nounits"]
errors = []
def num(x, base=10):
    try:
        return int(x, base)
    except ValueError:
        return None
def sample(t0, loaded):
    try:
        r = subprocess.run(query, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as e:
        msg = "nvidia-smi: " + str(e)
    else:
        if r.returncode == 0:
            rows = []
            for i, line in enumerate(r.stdout.splitlines()):
                f = [x.strip() for x in line.split(",")]
                if len(f) == 3:
                    rows.append({"t": round(time.time() - t0, 3), "gpu": i, "sm": num(f[0]), "max": num(f[1]),
                                 "reasons": num(f[2], 16) if f[2].lower().startswith("0x") else None,
                                 "load": loaded})
            return rows
        msg = "nvidia-smi exit " + str(r.returncode) + ": " + (r.stderr or r.stdout).strip()[:200]
    if msg not in errors:
        errors.append(msg)
    return []
t0 = time.time()
samples = sample(t0, False)
out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
p = subprocess.Popen(load, shell=True, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
killed = False
while p.poll() is None:
    if time.time() - t0 > max_s:
        killed = True
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(p.pid, sig)
                p.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                break
        break
    due = time.time() + interval
    rows = sample(t0, True)
    running = p.poll() is None
    samples += [dict(r, load=running) for r in rows]
    time.sleep(max(0.0, due - time.time()))
rc = p.wait()
ended = round(time.time() - t0, 3)
def tail(f):
    f.seek(0)
    return f.read()[-4000:].decode("utf-8", "replace")
stdout, stderr = tail(out), tail(err)
# The timings are read by whole lines, never from a character tail: a load prints them on one line that
# grows with its length (a 20 s load on an H100 printed more than 4,000 characters of it). What is kept is
# one line, the last timings line, however long the load ran or whatever it printed after it.
steps = None
out.seek(0)
for line in out:
    if b'"step_ms"' not in line:
        continue
    try:
        doc = json.loads(line)
    except ValueError:
        continue
    if isinstance(doc, dict) and isinstance(doc.get("step_ms"), dict):
        steps = doc["step_ms"]
print(json.dumps({"probe": "sparkfleet-clock-probe", "version": 1, "interval_s": interval,
                  "load": {"command": load, "rc": rc, "killed": killed, "ended_s": ended,
                           "stdout_tail": stdout[-1000:], "stderr_tail": stderr[-1000:]},
                  "samples": samples, "step_ms": steps, "errors": errors}))
'''.replace("@QUERY@", QUERY)

# The built-in load: a square matmul loop (needs torch and a CUDA GPU), run as
# `python3 -c TORCH_LOAD SECONDS STEPS N`. It reads the GPU's GpuIdle bit before touching the GPU, times
# its first STEPS steps ("after idle": after however long the node sat idle before the probe, as the seeds'
# "first request after about 13 min idle", HLT-08), then steps back to back for SECONDS, and prints the
# timings. The idle pause is the node's own: on an H200 a process that keeps its CUDA context never showed
# GpuIdle in 30 s after its last step (docs/clock-probe.md), so a pause inside the load idles nothing.
TORCH_LOAD = r'''
import json, os, subprocess, sys, time
os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # torch's device 0 is then nvidia-smi's first visible index
visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
try:
    r = subprocess.run(["nvidia-smi", "-i", visible if visible.isdigit() else "0",
                        "--query-gpu=clocks_event_reasons.active", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=5)
    idle = bool(int(r.stdout.split()[0], 16) & 1)
except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
    idle = None  # cannot tell (no nvidia-smi here)
import torch
seconds, n, size = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
a = torch.randn(size, size, device="cuda")
torch.randn(64, 64, device="cuda") @ torch.randn(64, 64, device="cuda")  # cuBLAS set up on a tiny step
torch.cuda.synchronize()
def step():
    s = time.perf_counter()
    a @ a
    torch.cuda.synchronize()
    return round((time.perf_counter() - s) * 1e3, 3)
after = [step() for _ in range(n)]
b2b = []
end = time.time() + seconds
while time.time() < end:
    b2b.append(step())
print(json.dumps({"step_ms": {"after_idle": after, "back_to_back": b2b, "idle_seen": idle}}))
'''


def torch_load(seconds: float = LOAD_SECONDS, *, python: str = "python3") -> str:
    """The built-in matmul load with the host's python3 (needs torch)."""
    args = [f"{seconds:g}", str(AFTER_IDLE_STEPS), str(MATMUL_N)]
    return " ".join(shlex.quote(t) for t in [python, "-c", TORCH_LOAD, *args])


def image_load(image: str, seconds: float = LOAD_SECONDS) -> str:
    """The built-in load inside the lane's image: torch comes with it; never pulls (image check says if absent).

    `--entrypoint python3` because serving images (vllm/vllm-openai) have their own entrypoint.
    """
    argv = ["docker", "run", "--rm", "--pull", "never", "--gpus", "all", "--label", "sparkfleet.probe=1",
            "--entrypoint", "python3", image, "-c", TORCH_LOAD,
            f"{seconds:g}", str(AFTER_IDLE_STEPS), str(MATMUL_N)]
    return " ".join(shlex.quote(t) for t in argv)


def probe_command(load: str, *, interval_s: float = SAMPLE_INTERVAL_S, max_s: float = PROBE_MAX_S) -> str:
    """The shell command run on the node: the sampler around `load` (itself a shell command line)."""
    argv = ["python3", "-c", SAMPLER, load, f"{interval_s:g}", f"{max_s:g}"]
    return " ".join(shlex.quote(t) for t in argv)


def parse_output(stdout: str) -> dict[str, Any]:
    """The probe's JSON document (its last line); a dict with 'error' when there is none."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("probe") == "sparkfleet-clock-probe":
            return doc
    return {"error": "the probe printed no result" + (f": {stdout.strip()[-200:]!r}" if stdout.strip() else "")}


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
