"""tf1017 (TensorFold, four Sparks) brought up, serving and brought down on the simulated lab."""

from __future__ import annotations

import json

import httpx

from sparkfleet.cli.main import main
from sparkfleet.sim import lab

from .test_sim import tool


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
