"""The GPU clock probe's node-side part: the command run on a node, and the document it prints, read back.

Standard library only: `python3 -m sparkfleet.checks.probe` (the probe's standalone entry point) builds
this command on a GPU machine that has a copy of this repository but none of sparkfleet's dependencies
(docs/clock-probe.md), and fleet/ops/clock.py's ClockProbe runs it on a node.

It is a `python3 -c` one-liner (no helper file to ship): it starts a load command in the background and,
while the load runs, samples `nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks_event_reasons.active`
every 0.2 s, then prints one JSON document: the samples, the load's exit status and output tail, and the
step timings the load printed (if any) as a JSON line `{"step_ms": {"after_idle": [...], "back_to_back": [...]}}`.
`parse_output` finds that document in what the node printed; the verdict on it is checks/probe.py's (pure).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

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
