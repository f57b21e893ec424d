"""tf1017 and tf1017-rail2 (TensorFold, four Sparks) brought up, gated and brought down on the simulated lab
(local mode; ssh mode: test_sim_tensorfold_ssh.py). THE LAB IS A SIMULATION (sparkfleet/sim)."""

from __future__ import annotations

import json
import re
import subprocess

import httpx

from sparkfleet.cli.main import main
from tests.conftest import tensorfold_built

from .test_sim import tool
from .test_simengine_util import Lane

NODES = ("reddie", "asusi", "bluey", "spark4")


def up(capsys, profile: str) -> tuple[int, list[dict]]:
    tensorfold_built(profile)
    capsys.readouterr()
    code = main(["up", "--profile", profile, "--inventory", "sim", "--gates", "models", "--poll", "0.2",
                 "--no-probe", "--json"])
    return code, [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]


def step_status(events: list[dict], step: str) -> str:
    return next(e["status"] for e in events if e["event"] == "step" and e["step"] == step and e["status"] != "start")


def nothing_left(sim, profile: str) -> None:
    """down leaves no container (running or not) and no engine process of the lane on any node."""
    assert main(["down", "--profile", profile, "--inventory", "sim", "--json"]) == 0
    for node in NODES:
        assert tool(sim.root(node), "docker", "ps", "-aq").stdout == ""
    engines = subprocess.run(["pgrep", "-f", "sparkfleet.simengine --tensorfold"], capture_output=True, text=True)
    assert engines.stdout == ""


def test_tf1017_up_serves_on_the_head_host_and_down_leaves_nothing(sim, capsys):
    code, events = up(capsys, "tf1017")
    assert code == 0, events[-1]
    assert step_status(events, "gates") == "ok"
    head = sim.root("reddie")
    [cid] = tool(head, "docker", "ps", "-q", "--filter", "label=sparkfleet.profile=tf1017").stdout.split()
    log = tool(head, "docker", "logs", cid).stdout
    assert "standing in for TensorFold (rank 0 of 4)" in log and "KV cache" not in log
    models = httpx.get("http://127.0.0.1:8001/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["deepseek-v4.1-flash", "glm-5.3-flash"]
    for node in NODES[1:]:  # workers serve no API
        [wid] = tool(sim.root(node), "docker", "ps", "-q").stdout.split()
        [c] = json.loads(tool(sim.root(node), "docker", "inspect", wid).stdout)
        assert c["Config"]["Labels"]["sparkfleet.profile"] == "tf1017"
        assert "INFO:     Application startup complete" not in tool(sim.root(node), "docker", "logs", wid).stdout
    nothing_left(sim, "tf1017")


def test_tf1017_rail2_up_gated_on_both_rails_then_down_leaves_nothing(sim, capsys):
    """The fleet endpoint (PRF-T02): 0.0.0.0:8000, rail-2 aliases on its two nodes, the sampling args in
    SERVE_ARGS; the models gate passes through up; down leaves nothing."""
    code, events = up(capsys, "tf1017-rail2")
    assert code == 0, events[-1]
    assert step_status(events, "rail2_up") == "ok" and step_status(events, "gates") == "ok"
    for node, alias in (("reddie", "192.168.193.11/24"), ("asusi", "192.168.193.12/24")):
        assert f"inet {alias} " in tool(sim.root(node), "ip", "addr", "show").stdout
    [cid] = tool(sim.root("reddie"), "docker", "ps", "-q").stdout.split()
    log = tool(sim.root("reddie"), "docker", "logs", cid).stdout
    assert "sim TensorFold: serve args: " in log and "--top-k 20" in log
    models = httpx.get("http://127.0.0.1:8000/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["deepseek-v4.1-flash", "glm-5.3-flash"]
    assert main(["gates", "--profile", "tf1017-rail2", "--inventory", "sim", "--only", "models", "--json"]) == 0
    capsys.readouterr()
    nothing_left(sim, "tf1017-rail2")

VLLM_SHAPED = re.compile(r"^\(\w+ pid=\d+\) |vLLM|Worker_TP|EngineCore|safetensors checkpoint shards|CUDA graphs|"
                         r"KV cache|Model loading took")


def test_tensorfold_mode_prints_only_its_own_lines_and_waits_for_ranks_3_2_1_then_0(tmp_path):
    """The engine in TensorFold mode (what the docker shim starts for a TensorFold rank): none of vLLM's
    lines, and the head waits for rank 3, then 2, then 1, then joins itself (the recipe's order, LCH-T5)."""
    lane = Lane(tmp_path, world=4, boot=0.2, extra=["--tensorfold", "--serve-args", "--pool 4"])
    try:
        lane.start_all()
        lane.wait_line("Application startup complete")
        for rank in range(1, 4):
            lane.wait_line(f"sim TensorFold: rank {rank} loaded in", tag=f"r{rank}")
        logs = {r: lane.log(f"r{r}").splitlines() for r in range(4)}
    finally:
        lane.stop()
    for rank, lines in logs.items():
        assert lines and not [x for x in lines if VLLM_SHAPED.search(x)], (rank, lines)
    waits = [x.split("sim TensorFold: ", 1)[1] for x in logs[0] if "sim TensorFold: waiting" in x or "joins last" in x]
    assert waits == ["waiting for rank 3", "waiting for rank 2", "waiting for rank 1", "rank 0 (this rank) joins last"]
    assert any(x.endswith("sim TensorFold: serve args: --pool 4") for x in logs[0])
    assert "INFO:     Application startup complete." in logs[0]
