"""The clock probe: the command it runs (executed here against a fake nvidia-smi), its verdict, and its
standalone entry point `python3 -m sparkfleet.checks.probe`, which must work with the standard library only."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.checks import probe
from sparkfleet.fleet.nodeside import clock_probe

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent
GB10 = {"latch_band": (630, 950), "latch_fraction": 0.5, "slow_ratio": 1.25}  # the gb10 class defaults

# A stand-in for nvidia-smi: answers the probe's query from a state file the fake load writes.
FAKE_SMI = """#!/usr/bin/env python3
import os, sys
args = sys.argv[1:]
assert "--format=csv,noheader,nounits" in args, args
query = next(a for a in args if a.startswith("--query-gpu="))[len("--query-gpu="):].split(",")
state = os.path.join(os.path.dirname(os.path.abspath(__file__)), "state")
line = open(state).read().strip() if os.path.exists(state) else "208, 3003, 0x0000000000000001"
values = dict(zip(["clocks.sm", "clocks.max.sm", "clocks_event_reasons.active"], line.split(", ")))
print(", ".join(values[q] for q in query))
"""


@pytest.fixture
def gpu(tmp_path: Path) -> Path:
    """A bin dir with the fake nvidia-smi; write `bin/state` to change what it reports."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    return bindir


def run_probe(command: str, bindir: Path | None, timeout: float = 60) -> dict:
    env = dict(os.environ)
    env["PATH"] = (f"{bindir}{os.pathsep}" if bindir else "") + "/usr/bin:/bin"
    p = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return clock_probe.parse_output(p.stdout)


def load(bindir: Path, state: str, seconds: float = 1.2, extra: str = "") -> str:
    """A shell load that switches the fake GPU into `state` while it runs, then back to idle."""
    s = shlex.quote(str(bindir / "state"))
    return f"echo {shlex.quote(state)} > {s}; sleep {seconds}; {extra} rm -f {s}"


# -- the command -----------------------------------------------------------------------------

def test_command_is_the_sampler_around_the_load_all_quoted() -> None:
    cmd = clock_probe.probe_command("sim-gpu-load 5")
    assert shlex.split(cmd) == ["python3", "-c", clock_probe.SAMPLER, "sim-gpu-load 5", "0.2", "120"]
    assert "--query-gpu=clocks.sm,clocks.max.sm,clocks_event_reasons.active" in clock_probe.SAMPLER
    assert "--format=csv,noheader,nounits" in clock_probe.SAMPLER
    nasty = "echo 'a b' \"$HOME\"; touch /tmp/x$(id)"
    assert shlex.split(clock_probe.probe_command(nasty))[3] == nasty


def test_image_and_torch_loads() -> None:
    argv = shlex.split(clock_probe.image_load("vllm/vllm-openai:deepseekv41-flash-0909@sha256:" + "a" * 64))
    assert argv[:11] == ["docker", "run", "--rm", "--pull", "never", "--gpus", "all", "--label", "sparkfleet.probe=1",
                         "--entrypoint", "python3"]
    assert argv[11].endswith("@sha256:" + "a" * 64) and argv[12:14] == ["-c", clock_probe.TORCH_LOAD]
    assert argv[14:] == ["5", "5", "8192"]
    assert shlex.split(clock_probe.torch_load(python="/opt/py/bin/python3"))[:3] == ["/opt/py/bin/python3", "-c",
                                                                             clock_probe.TORCH_LOAD]



def test_the_lanes_load_runs_as_long_as_up_was_told(repo_spec) -> None:
    """`up --probe-seconds S` reaches the node's docker argv (the load's first argument); default LOAD_SECONDS."""
    from sparkfleet.checks import clock

    inv, profile = repo_spec.inventory("lab"), repo_spec.profile("dcp2").profile
    node = inv.nodes["asusi"]
    assert shlex.split(clock.load_for(node, None, profile))[14] == f"{clock_probe.LOAD_SECONDS:g}"
    assert shlex.split(clock.load_for(node, None, profile, seconds=1.5))[14:] == ["1.5", "5", "8192"]
    assert shlex.split(clock.load_for(node, None, profile, "sim-gpu-load 9", seconds=1.5)) == ["sim-gpu-load", "9"]


