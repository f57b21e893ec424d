"""tf1017 (TensorFold, four Sparks) brought up, serving and brought down on the simulated lab."""

from __future__ import annotations

import json
import re

import httpx

from sparkfleet.cli.main import main
from sparkfleet.sim import lab

from .test_sim import tool
from .test_simengine_util import Lane


def test_tf1017_up_serves_on_the_head_host_and_down_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path))
    sim = lab.up("lab")
    try:
        code = main(["up", "--profile", "tf1017", "--inventory", "sim", "--gates", "models", "--poll", "0.2",
                     "--json"])
        out = capsys.readouterr().out
        assert code == 0, out[-2000:]
        head = sim.root("reddie")
        [cid] = tool(head, "docker", "ps", "-q", "--filter", "label=sparkfleet.profile=tf1017").stdout.split()
        log = tool(head, "docker", "logs", cid).stdout
        assert "standing in for TensorFold (rank 0 of 4)" in log and "KV cache" not in log
        models = httpx.get("http://127.0.0.1:8001/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["deepseek-v4.1-flash", "glm-5.3-flash"]
        for node in ("asusi", "bluey", "spark4"):  # workers serve no API
            [wid] = tool(sim.root(node), "docker", "ps", "-q").stdout.split()
            [c] = json.loads(tool(sim.root(node), "docker", "inspect", wid).stdout)
            assert c["Config"]["Labels"]["sparkfleet.profile"] == "tf1017"
            assert "Starting vLLM API server" not in tool(sim.root(node), "docker", "logs", wid).stdout
        assert main(["down", "--profile", "tf1017", "--inventory", "sim", "--json"]) == 0
        for node in ("reddie", "asusi", "bluey", "spark4"):
            assert tool(sim.root(node), "docker", "ps", "-aq").stdout == ""
    finally:
        lab.down()


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
