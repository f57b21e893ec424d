"""The docker shim held to the real daemon: every docker command the controller sends (its exact flags and
format strings, from fleet/ops/docker.py and fleet/nodeside/facts.py, and a lane's own `docker run` as the
engine adapter renders it), run on a node of a lab with the shim and on a node of a lab with its own real
dockerd, must give the same exit code and the same output shape (the same lines once ids and times are
masked; for JSON, the same types at every key the controller reads).

Needs root and Debian's docker.io (.ci/run installs it): skipped otherwise, saying why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from sparkfleet.fleet.ops.docker import EngramLines, Inspect, LaneContainers, Logs, LogTail, Stopped
from sparkfleet.opsdir import Spec
from sparkfleet.plan import make_plan
from sparkfleet.schema.playbook import Playbook, Step
from sparkfleet.sim import dockerd, lab, paths
from tests.conftest import REPO

# Without root there is no daemon to meet (skipped); as root in CI a missing docker.io is a failure.
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or (bool(dockerd.missing()) and not os.environ.get("CI")),
                                reason="a real dockerd per node needs " + "; ".join(dockerd.missing()))

IMAGE = "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2"  # a lab image on every Spark
NODE = "asusi"
LABELS = "--label sparkfleet.profile=contract --label sparkfleet.rank=0 --label sparkfleet.run=r1"
SLEEPER = f"--entrypoint python3 {IMAGE} -c 'import time; time.sleep(600)'"
# a container of the lane that writes three lines (one an Engram boot line), then waits; all on stdout:
# dockerd copies stdout and stderr on their own and keeps no order across them (CI's daemon logged a last
# stderr line first), so lines split over both would make the order, and `seen` counts, a race
TALKER = (f"--entrypoint python3 {IMAGE} -u -c 'import time; print(\"one\"); "
          f"print(\"Engram DISK mode: layer 1 rows 0:1024\"); print(\"three\", flush=True); "
          "time.sleep(600)'")
TALKED = "for i in $(seq 150); do docker logs sf-contract-r1 2>&1 | grep -q three && exit 0; sleep 0.1; done; exit 1"

# Keys of `docker inspect` the controller reads (fleet/ops/docker.py Inspect, nodeside/facts.py).
INSPECT_KEYS = ("Id", "Name", "Image", "RestartCount", "State.Status", "State.Running", "State.Pid",
                "State.ExitCode", "State.Error", "State.StartedAt", "State.FinishedAt", "State.OOMKilled",
                "Config.Labels", "Config.Image", "Config.Env", "Config.Cmd", "HostConfig.Binds",
                "HostConfig.NetworkMode", "HostConfig.RestartPolicy.Name", "HostConfig.PortBindings",
                "NetworkSettings.Ports")
IMAGE_KEYS = ("Id", "RepoTags", "RepoDigests", "Created", "Size")


def lane_launch() -> str:
    """The dcp2 lane's `docker run` for its rank on NODE, as the engine adapter renders it for `up` (--gpus
    all, --device /dev/infiniband, --ulimit, --shm-size, --memory, binds, env, the engine's arguments)."""
    spec = Spec(REPO)
    plan = make_plan(spec.profile("dcp2"), spec.inventory("lab"), Playbook(name="t", steps=[Step(step="launch",
                                                                                              role="all")]), spec.root)
    return next(x.script for x in plan.launches if x.node == NODE)


def steps(cid: str) -> list[tuple[str, str, str]]:
    """(what, command, output kind) in order; `cid` is filled in once the run step gave it."""
    return [
        ("version", "docker version --format '{{.Server.Version}}'", "text"),
        ("images", "docker images -q --no-trunc", "text"),
        ("image inspect", f"docker image inspect {IMAGE}", "image"),
        ("run", f"docker run -d --name sf-contract-r0 {LABELS} --network host --ulimit memlock=-1:-1 {SLEEPER}",
         "text"),
        ("run again, same name", f"docker run -d --name sf-contract-r0 {LABELS} {SLEEPER}", "text"),
        ("run refused: bad --ulimit", f"docker run -d --name sf-contract-bad --ulimit memlock=lots {SLEEPER}",
         "text"),
        ("run refused: no such image", "docker run -d --pull never --name sf-contract-x nosuch/image:1", "text"),
        ("lane ps", LaneContainers("contract", running_only=True).command(), "text"),
        ("lane ps -a", LaneContainers("contract").command(), "text"),
        ("lane ps, another run", LaneContainers("contract", run_id="r2").command(), "text"),
        ("ps all ids", "docker ps -aq --no-trunc", "text"),
        ("inspect", Inspect(((cid, "sf-contract-r0"),)).command(), "inspect"),
        ("inspect, one gone", Inspect(((cid, "sf-contract-r0"), ("0" * 64, "sf-contract-gone"))).command(), "inspect"),
        ("log tail", LogTail("sf-contract-r0", 5).command(), "text"),
        ("logs, no such container", "docker logs sf-contract-none", "text"),
        ("lane launch, as rendered", lane_launch(), "text"),
        ("inspect lane launch", Inspect((("sf-dcp2-r1", "sf-dcp2-r1"),)).command(), "inspect"),
        ("rm -f lane launch", "docker rm -f sf-dcp2-r1", "text"),
        ("run a talker", f"docker run -d --name sf-contract-r1 {LABELS.replace('rank=0', 'rank=1')} {TALKER}",
         "text"),
        ("wait for its lines", TALKED, "text"),
        ("log tail, since 10m", LogTail("sf-contract-r1", None, "10m").command(), "text"),
        ("log tail, since a future time", LogTail("sf-contract-r1", None, "2099-01-01T00:00:00Z").command(), "text"),
        ("logs read after the first", Logs("sf-contract-r1", seen=1).command(), "text"),
        ("engram lines", EngramLines("sf-contract-r1").command(), "text"),
        ("engram lines, none", EngramLines("sf-contract-r0").command(), "text"),
        ("stopped, both running", Stopped("contract").command(), "text"),
        ("stop", f"docker stop -t 1 {cid}", "text"),
        ("stopped, one exited", Stopped("contract").command(), "text"),
        ("inspect stopped", Inspect(((cid, "sf-contract-r0"),)).command(), "inspect"),
        ("rm -f exited", f"docker rm -f {cid}", "text"),
        ("rm -f gone", f"docker rm -f {cid}", "text"),
        ("rm -f talker", "docker rm -f sf-contract-r1", "text"),
        ("lane ps -a after", LaneContainers("contract").command(), "text"),
        ("stopped, none", Stopped("contract").command(), "text"),
    ]


