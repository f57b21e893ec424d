"""End to end: the gates against a single-rank sim engine on loopback.

Every gate passes on a healthy engine, and each answer fault fails exactly the gates that check
what it breaks, with the evidence in the output. The gates only speak HTTP; which gates a fault must
fail is decided here, from what the fault does to answers:

- garbage-tokens: every answer is one repeated token, so every gate that reads an answer fails;
  models/health and auth look at status codes only.
- count-off-by-one: counting skips a number: count100, and the soak (its prompts count too).
- nondeterministic: both text-equality gates (streamed == plain, concurrent == solo).
- memory-leak: the soak, through a sampler that reads the leak file as a node's MemAvailable.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sparkfleet.gates.env import GateOptions, MemSample
from sparkfleet.gates.run import GATES, run_gates
from sparkfleet.schema.profile import Profile

KEY_ENV = "SPARKFLEET_TEST_GATE_KEY"
KEY = "sk-gate-e2e-5f1c0d7e9a"
GB = 10**9
# The pretend node: 6 GB available, floor 5 GB (HLT-23), earlyoom at 2.4 GB (HLT-24). With 256 MiB leaked per
# request the floor is crossed after 4 requests, so even a slow, busy machine gets there in a 1-second soak.
BASE_AVAILABLE = 6 * GB
FLOOR, SIGTERM = 5 * GB, int(2.4 * GB)
LEAK_MB = 256

EXPECTED_FAILS = {
    "garbage-tokens": {"count100", "needle", "image", "tools", "reasoning", "streaming", "determinism", "soak"},
    "count-off-by-one": {"count100", "soak"},
    "needle-blind": {"needle"},
    "no-tool-calls": {"tools"},
    "nondeterministic": {"streaming", "determinism"},
    "auth-open": {"auth"},
    "stream-usage-missing": {"streaming"},
    "memory-leak": {"soak"},
}
# What the failing gate's evidence must say, per fault (a substring of a failed check's why or got).
EVIDENCE = {
    "garbage-tokens": {"count100": "one repeated token: '!'", "soak": "one repeated token"},
    "count-off-by-one": {"count100": "missing 51", "soak": "missing"},
    "needle-blind": {"needle": "lacks the needle"},
    "no-tool-calls": {"tools": "no tool_calls in the answer"},
    "nondeterministic": {"streaming": "streamed text differs", "determinism": "concurrent text differs from solo"},
    "auth-open": {"auth": "answered 200: the endpoint serves requests without a valid key"},
    "stream-usage-missing": {"streaming": "no usage block"},
    "memory-leak": {"soak": "under its floor 5.00 GB"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimEngine:
    """One sim engine rank (world size 1) on loopback; its leak file is always set, written only by the fault."""

    def __init__(self, tmp: Path, faults: list[str]) -> None:
        self.port = free_port()
        self.leak = tmp / "leak_kb"
        argv = [sys.executable, "-m", "sparkfleet.simengine", "--rank", "0", "--world-size", "1",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--host", "127.0.0.1",
                "--port", str(self.port), "--served-name", "deepseek-v4.1-flash", "--served-name", "glm-5.3-flash",
                "--kv-tokens", "2000000", "--boot-seconds", "0.2", "--step-ms", "1", "--api-key-env", KEY_ENV,
                "--leak-file", str(self.leak), "--leak-mb-per-request", str(LEAK_MB), "--log", str(tmp / "engine.log")]
        for f in faults:
            argv += ["--fault", f]
        self.proc = subprocess.Popen(argv, env={**os.environ, KEY_ENV: KEY}, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"sim engine exited {self.proc.returncode}: {(tmp / 'engine.log').read_text()}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("sim engine did not become healthy in 20 s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def sampler(self):
        """MemAvailable of a pretend node, less what the engine says it leaked since the first sample."""
        start: list[int] = []

        def leaked_kb() -> int:
            try:
                return int(self.leak.read_text().strip() or 0)
            except (OSError, ValueError):
                return 0  # no fault: the engine never writes the file

        def sample() -> dict[str, MemSample]:
            kb = leaked_kb()
            if not start:
                start.append(kb)
            return {"sim-head": MemSample(BASE_AVAILABLE - (kb - start[0]) * 1024, FLOOR, SIGTERM)}

        return sample


def lane(**kw) -> Profile:
    base = dict(name="sim-lane", engine="vllm", image={"ref": "sim:1"}, model={"repo_dir": "m"}, group="g", port=1,
                served_names=["deepseek-v4.1-flash", "glm-5.3-flash"], vision=True, tools=True, api_key_env=KEY_ENV)
    return Profile(**{**base, **kw})


def options(engine: SimEngine) -> GateOptions:
    # Small sizes keep the suite fast; the defaults (32K needle, 2-minute 8-way soak) are for real use.
    return GateOptions(needle_tokens=(1500,), soak_seconds=1.0, soak_streams=4, soak_sample_s=0.05,
                       mem_sampler=engine.sampler(), api_key=KEY)


@pytest.fixture
def engine_for(tmp_path):
    started: list[SimEngine] = []

    def start(*faults: str) -> SimEngine:
        e = SimEngine(tmp_path, list(faults))
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


def test_every_gate_passes_on_a_healthy_engine(engine_for):
    engine = engine_for()
    results = run_gates(engine.url, lane(), None, options(engine))
    assert [r.name for r in results] == list(GATES)
    assert {r.name: r.status for r in results} == {name: "pass" for name in GATES}, \
        [r.as_dict() for r in results if r.status != "pass"]
    soak = next(r for r in results if r.name == "soak")
    assert soak.data["requests"] >= 4 and soak.data["errors"] == 0  # at least one per stream
    assert soak.data["memory"]["sim-head"]["samples"] >= 3
    assert soak.data["ttft_s"]["p50"] > 0 and soak.data["decode_tok_s"]["p50"] > 0
    assert KEY not in json.dumps([r.as_dict() for r in results])


@pytest.mark.parametrize("fault", sorted(EXPECTED_FAILS))
def test_each_fault_fails_exactly_its_gates(engine_for, fault):
    engine = engine_for(fault)
    results = run_gates(engine.url, lane(), None, options(engine))
    failed = {r.name for r in results if r.status == "fail"}
    assert failed == EXPECTED_FAILS[fault], {r.name: r.summary for r in results if r.status == "fail"}
    assert all(r.status == "pass" for r in results if r.name not in failed)
    by = {r.name: r for r in results}
    for gate, phrase in EVIDENCE[fault].items():
        evidence = " | ".join(f"{c.why} {c.got}" for c in by[gate].failures())
        assert phrase in evidence, (gate, evidence)
        assert all(c.why and (c.sent or c.got) for c in by[gate].failures() if not c.name.startswith("memory")) \
            or gate == "soak"
    assert KEY not in json.dumps([r.as_dict() for r in results])


def test_memory_leak_stops_the_soak_before_earlyoom(engine_for):
    engine = engine_for("memory-leak")
    opts = options(engine)
    opts.soak_seconds = 30  # the breach, not the clock, must end it
    result = run_gates(engine.url, lane(), ["soak"], opts)[0]
    assert result.status == "fail"
    assert result.data["seconds"] < 10
    mem = result.data["memory"]["sim-head"]
    assert mem["first"] > FLOOR > mem["lowest"]
    assert result.checks[0].ok is True  # every answer was right; memory alone failed it


def test_a_text_only_lane_without_tools_or_key_skips_those_gates(engine_for):
    engine = engine_for()
    p = lane(vision=False, tools=False, api_key_env=None)
    results = run_gates(engine.url, p, ["models", "count100", "image", "tools", "auth"],
                        GateOptions(api_key=KEY))
    status = {r.name: r.status for r in results}
    assert status == {"models": "pass", "count100": "pass", "image": "skip", "tools": "skip", "auth": "skip"}


# ---------------------------------------------------------------------------------------------- the CLI


@pytest.fixture
def cli_root(ops_root: Path) -> Path:
    (ops_root / "profiles" / "simgate.yaml").write_text(
        "engine: vllm\nimage: {ref: 'sim:1'}\nmodel: {repo_dir: m}\ngroup: sparks\ntp: 4\nport: 8000\n"
        f"served_names: [deepseek-v4.1-flash, glm-5.3-flash]\nvision: true\ntools: true\napi_key_env: {KEY_ENV}\n")
    return ops_root


def cli(root: Path, *args: str) -> int:
    from sparkfleet.cli.main import main

    return main(["gates", "--root", str(root), "--profile", "simgate", *args])


def test_cli_json_and_exit_codes(engine_for, cli_root, capsys, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    engine = engine_for()
    assert cli(cli_root, "--endpoint", engine.url, "--only", "models,count100,auth", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"profile", "endpoint", "passed", "summary", "gates"}
    assert doc["profile"] == "simgate" and doc["endpoint"] == engine.url and doc["passed"] is True
    assert [g["name"] for g in doc["gates"]] == ["models", "count100", "auth"]
    gate = doc["gates"][1]
    assert set(gate) >= {"name", "status", "summary", "elapsed_s", "checks"} and gate["status"] == "pass"
    assert set(gate["checks"][0]) >= {"name", "ok", "sent", "got", "why", "elapsed_s"}
    assert KEY not in json.dumps(doc)

    # The soak from the command line; --no-mem-sample keeps it off the lab inventory's (non-loopback) nodes.
    assert cli(cli_root, "--endpoint", engine.url, "--only", "soak", "--soak-minutes", "0.01", "--soak-streams", "2",
               "--no-mem-sample", "--json") == 0
    soak = json.loads(capsys.readouterr().out)["gates"][0]
    assert soak["status"] == "pass" and soak["data"]["requests"] > 0 and soak["data"]["streams"] == 2
    assert [c["ok"] for c in soak["checks"]] == [True, None] and "not sampled" in soak["checks"][1]["why"]

    broken = engine_for("count-off-by-one")
    assert cli(cli_root, "--endpoint", broken.url, "--only", "count100") == 1
    text = capsys.readouterr().out
    assert "FAIL count100" in text and "missing 51" in text and "sent: 'Count from 1 to 100" in text


def test_cli_explicit_endpoint_with_nothing_to_sample_needs_no_inventory(engine_for, cli_root, capsys, monkeypatch,
                                                                         tmp_path):
    """`gates --endpoint URL --no-mem-sample` reaches no node, so with no inventory chosen (the shipped example
    left as the default, which a command that contacts nodes refuses) it runs; sampling the soak's memory on
    the lane's nodes still needs one, and is refused before any gate runs."""
    from sparkfleet.cli.common import EXAMPLE

    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.delenv("SPARKFLEET_INVENTORY", raising=False)
    monkeypatch.setenv("SPARKFLEET_CONFIG", str(tmp_path / "no-config.yaml"))  # nor a config file's choice
    engine = engine_for()
    assert cli(cli_root, "--endpoint", engine.url, "--only", "models,soak", "--soak-minutes", "0.01",
               "--soak-streams", "2", "--no-mem-sample", "--json") == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert (doc["profile"], doc["endpoint"], doc["passed"], doc["summary"]) == (
        "simgate", engine.url, True, "2 passed, 0 failed, 0 skipped")
    assert [(g["name"], g["status"]) for g in doc["gates"]] == [("models", "pass"), ("soak", "pass")]
    assert "not sampled" in doc["gates"][1]["checks"][1]["why"] and captured.err == ""

    # without the soak there is nothing to sample either
    assert cli(cli_root, "--endpoint", engine.url, "--only", "models", "--json") == 0
    assert json.loads(capsys.readouterr().out)["summary"] == "1 passed, 0 failed, 0 skipped"

    # the soak with its memory sampler needs the lane's nodes: the example default is refused, nothing is asked
    assert cli(cli_root, "--endpoint", engine.url, "--only", "soak", "--soak-minutes", "0.01") == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"sparkfleet: {EXAMPLE} (the default {cli_root}/inventories/lab.yaml holds example addresses; "
        "`sparkfleet config` shows where the default comes from)"]
    assert captured.out == ""


