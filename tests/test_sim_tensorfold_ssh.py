"""tf1017 over real SSH: the sim's nodes behind their own sshd (as root, each in its own network namespace),
the head's API bound to 127.0.0.1 inside the head (LCH-T6), reached through up's SSH tunnel.
THE LAB IS A SIMULATION (sparkfleet/sim): the sim engine stands in for TensorFold."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from sparkfleet.cli.main import main
from tests.conftest import tensorfold_built

NODES = ("reddie", "asusi", "bluey", "spark4")


def run(capsys, *argv: str) -> tuple[int, list[dict]]:
    code = main([*argv, "--inventory", "sim", "--json"])
    return code, [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]


def test_tf1017_over_ssh_up_status_logs_gates_down(ssh_sim, capsys) -> None:
    assert {n.transport for n in ssh_sim.inventory().nodes.values()} == {"ssh"}
    tensorfold_built()
    capsys.readouterr()
    # tf1017 over SSH, not the links: the fabric probe has its own tests (test_fabric_sim, test_fabric_probe)
    code, events = run(capsys, "up", "--profile", "tf1017", "--gates", "models", "--poll", "0.2", "--no-probe",
                       "--no-fabric-probe")
    result = next(e for e in events if e["event"] == "result")
    assert code == 0, result
    said = [e["text"] for e in events if e["event"] == "message" and "SSH tunnel" in e.get("text", "")]
    assert len(said) == 1 and said[0].startswith("reddie serves on 127.0.0.1:8001 only: reaching it through an "
                                                 "SSH tunnel at http://127.0.0.1:")
    gates = next(e for e in events if e["event"] == "step" and e["step"] == "gates" and e["status"] != "start")
    assert gates["status"] == "ok"
    record = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{result['run_id']}.json").read_text())
    assert [(x["node"], x["rank"]) for x in record["data"]["launches"]] == [
        ("spark4", 3), ("bluey", 2), ("asusi", 1), ("reddie", 0)]  # the recipe's order
    assert main(["status", "--inventory", "sim", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert sorted((c["node"], c["rank"], c["state"]) for c in status["containers"]) == [
        ("asusi", 1, "running"), ("bluey", 2, "running"), ("reddie", 0, "running"), ("spark4", 3, "running")]
    lane = status["lanes"]["tf1017"]
    assert lane["health"] == 200 and lane["endpoint"] == "reddie:127.0.0.1:8001 (SSH tunnel)"
    assert main(["logs", "--profile", "tf1017", "--inventory", "sim", "--rank", "0", "--tail", "0"]) == 0
    head_log = capsys.readouterr().out
    order = [x.split("sim TensorFold: ")[1] for x in head_log.splitlines()
             if "sim TensorFold: waiting for rank" in x or "joins last" in x]
    assert order == ["waiting for rank 3", "waiting for rank 2", "waiting for rank 1",
                     "rank 0 (this rank) joins last"]
    assert "sim TensorFold: serving deepseek-v4.1-flash, glm-5.3-flash on http://127.0.0.1:8001" in head_log
    assert main(["down", "--profile", "tf1017", "--inventory", "sim", "--json"]) == 0
    capsys.readouterr()
    assert main(["status", "--inventory", "sim", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["containers"] == []
    engines = subprocess.run(["pgrep", "-f", "sparkfleet.simengine --tensorfold"], capture_output=True, text=True)
    assert engines.stdout == ""
