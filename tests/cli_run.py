"""Running `sparkfleet` in a test and reading what it printed: the `--json` event lines of up/down/restore."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sparkfleet.cli.main import main

LAB_NODES = ("reddie", "asusi", "bluey", "spark4")  # the repo's `lab` inventory


def run(capsys, *argv: str) -> tuple[int, list[dict]]:
    """`sparkfleet ARGV --json`: the exit code and every JSON event line it printed."""
    code = main([*argv, "--json"])
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    return code, events


def result(events: list[dict]) -> dict:
    return next(e for e in events if e["event"] == "result")


def steps(events: list[dict]) -> dict[str, str]:
    """Each step's final status (the `start` events left out)."""
    return {e["step"]: e["status"] for e in events if e["event"] == "step" and e["status"] != "start"}


def step(events: list[dict], name: str) -> dict:
    return next(e for e in events if e["event"] == "step" and e["step"] == name and e["status"] != "start")


def findings(events: list[dict], name: str) -> list[dict]:
    """Every finding a step reported."""
    return [f for e in events if e["event"] == "findings" and e["step"] == name for f in e["findings"]]


def record_of(events: list[dict]) -> dict:
    """The run record the run's result names, read from the state dir."""
    run_id = result(events)["run_id"]
    return json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{run_id}.json").read_text())


def node_containers(sim, node: str) -> list[dict]:
    """Every container of a node as `docker inspect` shows it, oldest first, straight from the node's docker:
    its real daemon (sim up --docker daemon), or the shim's state."""
    if sim.docker == "daemon":
        ids = sim.exec(node, ["docker", "ps", "-aq", "--no-trunc"]).stdout.decode().split()
        found = json.loads(sim.exec(node, ["docker", "inspect", *ids]).stdout) if ids else []
        return sorted(found, key=lambda c: c["Created"])
    return json.loads((sim.state_dir(node) / "docker.json").read_text())["containers"]


def lane_containers(sim, profile: str | None, nodes: tuple[str, ...] = LAB_NODES) -> dict[str, list[dict]]:
    """Every node's containers of a lane (profile None: of any lane), oldest first (node_containers)."""
    return {node: [c for c in node_containers(sim, node)
                   if (c["Config"]["Labels"] or {}).get("sparkfleet.profile") == profile
                   or (profile is None and "sparkfleet.profile" in (c["Config"]["Labels"] or {}))]
            for node in nodes}


def container_log(sim, node: str, cid: str) -> str:
    """A container's log, stdout and stderr in the order written: the real daemon's json-file log (each
    record's `log`), or the shim's log file."""
    if sim.docker == "daemon":
        path = sim.exec(node, ["docker", "inspect", "-f", "{{.LogPath}}", cid]).stdout.decode().strip()
        lines = (sim.root(node) / path.lstrip("/")).read_text(errors="replace").splitlines()
        return "".join(json.loads(line)["log"] for line in lines if line)
    return (sim.state_dir(node) / "logs" / f"{cid}.log").read_text(errors="replace")


def lane_states(sim, profile: str = "dcp2") -> dict[str, list[str]]:
    """Every node's container states of a lane (docker's State.Status), in the order docker holds them."""
    return {n: [c["State"]["Status"] for c in cs] for n, cs in lane_containers(sim, profile).items()}