def test_probe_seconds_out_of_range_is_refused(capsys) -> None:
    from sparkfleet.cli.main import main

    assert main(["up", "--profile", "dcp2", "--probe-seconds", "0", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == ("sparkfleet: --probe-seconds 0: expected seconds above 0 and below 120 "
                                               "(the probe kills a load that runs that long)")

FAKE_TORCH = ("class T:\n    def __matmul__(self, other):\n        return self\n"
              "def randn(*shape, device=None):\n    assert device == 'cuda'\n    return T()\n"
              "class cuda:\n    @staticmethod\n    def synchronize():\n        pass\n")


def builtin_load(tmp_path: Path, path: str) -> dict:
    """TORCH_LOAD against a stand-in torch; returns its step_ms document."""
    (tmp_path / "torch").mkdir(exist_ok=True)
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PATH": path}
    p = subprocess.run([sys.executable, "-c", clock_probe.TORCH_LOAD, "0.2", "3", "64"], capture_output=True,
                       text=True, env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])["step_ms"]


def test_the_builtin_load_reads_gpu_idle_first_and_prints_step_timings(tmp_path: Path, gpu: Path) -> None:
    steps = builtin_load(tmp_path, f"{gpu}:/usr/bin:/bin")  # the fake GPU reads idle
    assert len(steps["after_idle"]) == 3 and len(steps["back_to_back"]) > 3 and steps["idle_seen"] is True
    (gpu / "state").write_text("3003, 3003, 0x0000000000000000")  # busy before the load started
    steps = builtin_load(tmp_path, f"{gpu}:/usr/bin:/bin")
    assert steps["idle_seen"] is False and probe.slow_verdict(steps, 1.25)["state"] == "not-measured"
    assert builtin_load(tmp_path, "/usr/bin:/bin")["idle_seen"] is None  # no nvidia-smi: cannot tell


# -- running it against a fake GPU -------------------------------------------------------------

def test_probe_samples_under_load_and_reads_step_timings(gpu: Path) -> None:
    steps = json.dumps({"step_ms": {"after_idle": [94, 95], "back_to_back": [63, 64, 63], "pause_s": 3}})
    doc = run_probe(clock_probe.probe_command(load(gpu, "3003, 3003, 0x0000000000000000",
                                             extra=f"echo {shlex.quote(steps)};")), gpu)
    assert doc["errors"] == [] and doc["load"]["rc"] == 0 and doc["load"]["killed"] is False
    first, loaded = doc["samples"][0], [s for s in doc["samples"] if s["load"]]
    assert first == {"t": first["t"], "gpu": 0, "sm": 208, "max": 3003, "reasons": 1, "load": False}
    assert len(loaded) >= 3 and {(s["sm"], s["reasons"]) for s in loaded} == {(3003, 0)}
    assert doc["step_ms"] == {"after_idle": [94, 95], "back_to_back": [63, 64, 63], "pause_s": 3}
    v = probe.verdict(doc, **GB10)
    assert v["clock"]["state"] == "fast" and v["slow"]["state"] == "slow" and v["slow"]["ratio"] == 1.5


def test_a_long_load_keeps_all_its_step_timings(gpu: Path) -> None:
    """Issue 39: a 20 s load on an H100 printed more than ~490 steps on its one timings line, longer than the
    4,000 characters the sampler kept, and the verdict said it printed none. 5,000 steps, then a line of
    chatter after them: the timings line is still the one read, whole."""
    after, b2b = [94.125] * 5, [63.125] * 5000
    timings = gpu.parent / "timings.json"
    timings.write_text(json.dumps({"step_ms": {"after_idle": after, "back_to_back": b2b, "idle_seen": True}}) + "\n")
    chatter = "echo 'load done';"
    doc = run_probe(clock_probe.probe_command(load(gpu, "3003, 3003, 0x0000000000000000",
                                             extra=f"cat {shlex.quote(str(timings))}; {chatter}")), gpu)
    assert doc["load"]["rc"] == 0 and doc["step_ms"] == {"after_idle": after, "back_to_back": b2b, "idle_seen": True}
    slow = probe.verdict(doc, **GB10)["slow"]
    assert slow["state"] == "slow" and slow["steps"] == {"after_idle": 5, "back_to_back": 5000}


def test_probe_sees_a_latch(gpu: Path) -> None:
    doc = run_probe(clock_probe.probe_command(load(gpu, "780, 3003, 0x0000000000000000")), gpu)
    v = probe.verdict(doc, **GB10)
    assert v["clock"]["state"] == "latched" and v["clock"]["sm_mhz"] == 780 and v["clock"]["reasons"] == []
    assert v["slow"]["state"] == "not-measured"


def test_a_hung_load_is_killed(gpu: Path) -> None:
    doc = run_probe(clock_probe.probe_command(load(gpu, "3003, 3003, 0x0", seconds=30), max_s=1), gpu, timeout=30)
    assert doc["load"]["killed"] is True and doc["load"]["ended_s"] < 15


def test_no_nvidia_smi_is_reported(tmp_path: Path) -> None:
    doc = run_probe(clock_probe.probe_command("sleep 0.3"), None)
    assert doc["samples"] == [] and doc["errors"] and doc["errors"][0].startswith("nvidia-smi: ")
    v = probe.verdict(doc, **GB10)
    assert v["clock"]["state"] == "unknown" and "nvidia-smi" in v["clock"]["error"]


def test_a_failing_load_is_not_judged(gpu: Path) -> None:
    doc = run_probe(clock_probe.probe_command("echo 'no torch' >&2; exit 3"), gpu)
    v = probe.verdict(doc, **GB10)
    assert v["clock"]["state"] == "load-failed" and doc["load"]["stderr_tail"] == "no torch\n"


# -- the verdict -----------------------------------------------------------------------------

def sample(sm: int | None, reasons: int | None, *, load: bool = True, gpu: int = 0, top: int = 3003) -> dict:
    return {"t": 0.0, "gpu": gpu, "sm": sm, "max": top, "reasons": reasons, "load": load}


@pytest.mark.parametrize(("sm", "reasons", "load", "kind"), [
    (780, 0x0, True, "latched"),       # inside the band, no reason
    (630, 0x0, True, "latched"),       # band edges included
    (950, 0x0, True, "latched"),
    (1400, 0x0, True, "latched"),      # below half of 3003
    (1600, 0x0, True, "fast"),
    (780, 0x1, True, "idle"),          # GpuIdle: never judged
    (780, 0x0, False, "idle"),         # no load running: never judged
    (780, 0x4, True, "throttled"),     # SwPowerCap explains it
    (780, 0x40, True, "throttled"),    # HwThermalSlowdown
    (780, 0x2, True, "throttled"),     # clocks set by the owner (ApplicationsClocksSetting)
    (None, 0x0, True, "unknown"),
    (780, None, True, "unknown"),      # [N/A] reasons: idle or not cannot be told
])
def test_classify(sm: int | None, reasons: int | None, load: bool, kind: str) -> None:
    assert probe.classify(sample(sm, reasons, load=load), (630, 950), 0.5) == kind


def test_verdict_takes_the_state_of_most_samples_and_the_worst_gpu() -> None:
    ramp = [sample(700, 0x0)] + [sample(3003, 0x0)] * 5
    assert probe.verdict({"samples": ramp}, **GB10)["clock"]["state"] == "fast"
    half = [sample(700, 0x0)] * 3 + [sample(3003, 0x0)] * 3
    assert probe.verdict({"samples": half}, **GB10)["clock"]["state"] == "fast"  # a latch needs a majority
    mixed = [sample(700, 0x0)] * 2 + [sample(700, 0x4)] * 2 + [sample(3003, 0x0)]
    assert probe.verdict({"samples": mixed}, **GB10)["clock"]["state"] == "throttled"
    two = [sample(3003, 0x0, gpu=0)] * 3 + [sample(780, 0x0, gpu=1)] * 3 + [sample(345, 0x1, gpu=2)] * 3
    v = probe.verdict({"samples": two}, **GB10)
    assert v["clock"]["gpu"] == 1 and v["clock"]["state"] == "latched"
    assert {i: g["state"] for i, g in v["gpus"].items()} == {0: "fast", 1: "latched", 2: "idle"}


def test_verdict_reports_the_reasons_seen_under_load() -> None:
    v = probe.verdict({"samples": [sample(900, 0x4)] * 3 + [sample(208, 0x1, load=False)]}, **GB10)
    assert v["clock"]["state"] == "throttled" and v["clock"]["reasons"] == ["SwPowerCap"]
    assert v["clock"]["samples"] == {"under_load": 3, "fast": 0, "latched": 0, "throttled": 3, "idle": 1,
                                     "unknown": 0}


def test_slow_verdict() -> None:
    assert probe.slow_verdict({"after_idle": [94], "back_to_back": [63]}, 1.25)["state"] == "slow"
    assert probe.slow_verdict({"after_idle": [78], "back_to_back": [63]}, 1.25)["state"] == "fast"  # 1.238
    assert probe.slow_verdict({"after_idle": [], "back_to_back": [63]}, 1.25)["state"] == "not-measured"
    assert probe.slow_verdict(None, 1.25)["state"] == "not-measured"
    busy = probe.slow_verdict({"after_idle": [94], "back_to_back": [63], "idle_seen": False}, 1.25)
    assert busy["state"] == "not-measured" and "not idle before" in busy["why"]


def test_parse_output() -> None:
    assert clock_probe.parse_output("") == {"error": "the probe printed no result"}
    assert "error" in clock_probe.parse_output('{"not": "ours"}\n')
    doc = {"probe": "sparkfleet-clock-probe", "samples": []}
    assert clock_probe.parse_output("banner\n" + json.dumps(doc) + "\n") == doc


# -- the standalone entry point ----------------------------------------------------------------

BLOCK = "import sys\nfor m in ('pydantic', 'yaml', 'jinja2', 'rich', 'fabric', 'paramiko', 'httpx'):\n" \
        "    sys.modules[m] = None\nimport runpy\nsys.argv = ['probe'] + sys.argv[1:]\n" \
        "runpy.run_module('sparkfleet.checks.probe', run_name='__main__', alter_sys=True)\n"


def standalone(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`python3 -m sparkfleet.checks.probe ARGS` with every third-party package made unimportable."""
    return subprocess.run([sys.executable, "-c", BLOCK, *args], capture_output=True, text=True, input=stdin,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)


def test_entry_point_runs_with_the_standard_library_only(gpu: Path, tmp_path: Path) -> None:
    p = standalone("command", "--load", "sim-gpu-load 5")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == clock_probe.probe_command("sim-gpu-load 5")
    assert standalone("command", "--image", "img:1").stdout.strip() == clock_probe.probe_command(clock_probe.image_load("img:1"))
    assert standalone("command").stdout.strip() == clock_probe.probe_command(clock_probe.torch_load())
    doc = run_probe(clock_probe.probe_command(load(gpu, "780, 3003, 0x0000000000000000")), gpu)
    out = tmp_path / "probe.json"
    out.write_text(json.dumps(doc))
    args = ("--latch-band", "630", "950", "--latch-fraction", "0.5", "--slow-ratio", "1.25")
    p = standalone("verdict", "--samples", str(out), *args)
    assert p.returncode == 1, p.stderr
    assert json.loads(p.stdout)["clock"]["state"] == "latched"
    healthy = run_probe(clock_probe.probe_command(load(gpu, "3003, 3003, 0x0")), gpu)
    p = standalone("verdict", "--samples", "-", *args, stdin=json.dumps(healthy))
    assert p.returncode == 0 and json.loads(p.stdout)["clock"]["state"] == "fast"
    # the thresholds are the hardware class's: the tool has no defaults of its own
    assert standalone("verdict", "--samples", str(out)).returncode == 2


def test_the_doc_describes_this_probe() -> None:
    """docs/clock-probe.md quotes the query, the image load's docker options and the entry point."""
    doc = (REPO / "docs" / "clock-probe.md").read_text()
    assert f"nvidia-smi --query-gpu={clock_probe.QUERY} --format=csv,noheader,nounits" in doc
    assert "docker run --rm --pull never --gpus all --label sparkfleet.probe=1 --entrypoint python3" in doc
    assert f"-c '<TORCH_LOAD>' {clock_probe.LOAD_SECONDS:g} {clock_probe.AFTER_IDLE_STEPS} {clock_probe.MATMUL_N}" in doc
    assert f"python3 -c '<SAMPLER>' '<LOAD>' {clock_probe.SAMPLE_INTERVAL_S:g} {clock_probe.PROBE_MAX_S:g}" in doc
    assert "## Receipt (real GPU)" in doc