def test_cli_bad_input_exits_2(cli_root, capsys, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    assert cli(cli_root, "--endpoint", "http://127.0.0.1:9", "--only", "count100,bogus") == 2
    assert "unknown gate(s) bogus" in capsys.readouterr().err
    monkeypatch.delenv(KEY_ENV)
    assert cli(cli_root, "--endpoint", "http://127.0.0.1:9") == 2
    assert f"${KEY_ENV}, which is not set" in capsys.readouterr().err
    monkeypatch.setenv(KEY_ENV, KEY)
    assert cli(cli_root, "--endpoint", "http://127.0.0.1:9", "--needle-tokens", "12k") == 2
    assert cli(cli_root, "--endpoint", "http://127.0.0.1:9", "--reasoning-effort", "medium") == 2
    assert "medium" in capsys.readouterr().err


def test_cli_default_endpoint_is_the_heads_host_and_port(cli_root):
    """Without --endpoint: the head's SSH host (127.0.0.1 for a local-transport node) at the profile's port,
    the rule RunContext.endpoint() follows. No request is sent (the lab hosts are not on loopback)."""
    from sparkfleet.cli.gates import endpoint_for
    from sparkfleet.opsdir import Spec

    inv = Spec(cli_root).inventory("lab")
    head = inv.nodes[inv.groups["sparks"][0]]
    assert endpoint_for(head, 8000) == f"http://{head.ssh.host}:8000"
    local = head.model_copy(update={"transport": "local"})
    assert endpoint_for(local, 8000) == "http://127.0.0.1:8000"


# ---------------------------------------------------------------------------------------------- the `up` step


class Events:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def emit(self, event: str, **data) -> None:
        self.lines.append(data.get("text", event))


def fake_ctx(url: str, stop_on_gate_failure: bool):
    """The parts of a RunContext the gates step uses: endpoint, profile, options, record, events, plan, head,
    the executor (the soak's memory sampler's; the gates these tests run do not sample),
    and whether the lane was only shown (a real run's: it was started)."""
    from types import SimpleNamespace

    from sparkfleet.runner.record import Record

    head = SimpleNamespace(name="reddie")
    return SimpleNamespace(
        endpoint=lambda: url, profile=lane(), head=head, executor=None, events=Events(), lane_shown_only=False,
        options=SimpleNamespace(dry_run=False, stop_on_gate_failure=stop_on_gate_failure), started=[],
        record=Record("run-1", "up", "sim-lane", "sim", "sparkfleet up"),
        plan=SimpleNamespace(ranks=[SimpleNamespace(node=head, role="head", rank=0)]))


@pytest.mark.parametrize("stop", [False, True])
def test_up_gates_step_fails_the_run_and_stops_the_lane_only_when_asked(engine_for, monkeypatch, stop):
    from sparkfleet.runner.gates_step import gates_step
    from sparkfleet.schema.playbook import Step

    monkeypatch.setenv(KEY_ENV, KEY)
    stopped: list[object] = []
    monkeypatch.setattr("sparkfleet.runner.gates_step.stop_launch", stopped.append)
    engine = engine_for("needle-blind")
    ctx = fake_ctx(engine.url, stop)
    result = gates_step(ctx, Step(step="gates", args={"only": ["models", "needle"], "needle_tokens": 1500}))
    assert result.status == "fail"
    assert [f.check for f in result.findings] == ["gate needle"] and "lacks the needle" in result.findings[0].message
    assert "I could not find" in result.findings[0].observed
    assert result.data == {"results": {"models": "pass", "needle": "fail"}}
    assert KEY in ctx.record.secret_values  # so the record redacts it
    assert [r["name"] for r in ctx.record.data["gates"]["results"]] == ["models", "needle"]
    assert any(line.startswith("gate needle: fail") for line in ctx.events.lines)
    if stop:
        assert stopped == [ctx] and "every rank of this launch was stopped" in result.summary
    else:
        assert stopped == [] and "LEFT RUNNING" in result.summary
    assert KEY not in json.dumps(ctx.record.as_dict())


def test_up_gates_step_passes_on_a_healthy_engine(engine_for, monkeypatch):
    from sparkfleet.runner.gates_step import gates_step
    from sparkfleet.schema.playbook import Step

    monkeypatch.setenv(KEY_ENV, KEY)
    engine = engine_for()
    ctx = fake_ctx(engine.url, True)
    result = gates_step(ctx, Step(step="gates", args={"only": "models,count100,auth"}))
    assert result.status == "ok" and result.summary == "3 passed, 0 failed, 0 skipped"
    bad = gates_step(ctx, Step(step="gates", args={"soak_hours": 2}))
    assert bad.status == "fail" and "unknown gates argument(s) soak_hours" in bad.summary


# ---------------------------------------------------------------------------------------------- the fleet sampler


def test_fleet_sampler_reads_every_node_of_a_simulated_lab_and_the_soak_catches_low_memory(tmp_path, monkeypatch):
    """fleet_sampler over the simulated lab (local transport: every node is a sandbox on this machine).
    A node made low on memory fails the soak with its name and numbers; the others pass."""
    from sparkfleet.fleet.connect import transport_for
    from sparkfleet.fleet.op import Executor
    from sparkfleet.gates import soak
    from sparkfleet.gates.env import GateEnv
    from sparkfleet.sim import lab
    from tests.test_gates import FakeApi, _solver

    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path))
    sim = lab.up("lab")
    try:
        inv = sim.inventory()
        names = inv.groups["sparks"]
        ranks = [(inv.nodes[n], "head" if i == 0 else "workers") for i, n in enumerate(names)]
        transport = transport_for([node for node, _ in ranks])
        sampler = soak.fleet_sampler(Executor(transport, {node.name: node for node, _ in ranks}), ranks,
                                     {"head": 5, "workers": 4})
        healthy = sampler()
        assert set(healthy) == set(names)
        for name, s in healthy.items():
            assert s.error is None and s.available > 10 * GB and s.sigterm is not None
            assert s.floor == (5 * GB if name == names[0] else 4 * GB)
        low = names[2]
        sim.fault(low, "low-memory", gib=3)
        api = FakeApi(_solver)
        env = GateEnv(api.client(), "dsv", ["dsv"], True, True, None,
                      GateOptions(soak_seconds=20, soak_streams=1, soak_sample_s=0.2, mem_sampler=sampler))
        result = soak.run(env)
        transport.close()
    finally:
        lab.down()
    assert result.status == "fail" and result.data["seconds"] < 10  # the baseline sample stopped it
    bad = result.failures()
    assert [c.name for c in bad] == [f"memory {low}"]
    assert f"{low}: MemAvailable 3.22 GB under its floor 4.00 GB" in bad[0].why
