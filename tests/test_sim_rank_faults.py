"""The sim's rank faults (rank-vanish, rank-hang, serve-crash), injected through `sparkfleet sim fault` on a
running rank and, with --sticky, on every later launch; observed through the node's docker and the API."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from sparkfleet.cli.main import main
from sparkfleet.sim import lab

from .test_sim import tool

IMAGE = "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2"
PORT = 8410


def run_argv(name: str) -> list[str]:
    return ["run", "-d", "--name", name, "--label", "sparkfleet.profile=dcp2", "--label", "sparkfleet.rank=0",
            "--label", "sparkfleet.run=t1", "--network", "host", IMAGE, "/models/repo", "--host", "0.0.0.0",
            "--port", str(PORT), "--served-model-name", "m"]


@pytest.fixture
def sim(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path))
    yield lab.up("lab")
    lab.down()


def poll(what, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def serving() -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{PORT}/v1/models", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def containers(root) -> list[dict]:
    ids = tool(root, "docker", "ps", "-aq", "--no-trunc").stdout.split()
    return json.loads(tool(root, "docker", "inspect", *ids).stdout) if ids else []


def fault(*args: str) -> None:
    assert main(["sim", "fault", *args]) == 0


def test_rank_vanish_removes_the_running_rank_and_sticky_every_later_one(sim):
    root = sim.root("asusi")
    tool(root, "docker", *run_argv("sf-a"))
    assert [c["State"]["Running"] for c in containers(root)] == [True]
    fault("asusi", "rank-vanish")
    assert containers(root) == []
    tool(root, "docker", *run_argv("sf-b"))  # not sticky: it acted once, the next launch stays
    assert [c["Name"] for c in containers(root)] == ["/sf-b"]
    tool(root, "docker", "rm", "-f", "sf-b")
    assert sim.heal("asusi", "rank-vanish") == [("asusi", "rank-vanish")]
    fault("asusi", "rank-vanish", "--sticky")  # nothing runs: it waits for the next launch, and every later one
    for name in ("sf-c", "sf-d"):
        cid = tool(root, "docker", *run_argv(name)).stdout.strip()
        assert len(cid) == 64
        # removed once started (on a real daemon, by its start event): no container left, not even exited
        poll(lambda: not tool(root, "docker", "ps", "-aq").stdout.split(), 10.0)
    sim.heal("asusi")
    tool(root, "docker", *run_argv("sf-e"))
    assert [c["Name"] for c in containers(root)] == ["/sf-e"]
    tool(root, "docker", "rm", "-f", "sf-e")


def test_rank_hang_keeps_health_but_never_produces_a_token(sim):
    root = sim.root("asusi")
    tool(root, "docker", *run_argv("sf-h"))
    poll(serving)
    body = {"model": "m", "prompt": "hello", "max_tokens": 4}
    assert httpx.post(f"http://127.0.0.1:{PORT}/v1/completions", json=body, timeout=10).status_code == 200
    fault("asusi", "rank-hang")
    poll(lambda: "rank-hang" in sim.faults("asusi") and sim.faults("asusi")["rank-hang"]["acted"])
    assert httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=5).status_code == 200
    with pytest.raises(httpx.ReadTimeout):  # the request is taken; no token ever comes
        httpx.post(f"http://127.0.0.1:{PORT}/v1/completions", json=body, timeout=3)
    assert httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=5).status_code == 200
    assert [c["State"]["Running"] for c in containers(root)] == [True]
    tool(root, "docker", "rm", "-f", "sf-h")


def test_serve_crash_ends_the_serving_rank_and_sticky_the_next_launch(sim):
    root = sim.root("asusi")
    tool(root, "docker", *run_argv("sf-s"))
    poll(serving)
    fault("asusi", "serve-crash", "--sticky")
    [c] = poll(lambda: [c for c in containers(root) if not c["State"]["Running"]])
    assert c["State"]["ExitCode"] == 1
    assert "sim fault serve-crash: the engine exits after serving" in tool(root, "docker", "logs", "sf-s").stdout
    tool(root, "docker", "rm", "sf-s")
    tool(root, "docker", *run_argv("sf-t"))  # sticky: the next launch serves, then crashes too
    poll(serving)
    [c] = poll(lambda: [c for c in containers(root) if not c["State"]["Running"]])
    assert c["Name"] == "/sf-t" and c["State"]["ExitCode"] == 1
    tool(root, "docker", "rm", "sf-t")