def mask(text: str) -> str:
    # a time docker gave (FinishedAt of a stopped container); the zero time (never stopped) is kept
    text = re.sub(r"\b(?!0001-)\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z", "<time>", text)
    text = re.sub(r"sha256:[0-9a-f]{64}", "<sha256>", text)
    text = re.sub(r"\b[0-9a-f]{64}\b", "<id>", text)
    text = re.sub(r"\b[0-9a-f]{12}\b", "<short-id>", text)
    text = re.sub(r"\d+\.\d+\.\d+[^\s]*", "<version>", text)
    return text


def _get(obj, path: str):
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return "<absent>"
        obj = obj[part]
    return obj


def type_name(v) -> str:
    if v == "<absent>":
        return "absent"
    return {dict: "object", list: "array", str: "string", bool: "bool", int: "number", float: "number",
            type(None): "null"}[type(v)]


def shape(kind: str, out: str) -> object:
    if kind == "text":
        return [mask(line) for line in out.splitlines()]
    data = json.loads(out)
    keys = INSPECT_KEYS if kind == "inspect" else IMAGE_KEYS
    return [{k: type_name(_get(item, k)) for k in keys} for item in data]


def first_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return mask(lines[0]) if lines else ""


def run_all(mode: str, tmp_path) -> list[dict]:
    """Every step on NODE of a lab with docker `mode`, then the lab down."""
    state = tmp_path / mode
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        lab.up("lab", docker=mode)
        try:
            enter = str(paths.node_dir(NODE) / "enter")
            got, cid = [], ""
            for what, cmd, kind in steps("{cid}"):
                cmd = cmd.replace("{cid}", cid)
                r = subprocess.run([enter, "/bin/sh", "-c", cmd], capture_output=True, text=True, timeout=60)
                if what == "run" and r.returncode == 0:
                    cid = r.stdout.strip()
                got.append({"step": what, "rc": r.returncode, "out": shape(kind, r.stdout) if r.stdout.strip()
                            else [], "err": first_line(r.stderr)})
            return got
        finally:
            lab.down()


def test_the_shim_answers_as_the_real_daemon(tmp_path):
    real = run_all("daemon", tmp_path)
    shim = run_all("shim", tmp_path)
    assert real[3]["rc"] == 0, f"the real daemon did not run the container: {real[3]}"
    # what the real daemon did with the steps that must succeed there (equal failures would match too)
    said = {r["step"]: r for r in real}
    assert said["lane launch, as rendered"]["rc"] == 0 and said["lane launch, as rendered"]["out"] == ["<id>"], \
        said["lane launch, as rendered"]
    assert said["wait for its lines"]["rc"] == 0, said["wait for its lines"]
    assert said["log tail, since 10m"]["out"] == ["one", "Engram DISK mode: layer 1 rows 0:1024", "three"]
    assert said["log tail, since a future time"] == {"step": "log tail, since a future time", "rc": 0, "out": [],
                                                     "err": ""}
    assert said["logs read after the first"]["out"] == ["Engram DISK mode: layer 1 rows 0:1024", "three"]
    assert said["engram lines"]["out"] == ["Engram DISK mode: layer 1 rows 0:1024"]
    assert said["stopped, both running"]["out"] == ["1 running 0001-01-01T00:00:00Z", "0 running 0001-01-01T00:00:00Z"]
    assert said["stopped, one exited"]["out"] == ["1 running 0001-01-01T00:00:00Z", "0 exited <time>"]
    diffs = [(r["step"], {k: (r[k], s[k]) for k in ("rc", "out", "err") if r[k] != s[k]})
             for r, s in zip(real, shim, strict=True) if r != s]
    assert diffs == [], "\n".join(f"{step}: {d}" for step, d in diffs)
