"""The docker shim held to the real daemon: every docker command the controller sends (its exact flags and
format strings, from fleet/ops/docker.py and fleet/nodeside/facts.py), run on a node of a lab with the shim
and on a node of a lab with its own real dockerd, must give the same exit code and the same output shape
(the same lines once ids are masked; for JSON, the same types at every key the controller reads).

Needs root and Debian's docker.io (.ci/run installs it): skipped otherwise, saying why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from sparkfleet.fleet.ops.docker import Inspect, LaneContainers, LogTail
from sparkfleet.sim import dockerd, lab, paths

# Without root there is no daemon to meet (skipped); as root in CI a missing docker.io is a failure.
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or (bool(dockerd.missing()) and not os.environ.get("CI")),
                                reason="a real dockerd per node needs " + "; ".join(dockerd.missing()))

IMAGE = "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2"  # a lab image on every Spark
NODE = "asusi"
LABELS = "--label sparkfleet.profile=contract --label sparkfleet.rank=0 --label sparkfleet.run=r1"
SLEEPER = f"--entrypoint python3 {IMAGE} -c 'import time; time.sleep(600)'"

# Keys of `docker inspect` the controller reads (fleet/ops/docker.py Inspect, nodeside/facts.py).
INSPECT_KEYS = ("Id", "Name", "Image", "RestartCount", "State.Status", "State.Running", "State.Pid",
                "State.ExitCode", "State.Error", "State.StartedAt", "State.FinishedAt", "State.OOMKilled",
                "Config.Labels", "Config.Image", "Config.Env", "Config.Cmd", "HostConfig.Binds",
                "HostConfig.NetworkMode", "HostConfig.RestartPolicy.Name", "HostConfig.PortBindings",
                "NetworkSettings.Ports")
IMAGE_KEYS = ("Id", "RepoTags", "RepoDigests", "Created", "Size")


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
        ("stop", f"docker stop -t 1 {cid}", "text"),
        ("inspect stopped", Inspect(((cid, "sf-contract-r0"),)).command(), "inspect"),
        ("rm -f exited", f"docker rm -f {cid}", "text"),
        ("rm -f gone", f"docker rm -f {cid}", "text"),
        ("lane ps -a after", LaneContainers("contract").command(), "text"),
    ]


def mask(text: str) -> str:
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
    diffs = [(r["step"], {k: (r[k], s[k]) for k in ("rc", "out", "err") if r[k] != s[k]})
             for r, s in zip(real, shim, strict=True) if r != s]
    assert diffs == [], "\n".join(f"{step}: {d}" for step, d in diffs)
