"""`up -o KEY=VALUE` on the simulated lab: the containers run with the override, the run record and the
restore point keep it, and `restore` brings it back. THE LAB IS A SIMULATION (sparkfleet/sim)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sparkfleet.cli.main import main
from tests import cli_run

FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--json"]  # the clock probe has tests of its own
OVERRIDES = ["-o", "flags.--gpu-memory-utilization=0.78", "--set", "env.NCCL_DEBUG=INFO"]


def _result(capsys) -> dict:
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    return next(e for e in lines if e["event"] == "result")


def _launched(sim) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each node's running dcp2 container: its argv and env, from the sim's docker state."""
    out = {}
    for node, cs in cli_run.lane_containers(sim, "dcp2").items():
        for c in cs:
            if c["State"]["Status"] == "running":
                env = dict(e.partition("=")[::2] for e in c["Config"]["Env"] or [])
                out[node] = ((c["Config"].get("Entrypoint") or []) + (c["Config"].get("Cmd") or []), env)
    return out


def _gmu(argv: list[str]) -> str:
    return argv[argv.index("--gpu-memory-utilization") + 1]


def test_up_with_overrides_then_restore_brings_them_back(sim, capsys) -> None:
    state = Path(os.environ["SPARKFLEET_STATE"])
    assert main(["up", "--profile", "dcp2", "--inventory", "sim", *OVERRIDES, "--save-as", "ov1", *FAST]) == 0
    res = _result(capsys)
    assert res["outcome"] == "ok", res
    launched = _launched(sim)
    assert sorted(launched) == ["asusi", "bluey", "reddie", "spark4"]
    assert {_gmu(argv) for argv, _ in launched.values()} == {"0.78"}
    assert {env.get("NCCL_DEBUG") for _, env in launched.values()} == {"INFO"}
    want = {"flags.--gpu-memory-utilization": 0.78, "env.NCCL_DEBUG": "INFO"}
    record = json.loads((state / "runs" / f"{res['run_id']}.json").read_text())
    assert record["data"]["overrides"] == want
    assert json.loads((state / "restore" / "ov1.json").read_text())["overrides"] == want

    assert main(["down", "--profile", "dcp2", "--inventory", "sim", "--json"]) == 0
    capsys.readouterr()
    assert _launched(sim) == {}
    assert main(["restore", "ov1", "--inventory", "sim", *FAST]) == 0
    assert _result(capsys)["outcome"] == "ok"
    again = _launched(sim)
    assert {_gmu(argv) for argv, _ in again.values()} == {"0.78"} and len(again) == 4
    assert {env.get("NCCL_DEBUG") for _, env in again.values()} == {"INFO"}

    # without -o the profile's own value serves again
    assert main(["up", "--profile", "dcp2", "--inventory", "sim", *FAST]) == 0
    assert _result(capsys)["outcome"] == "ok"
    assert "0.78" not in {_gmu(argv) for argv, _ in _launched(sim).values()}
