"""`up` and `down` once over real SSH: the simulated lab's nodes behind OpenSSH sshd on loopback, with
host keys checked strictly (SIMULATION: the sim engine stands in for vLLM)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from tests.conftest import copy_ops


def test_up_and_down_over_ssh(ssh_sim, capsys) -> None:
    inv = ssh_sim.inventory()
    assert {n.transport for n in inv.nodes.values()} == {"ssh"}
    # the transport, not the links (test_fabric_sim's): under load the fabric probe's 48 KB round trips can fail
    # a healthy veth (seen once here with a real dockerd per node) and stop up before the launch
    code = main(["up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models,count100", "--poll", "0.2",
                 "--probe-seconds", "1", "--no-fabric-probe", "--json"])
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    result = next(e for e in events if e["event"] == "result")
    assert code == 0, result
    assert main(["status", "--inventory", "sim", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert sorted((c["node"], c["rank"], c["state"]) for c in status["containers"]) == [
        ("asusi", 1, "running"), ("bluey", 2, "running"), ("reddie", 0, "running"), ("spark4", 3, "running")]
    assert status["lanes"]["dcp2"]["health"] == 200
    assert main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"]) == 0
    capsys.readouterr()
    assert main(["status", "--inventory", "sim", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["containers"] == []


def test_a_loopback_bound_head_is_reached_through_an_ssh_tunnel(ssh_sim, tmp_path, capsys) -> None:
    """A lane with `host: 127.0.0.1` (as tf1017 binds its API): readiness, gates and status go through a
    local port forward over the head's SSH connection, which closes with the command (as root the nodes
    are network namespaces: the head's SSH address is not this machine's loopback)."""
    ops = copy_ops(tmp_path / "ops")
    (ops / "profiles/dcp2-lo.yaml").write_text("extends: dcp2\nhost: 127.0.0.1\n")
    # the tunnel, not the links: the fabric probe has its own tests (test_fabric_sim, test_fabric_probe)
    code = main(["up", "--profile", "dcp2-lo", "--inventory", "sim", "--root", str(ops), "--gates", "models",
                 "--poll", "0.2", "--no-probe", "--no-fabric-probe", "--json"])
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    result = next(e for e in events if e["event"] == "result")
    assert code == 0, result
    said = [e["text"] for e in events if e["event"] == "message" and "SSH tunnel" in e.get("text", "")]
    assert len(said) == 1 and said[0].startswith("reddie serves on 127.0.0.1:8410 only: reaching it through an "
                                                 "SSH tunnel at http://127.0.0.1:")
    tunnel = said[0].rsplit(" ", 1)[1]
    assert not tunnel.endswith(":8410")
    ready = next(e for e in events if e["event"] == "step" and e["step"] == "wait_ready" and e["status"] == "ok")
    assert ready["summary"].startswith(f"serving at {tunnel} ")
    record = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{result['run_id']}.json").read_text())
    assert record["data"]["gates"]["endpoint"] == tunnel
    assert_status_through_the_tunnel(ssh_sim, ops, capsys)
    assert main(["down", "--profile", "dcp2-lo", "--inventory", "sim", "--root", str(ops), "--json"]) == 0


def assert_status_through_the_tunnel(sim, ops, capsys) -> None:
    """`status` asks the head's API through its own tunnel (fleet/connect.py api_base), closed when status
    ends; the head's SSH address does not serve the API (the engine binds 127.0.0.1 in the head's netns),
    so a status that polled it would see no answer. `--endpoint` overrides, and needs --profile."""
    import httpx

    head = sim.inventory().nodes["reddie"]
    assert main(["status", "--inventory", "sim", "--root", str(ops), "--json"]) == 0
    lane = json.loads(capsys.readouterr().out)["lanes"]["dcp2-lo"]
    assert (lane["health"], lane["models"], lane["endpoint"]) == (200, ["deepseek-v4.1-flash"],
                                                                  "reddie:127.0.0.1:8410 (SSH tunnel)")
    assert lane["tunnel"].startswith("http://127.0.0.1:") and not lane["tunnel"].endswith(":8410")
    with pytest.raises(httpx.ConnectError):  # the tunnel closed with the command
        httpx.get(f"{lane['tunnel']}/health", timeout=3.0)
    if head.ssh.host != "127.0.0.1":  # as root: the head is a netns of its own, its loopback not this one's
        with pytest.raises(httpx.TransportError):  # what a status polling the head's SSH address would see
            httpx.get(f"http://{head.ssh.host}:8410/health", timeout=3.0)
    assert main(["status", "--inventory", "sim", "--root", str(ops), "--profile", "dcp2-lo", "--endpoint",
                 "http://127.0.0.1:9/", "--json"]) == 0
    lane = json.loads(capsys.readouterr().out)["lanes"]["dcp2-lo"]
    assert (lane["endpoint"], lane["error"]) == ("http://127.0.0.1:9", "ConnectError") and "tunnel" not in lane
    assert main(["status", "--inventory", "sim", "--root", str(ops), "--endpoint", "http://127.0.0.1:9"]) == 2
    assert "--endpoint is one lane's API: name the lane with --profile" in capsys.readouterr().err
