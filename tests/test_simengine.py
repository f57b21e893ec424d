"""The sim engine as real processes on loopback: boot lines, rendezvous, the API's answers, metrics, faults."""

from __future__ import annotations

import json
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkfleet.engines.logs import parse, split_lines, text
from sparkfleet.engines.vllm import LOG as VLLM  # the sim engine prints vLLM's lines
from sparkfleet.simengine import tokens
from sparkfleet.simengine.main import GRAPH_SIZES, SHARDS
from sparkfleet.simengine.server import PRINTED_ROUTES
from tests.test_simengine_util import (
    BLUE,
    GREEN,
    RED,
    YELLOW,
    Lane,
    data_url,
    grid_png,
    png_bytes,
    stripes_png,
)

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

KEY = "sk-sim-" + uuid.uuid4().hex
ROWS = 96_000_000
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
COUNT = "Count from 1 to 100. Reply with the numbers only, separated by commas."


def engram(rank: int) -> list[str]:
    start, end = rank * ROWS, (rank + 1) * ROWS
    return ["--engram-ranges", f"1:{start}:{end},14:{start}:{end}"]


@pytest.fixture(scope="module")
def lane(tmp_path_factory):
    """A 4-rank lane. The head starts first and rank 3 late, to show the head waits for every worker."""
    tmp = tmp_path_factory.mktemp("lane")
    rank_extra = {r: engram(r) + (["--engram-node-local"] if r else []) for r in range(4)}  # boot 10: rank 0 on NFS
    ln = Lane(tmp, world=4, boot=0.5, key=KEY, rank_extra=rank_extra, name="main",
              extra=["--max-model-len", "500000", "--moe-backend", "B12X_MXFP4_MXFP8", "--max-num-seqs", "16"])
    ln.start(0)
    ln.start(1)
    ln.start(2)
    before: list[str] = []
    deadline = time.monotonic() + 20
    while "waiting for 3 worker(s)" not in ln.log() and time.monotonic() < deadline:  # the head is up
        time.sleep(0.02)
    deadline = time.monotonic() + 1.0  # twice the boot time: a lane not waiting for rank 3 would be up by now
    while time.monotonic() < deadline:
        before.append(connect(ln.port))
        time.sleep(0.05)
    ln.rank3_started = time.monotonic()
    ln.start(3)
    ln.after = ln.wait_health()
    ln.healthy_at = time.monotonic()
    ln.before = before
    yield ln
    ln.stop()


DIED = "Worker proc VllmWorker-0 died unexpectedly, shutting down executor."  # multiproc_executor.py:232


def connect(port: int) -> str:
    """What a TCP connect to the head's API port gets: 'refused' (nothing listens), 'accepted' or the error."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return "accepted"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return type(exc).__name__


def post(lane: Lane, path: str, body: dict, **kw) -> httpx.Response:
    return lane.http.post(lane.url + path, json=body, headers=kw.pop("headers", lane.headers()), timeout=30, **kw)


def sse(lane: Lane, body: dict, path: str = "/v1/chat/completions") -> list:
    """Stream a request; the decoded `data:` payloads in order ('[DONE]' kept as a string)."""
    events = []
    body = {"model": "dsv41", "temperature": 0, "stream": True, **body}
    with lane.http.stream("POST", lane.url + path, json=body, headers=lane.headers(), timeout=30) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-sparkfleet-sim"] == "1"
        for line in r.iter_lines():
            if line.startswith("data: "):
                payload = line[6:]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def streamed_message(events: list) -> dict:
    """Rebuild content, reasoning and tool calls from chat stream deltas."""
    content, reasoning, calls, finish = "", "", {}, None
    for e in events:
        if e == "[DONE]" or not e["choices"]:
            continue
        ch = e["choices"][0]
        delta = ch["delta"]
        content += delta.get("content") or ""
        reasoning += delta.get("reasoning_content") or ""
        for tc in delta.get("tool_calls") or []:
            call = calls.setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
            call["id"] = tc.get("id") or call["id"]
            fn = tc.get("function") or {}
            call["name"] = fn.get("name") or call["name"]
            call["arguments"] += fn.get("arguments") or ""
        finish = ch["finish_reason"] or finish
    return {"content": content, "reasoning": reasoning, "tool_calls": [calls[i] for i in sorted(calls)],
            "finish_reason": finish}


def numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def haystack(tokens_wanted: int, needle: str, depth: float, seed: int) -> str:
    rng = random.Random(seed)
    words = "river stone quiet market lantern orbit meadow copper harbour signal valley thread morning".split()
    sentences, count = [], 0
    while count < tokens_wanted:
        sentences.append(" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))).capitalize() + ".")
        count += tokens.count(" " + sentences[-1])
    sentences.insert(int(len(sentences) * depth), needle)
    return " ".join(sentences)


def metric_values(lane: Lane) -> dict[tuple, float]:
    r = lane.http.get(lane.url + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["x-sparkfleet-sim"] == "1"
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(values: dict[tuple, float], name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in values.items() if n == name and all((k, x) in lab for k, x in labels.items()))


# ---------------------------------------------------------------------------------------------- boot


def test_startup_lines_come_in_order_with_the_configured_numbers(lane):
    head = lane.log("r0")
    assert head.splitlines()[0].split("] ", 1)[1].startswith("SIMULATION: sparkfleet-sim engine")
    order = [
        "vLLM API server version", "world_size=4 rank=0 local_rank=0 distributed_init_method=tcp://127.0.0.1:",
        "Starting to load model", "Using 'B12X_MXFP4_MXFP8' Mxfp4 MoE backend.",
        "Engram DISK mode: layer 1 rows [0, 96000000)", "Engram DISK mode: layer 14 rows [0, 96000000)",
        "Engram layer 1 rows [0, 96000000) read from the model directory", "Model loading took 81.5800 GiB memory",
        "Available KV cache memory: 6.00 GiB", "GPU KV cache size: 1,888,800 tokens",
        "Maximum concurrency for 500,000 tokens per request: 3.78x", "Graph capturing finished in",
        "init engine (profile, create kv cache, warmup model) took",
        f"Starting vLLM API server 0 on http://127.0.0.1:{lane.port}", "INFO:     Application startup complete.",
    ]
    positions = [head.find(line) for line in order]
    assert -1 not in positions, [line for line, p in zip(order, positions, strict=True) if p < 0]
    assert positions == sorted(positions)
    assert "read from node-local" not in head
    for rank in (1, 2, 3):
        log = lane.log(f"r{rank}")
        assert log.splitlines()[0].split("] ", 1)[1].startswith("SIMULATION:")
        start, end = rank * ROWS, (rank + 1) * ROWS
        expect = [f"Engram DISK mode: layer 1 rows [{start}, {end})", f"Engram DISK mode: layer 14 rows [{start}, {end})",
                  f"Engram layer 1 rows [{start}, {end}) read from node-local /engram-local",
                  f"Engram layer 14 rows [{start}, {end}) read from node-local /engram-local",
                  "Model loading took", "Graph capturing finished in", "worker ready"]
        positions = [log.find(line) for line in expect]
        assert -1 not in positions and positions == sorted(positions), log
        assert f"(Worker_TP{rank} pid=" in log
        assert "GPU KV cache size" not in log and "Application startup complete" not in log
    # stdout carries the same lines as the --log file.
    assert lane.stdout("r1") == lane.log("r1")


def test_connection_refused_until_every_worker_has_joined_and_the_engine_serves(lane):
    # vLLM binds its API socket early and listens once uvicorn starts (openai/api_server.py:1809, 0.11.0)
    assert lane.before and set(lane.before) == {"refused"}
    assert 503 not in lane.after and lane.after[-1] == 200
    assert lane.healthy_at > lane.rank3_started
    head = lane.log("r0")
    assert head.index("rank 3 joined the rendezvous") < head.index("Starting to load model")
    assert head.index("Starting to load model") < head.index("Application startup complete")


def test_models_and_headers_say_it_is_a_simulation(lane):
    r = lane.http.get(lane.url + "/v1/models", headers=lane.headers())
    assert r.status_code == 200 and r.headers["x-sparkfleet-sim"] == "1"
    cards = r.json()["data"]
    assert [c["id"] for c in cards] == ["dsv41", "glm-5.3-flash"]
    assert {c["owned_by"] for c in cards} == {"sparkfleet-sim"} and cards[0]["max_model_len"] == 500000
    health = lane.http.get(lane.url + "/health")
    assert health.status_code == 200 and health.headers["x-sparkfleet-sim"] == "1"
    assert lane.http.get(lane.url + "/nope").status_code == 404


def test_auth_needs_the_key_on_v1_and_never_logs_it(lane):
    body = {"model": "dsv41", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    assert post(lane, "/v1/chat/completions", body, headers={}).status_code == 401
    assert post(lane, "/v1/chat/completions", body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert lane.http.get(lane.url + "/v1/models").status_code == 401
    assert post(lane, "/v1/chat/completions", body).status_code == 200
    assert lane.http.get(lane.url + "/health").status_code == 200  # like vLLM, only /v1 is protected
    assert lane.http.get(lane.url + "/metrics").status_code == 200
    for tag in ("r0", "r1", "r2", "r3"):
        assert KEY not in lane.log(tag) and KEY not in lane.stdout(tag)
    assert "API key authentication is on for /v1 (key from $SF_SIM_TEST_KEY; never logged)" in lane.log()


# ---------------------------------------------------------------------------------------------- answers


def test_count_to_100_is_exact_and_usage_matches_the_tokens(lane):
    r = lane.chat({"messages": [{"role": "user", "content": COUNT}], "max_tokens": 1000})
    assert r.status_code == 200
    body = r.json()
    content = body["choices"][0]["message"]["content"]
    assert numbers(content) == list(range(1, 101))
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == tokens.count(content) == 199
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 199
    short = lane.chat({"messages": [{"role": "user", "content": COUNT}], "max_tokens": 20}).json()
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 20
    assert numbers(short["choices"][0]["message"]["content"]) == list(range(1, 11))


def test_needle_at_32k_is_found(lane):
    nonce = f"NONCE-{uuid.uuid4().hex[:10].upper()}"
    text = haystack(32_000, f"The secret nonce is {nonce}.", 0.37, seed=5)
    r = lane.chat({"messages": [{"role": "user", "content": text + "\n\nWhat is the secret nonce in the text above?"}],
                   "max_tokens": 200})
    body = r.json()
    assert nonce in body["choices"][0]["message"]["content"]
    assert body["usage"]["prompt_tokens"] >= 32_000


def test_images_name_the_right_colours(lane):
    def ask(text, *pngs):
        parts = [{"type": "text", "text": text}] + [{"type": "image_url", "image_url": {"url": data_url(p)}}
                                                    for p in pngs]
        r = lane.chat({"messages": [{"role": "user", "content": parts}], "max_tokens": 100})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"].lower()

    v1 = ask("What are the colours of the three vertical stripes, from left to right?",
             stripes_png([RED, GREEN, BLUE], filters=(0, 1, 2, 3, 4)))
    assert re.search(r"red\W+green\W+blue", v1)
    v2 = ask("Describe the two images: what colour is each?", png_bytes(10, 10, lambda x, y: RED),
             png_bytes(10, 10, lambda x, y: BLUE + (255,), colour_type=6))
    assert "first image is red" in v2 and "second image is blue" in v2
    v3 = ask("This is a 2x2 grid. What colour is the top-right square?", grid_png(RED, GREEN, BLUE, YELLOW))
    assert "green" in v3 and "red" not in v3


def test_tools_call_with_arguments_round_trip_parallel_and_forced(lane):
    t1 = lane.chat({"messages": [{"role": "user", "content": "What's the weather in Paris? Answer in celsius."}],
                    "tools": [WEATHER, TIME]}).json()
    choice = t1["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["type"] == "function"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "c"}

    messages = [{"role": "user", "content": "What's the weather in Paris? Answer in celsius."},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"],
                 "content": json.dumps({"city": "Paris", "temperature": 18, "unit": "c", "condition": "light rain"})}]
    t2 = lane.chat({"messages": messages, "tools": [WEATHER]}).json()
    assert t2["choices"][0]["finish_reason"] == "stop"
    assert "18°C with light rain" in t2["choices"][0]["message"]["content"]

    t3 = lane.chat({"messages": [{"role": "user", "content": "Compare the weather in Tokyo and Berlin."}],
                    "tools": [WEATHER]}).json()
    cities = [json.loads(c["function"]["arguments"])["city"] for c in t3["choices"][0]["message"]["tool_calls"]]
    assert cities == ["Tokyo", "Berlin"]

    t4 = lane.chat({"messages": [{"role": "user", "content": "I land in Sydney at noon."}], "tools": [WEATHER, TIME],
                    "tool_choice": {"type": "function", "function": {"name": "get_time"}}}).json()
    [forced] = t4["choices"][0]["message"]["tool_calls"]
    assert forced["function"]["name"] == "get_time"
    assert json.loads(forced["function"]["arguments"]) == {"city": "Sydney"}


def test_streamed_tool_calls_match_the_plain_ones(lane):
    body = {"messages": [{"role": "user", "content": "Weather in Tokyo and Berlin, please."}], "tools": [WEATHER]}
    plain = lane.chat(body).json()["choices"][0]["message"]["tool_calls"]
    got = streamed_message(sse(lane, body))
    assert got["finish_reason"] == "tool_calls" and got["content"] == ""
    assert [(c["id"], c["name"], c["arguments"]) for c in got["tool_calls"]] == \
        [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in plain]


def test_reasoning_is_separate_and_medium_effort_is_400(lane):
    body = {"messages": [{"role": "user", "content": "Count from 1 to 12."}],
            "chat_template_kwargs": {"thinking": True}}
    msg = lane.chat(body).json()["choices"][0]["message"]
    assert msg["reasoning_content"] and numbers(msg["content"]) == list(range(1, 13))
    assert not set(numbers(msg["reasoning_content"])) - {1, 12}
    events = sse(lane, body)
    kinds = [k for e in events if e != "[DONE]" and e["choices"] for k in e["choices"][0]["delta"]
             if k in ("reasoning_content", "content") and e["choices"][0]["delta"][k]]
    assert kinds.index("content") > kinds.index("reasoning_content") and "reasoning_content" not in \
        kinds[kinds.index("content"):]
    assert streamed_message(events)["reasoning"] == msg["reasoning_content"]
    plain = lane.chat({"messages": body["messages"]}).json()["choices"][0]["message"]
    assert plain["reasoning_content"] is None
    bad = lane.chat({**body, "reasoning_effort": "medium"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"


def test_streaming_packs_several_tokens_per_chunk_and_ends_with_usage(lane):
    body = {"messages": [{"role": "user", "content": COUNT}], "max_tokens": 400}
    plain = lane.chat(body).json()
    events = sse(lane, {**body, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == {
        "prompt_tokens": plain["usage"]["prompt_tokens"], "completion_tokens": plain["usage"]["completion_tokens"],
        "total_tokens": plain["usage"]["total_tokens"]}
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events[:-2] if e["choices"]]
    assert max(tokens.count(d) for d in deltas) > 1  # DSpark-like: one event carries a whole step
    assert sum(tokens.count(d) for d in deltas) == plain["usage"]["completion_tokens"]
    assert "".join(deltas) == plain["choices"][0]["message"]["content"]
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    without = sse(lane, body)
    assert not any(e != "[DONE]" and "usage" in e for e in without)


def test_tokenize_counts_what_usage_reports(lane):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to 9, please."}]
    counted = post(lane, "/tokenize", {"model": "dsv41", "messages": messages}).json()
    usage = lane.chat({"messages": messages}).json()["usage"]
    assert counted["count"] == usage["prompt_tokens"] == len(counted["tokens"])
    assert counted["max_model_len"] == 500000
    assert post(lane, "/tokenize", {"prompt": "Count to 9, please."}).json()["count"] == 6
    assert post(lane, "/tokenize", {"model": "other", "prompt": "x"}).status_code == 404


def test_completions_endpoint_answers_and_streams(lane):
    r = post(lane, "/v1/completions", {"model": "glm-5.3-flash", "prompt": "Count to 7:", "temperature": 0})
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "glm-5.3-flash"
    assert numbers(body["choices"][0]["text"]) == list(range(1, 8))
    events = sse(lane, {"prompt": "Count to 7:", "stream_options": {"include_usage": True}}, "/v1/completions")
    assert "".join(e["choices"][0]["text"] for e in events[:-2] if e["choices"]) == body["choices"][0]["text"]
    assert events[-2]["usage"]["completion_tokens"] == body["usage"]["completion_tokens"]


def test_concurrent_answers_equal_solo_answers(lane):
    prompts = [COUNT, "Tell me about lighthouses.", "Why is the sky blue?", "Is 91 a prime number?",
               "Write a line about autumn rain.", "Name a fast animal.", "What is 17 * 23?", "Describe a harbour."]

    def ask(p):
        return lane.chat({"messages": [{"role": "user", "content": p}], "max_tokens": 300}).json()[
            "choices"][0]["message"]["content"]

    solo = [ask(p) for p in prompts]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, prompts))
    assert together == solo
    assert len(set(solo)) == len(solo)


def test_request_errors_look_like_vllm(lane):
    msg = [{"role": "user", "content": "hi"}]
    missing = lane.chat({"model": "nope", "messages": msg})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    too_long = lane.chat({"messages": msg, "max_tokens": 600_000})
    assert too_long.status_code == 400 and "maximum context length is 500000" in too_long.json()["error"]["message"]
    assert lane.chat({"messages": msg, "n": 2}).status_code == 400
    assert lane.chat({"messages": []}).status_code == 400
    bad = lane.http.post(lane.url + "/v1/chat/completions", content=b"{not json", headers=lane.headers())
    assert bad.status_code == 400
    assert lane.http.get(lane.url + "/v1/chat/completions", headers=lane.headers()).status_code == 405
    odd = lane.chat({"messages": msg, "tools": [{"type": "function", "function": {"name": "f", "parameters": 7}}]})
    assert odd.status_code == 400 and odd.json()["error"]["param"] == "tools"
    assert "Traceback" not in lane.log() and "Traceback" not in lane.stdout()


def test_metrics_parse_and_count_what_was_served(lane):
    before = metric_values(lane)
    r = lane.chat({"messages": [{"role": "user", "content": COUNT}], "max_tokens": 300}).json()
    after = metric_values(lane)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    base = {"model_name": "dsv41", "engine": "0"}
    assert delta("vllm:prompt_tokens_total", **base) == r["usage"]["prompt_tokens"]
    assert delta("vllm:generation_tokens_total", **base) == r["usage"]["completion_tokens"] == 199
    assert delta("vllm:request_success_total", finished_reason="stop", **base) == 1
    assert delta("vllm:time_to_first_token_seconds_count", **base) == 1
    assert delta("vllm:e2e_request_latency_seconds_count", **base) == 1
    assert delta("vllm:request_generation_tokens_sum", **base) == 199
    drafts = delta("vllm:spec_decode_num_drafts_total", **base)
    assert drafts > 0 and delta("vllm:spec_decode_num_draft_tokens_total", **base) == 5 * drafts
    # Each step emits its accepted drafts plus one token, so accepted + steps = tokens generated.
    assert delta("vllm:spec_decode_num_accepted_tokens_total", **base) + drafts == 199
    assert delta("vllm:inter_token_latency_seconds_count", **base) == drafts - 1
    assert delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0", **base) > 0
    assert total(after, "vllm:num_requests_running", **base) == 0
    assert total(after, "vllm:kv_cache_usage_perc", **base) == 0
    names = {n for n, _ in after}
    for name in ("vllm:num_requests_waiting", "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total",
                 "vllm:request_success_total", "vllm:time_to_first_token_seconds_bucket"):
        assert name in names
    # The same prompt again hits the prefix cache (fresh filler would not).
    again_before = metric_values(lane)
    lane.chat({"messages": [{"role": "user", "content": haystack(600, "x.", 0.5, seed=9)}], "max_tokens": 5})
    lane.chat({"messages": [{"role": "user", "content": haystack(600, "x.", 0.5, seed=9)}], "max_tokens": 5})
    assert total(metric_values(lane), "vllm:prefix_cache_hits_total") - total(again_before,
                                                                              "vllm:prefix_cache_hits_total") >= 128


# ---------------------------------------------------------------------------------------------- faults at boot


BOOT_FAULTS = {  # name: (world size, rank -> faults, extra args)
    "healthy": (1, {}, []),
    "worker-crash": (2, {1: ["worker-crash"]}, ["--peer-timeout", "2"]),
    "missing-patch": (2, {1: ["missing-patch"]}, []),
    "engine-fatal": (1, {0: ["engine-fatal"]}, []),
    "kv-low": (2, {1: ["kv-low"]}, ["--max-model-len", "500000"]),
    "engine-warning": (1, {0: ["engine-warning"]}, []),
    "slow-boot": (1, {0: ["slow-boot"]}, []),
}


@pytest.fixture(scope="module")
def boot_lanes(tmp_path_factory):
    """A lane per boot fault, all started together; a watcher notes when each got healthy (or its head exited)."""
    tmp = tmp_path_factory.mktemp("boot")
    lanes = {name: Lane(tmp, world=world, boot=0.1, faults=faults, extra=extra, name=name).start_all()
             for name, (world, faults, extra) in BOOT_FAULTS.items()}
    started = time.monotonic()

    def watch(ln: Lane) -> None:
        ln.statuses, ln.ready_after = [], None
        while time.monotonic() - started < 20 and ln.procs["r0"].poll() is None:
            status = ln.health()
            ln.statuses.append(status)
            if status == 200:
                ln.ready_after = time.monotonic() - started
                return
            time.sleep(0.02)

    watchers = [threading.Thread(target=watch, args=(ln,)) for ln in lanes.values()]
    for w in watchers:
        w.start()
    for w in watchers:
        w.join()
    try:
        yield lanes
    finally:
        for ln in lanes.values():
            ln.signal_stop()
        for ln in lanes.values():
            ln.stop()


def test_worker_crash_kills_the_boot(boot_lanes):
    ln = boot_lanes["worker-crash"]
    assert ln.wait_exit("r1") == 1
    log = ln.log("r1")
    assert "Traceback (most recent call last):" in log and "OSError: [Errno 5] Input/output error" in log
    assert "Model loading took" not in log
    assert ln.wait_exit("r0") == 1
    # the head's own worker fails its next collective; the executor and the API server follow (vLLM's lines)
    assert "NCCL error" in ln.log("r0") and DIED in ln.log("r0")
    assert "Application startup complete" not in ln.log("r0") and 200 not in ln.statuses
    # The head notices at its next collective (--peer-timeout 2 s later), so the crashed rank's line comes first.
    noticed = re.search(r"went away ([\d.]+) s ago", ln.log("r0"))
    assert noticed and float(noticed.group(1)) >= 2.0


def test_missing_patch_is_an_import_error(boot_lanes):
    ln = boot_lanes["missing-patch"]
    assert ln.wait_exit("r1") == 1
    log = ln.log("r1")
    assert "Traceback (most recent call last):" in log
    f = parse(log, [r"Traceback \(most recent call last\)"], VLLM)  # as the controller reads it: prefixed, headed
    assert f.fatal_detail and f.fatal_detail.startswith("ImportError: cannot import name 'EngramDiskReader'")
    assert "Starting to load model" not in log
    assert ln.wait_exit("r0") == 1 and 200 not in ln.statuses


def test_engine_fatal_prints_a_cuda_error_and_exits(boot_lanes):
    ln = boot_lanes["engine-fatal"]
    assert ln.wait_exit("r0") == 1
    log = ln.log()
    # logger.exception("EngineCore encountered a fatal error.") (v1/engine/core.py:868): the record carries the
    # traceback, and the reader names the exception that ends it
    f = parse(log, [], VLLM)
    assert f.fatal and f.fatal.endswith("[core.py:868] EngineCore encountered a fatal error.")
    assert f.fatal_detail == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert "Application startup complete" not in log and 200 not in ln.statuses


def test_kv_low_on_one_rank_lowers_the_lane_kv(boot_lanes):
    ln = boot_lanes["kv-low"]
    assert ln.ready_after is not None
    log = ln.log()
    assert "GPU KV cache size: 1,133,280 tokens" in log and "1,888,800" not in log
    assert "Maximum concurrency for 500,000 tokens per request: 2.27x" in log
    assert "Available KV cache memory: 3.60 GiB" in ln.log("r1")
    assert "GPU KV cache size: 1,888,800 tokens" in boot_lanes["healthy"].log()


def test_engine_warning_is_scary_but_the_lane_serves(boot_lanes):
    ln = boot_lanes["engine-warning"]
    assert ln.ready_after is not None
    warnings = [line for line in ln.log().splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and "CUDA error" in warnings[0]
    assert not [line for line in boot_lanes["healthy"].log().splitlines() if " WARNING " in line]
    r = ln.chat({"messages": [{"role": "user", "content": COUNT}]}).json()
    assert numbers(r["choices"][0]["message"]["content"]) == list(range(1, 101))


def test_slow_boot_takes_much_longer_but_finishes(boot_lanes):
    slow, healthy = boot_lanes["slow-boot"], boot_lanes["healthy"]
    assert slow.ready_after is not None and healthy.ready_after is not None
    # Ten times the configured 0.1 s boot: it cannot be ready sooner, however fast this machine is.
    assert slow.ready_after > 1.0
    assert "Application startup complete" in slow.log()


# ---------------------------------------------------------------------------------------------- faults in answers


ANSWER_FAULTS = [None, "garbage-tokens", "count-off-by-one", "needle-blind", "no-tool-calls", "nondeterministic",
                 "auth-open", "stream-usage-missing", "memory-leak"]
FAILS = {None: set(), "garbage-tokens": {"count", "needle", "tools"}, "count-off-by-one": {"count"},
         "needle-blind": {"needle"}, "no-tool-calls": {"tools"}, "nondeterministic": {"determinism"},
         "auth-open": {"auth"}, "stream-usage-missing": {"stream_usage"}, "memory-leak": set()}


@pytest.fixture(scope="module")
def fault_lanes(tmp_path_factory):
    """One single-rank lane per answer fault (and a healthy one), booted together."""
    tmp = tmp_path_factory.mktemp("faults")
    lanes = {}
    for fault in ANSWER_FAULTS:
        extra = ["--leak-file", str(tmp / "leak.kb")] if fault == "memory-leak" else []
        lanes[fault] = Lane(tmp, world=1, boot=0.1, key=KEY, faults={0: [fault]} if fault else {}, extra=extra,
                            name=fault or "healthy").start_all()
    try:
        for ln in lanes.values():
            ln.wait_health()
        yield lanes
    finally:
        for ln in lanes.values():
            ln.signal_stop()
        for ln in lanes.values():
            ln.stop()


def checks(ln: Lane) -> dict[str, bool]:
    """Small stand-ins for the answer gates (the real ones live in the gates issue)."""
    def content(body):
        r = ln.chat(body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    out = {}
    out["count"] = numbers(content({"messages": [{"role": "user", "content": COUNT}], "max_tokens": 300})
                           ["message"]["content"]) == list(range(1, 101))
    nonce = uuid.uuid4().hex[:12]
    text = haystack(2000, f"The secret nonce is {nonce}.", 0.5, seed=1) + "\nWhat is the secret nonce?"
    out["needle"] = nonce in content({"messages": [{"role": "user", "content": text}]})["message"]["content"]
    tool = content({"messages": [{"role": "user", "content": "What's the weather in Paris in celsius?"}],
                    "tools": [WEATHER]})
    out["tools"] = tool["finish_reason"] == "tool_calls" and json.loads(
        tool["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris", "unit": "c"}
    prompts = ["Tell me about lighthouses.", "Why is the sky blue?", "Name a fast animal."]
    solo = [content({"messages": [{"role": "user", "content": p}]})["message"]["content"] for p in prompts]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda p: content({"messages": [{"role": "user", "content": p}]})["message"][
            "content"], prompts * 2))
    out["determinism"] = together == solo * 2
    events = sse(ln, {"messages": [{"role": "user", "content": "Count to 5."}],
                      "stream_options": {"include_usage": True}})
    out["stream_usage"] = any(e != "[DONE]" and e.get("usage") for e in events)
    body = {"model": "dsv41", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    refused = [ln.http.post(ln.url + "/v1/chat/completions", json=body, headers=h).status_code
               for h in ({}, {"Authorization": "Bearer wrong"})]
    out["auth"] = refused == [401, 401]
    return out


@pytest.mark.parametrize("fault", ANSWER_FAULTS)
def test_each_answer_fault_fails_exactly_its_gates(fault_lanes, fault):
    results = checks(fault_lanes[fault])
    assert {name for name, ok in results.items() if not ok} == FAILS[fault], results


def test_garbage_tokens_are_one_token_and_the_drafter_accepts_nothing(fault_lanes):
    ln = fault_lanes["garbage-tokens"]
    text = ln.chat({"messages": [{"role": "user", "content": COUNT}], "max_tokens": 300}).json()[
        "choices"][0]["message"]["content"]
    assert len(set(tokens.tokenize(text))) == 1 and len(text) > 100
    values = metric_values(ln)
    assert total(values, "vllm:spec_decode_num_drafts_total") > 0
    assert total(values, "vllm:spec_decode_num_accepted_tokens_total") == 0


def test_memory_leak_grows_the_leak_file_per_request(fault_lanes):
    ln = fault_lanes["memory-leak"]
    leak = ln.tmp / "leak.kb"
    start = int(leak.read_text())
    for _ in range(3):
        ln.chat({"messages": [{"role": "user", "content": "Count to 3."}]})
    assert int(leak.read_text()) == start + 3 * 64 * 1024


# ---------------------------------------------------------------------------------------------- rendezvous


def test_relaunch_race_a_new_worker_joins_the_old_head(tmp_path):
    """The seeds' race: an old head still listens on the master port, a relaunched worker joins it unawares."""
    ln = Lane(tmp_path, world=2, boot=0.3).start_all()
    try:
        ln.wait_health()
        stray = ln.start(1, tag="r1-new")
        ln.wait_line("worker ready", tag="r1-new")
        assert f"rank 1 joined the rendezvous from 127.0.0.1 (pid {stray.pid}) after the world was complete" in ln.log()
        assert "NCCL error" not in ln.log("r1-new")  # from its side, nothing looked wrong
        new_head = ln.start(0, tag="r0-new")
        assert ln.wait_exit("r0-new") == 1
        assert f"port: {ln.master_port}, useIpv6: false, code: -98, name: EADDRINUSE" in ln.log("r0-new")
        assert ln.health() == 200 and new_head.returncode == 1
        ln.procs["r0"].send_signal(signal.SIGTERM)
        assert [ln.wait_exit(t) for t in ("r0", "r1", "r1-new")] == [0, 0, 0]
        assert "WorkerProc shutting down." in ln.log("r1-new") and "SIMULATION: the head asked" in ln.log("r1-new")
    finally:
        ln.stop()


RPC_TIMEOUT = "TimeoutError: RPC call to execute_model timed out."  # multiproc_executor.py:340 (0.13.0)
FATAL = "EngineCore encountered a fatal error."  # v1/engine/core.py:868


def test_a_serving_headless_worker_blocks_when_its_head_dies(tmp_path):
    """vLLM's headless worker waits on the head's broadcast queue with no timeout (worker_busy_loop,
    dequeue(indefinite=True)): the head killed, the workers neither exit nor print an error."""
    ln = Lane(tmp_path, world=3, boot=0.3).start_all()
    try:
        ln.wait_health()
        ln.procs["r0"].kill()
        for tag in ("r1", "r2"):
            log = ln.wait_line("SIMULATION: the head's connection closed", tag=tag)
            assert ln.procs[tag].poll() is None  # still there, after it saw the head go
            assert "NCCL error" not in log and "Traceback" not in log
        for tag in ("r1", "r2"):  # only a stop ends it (run_headless's SIGTERM handler)
            ln.procs[tag].send_signal(signal.SIGTERM)
            assert ln.wait_exit(tag) == 0
    finally:
        ln.stop()


def test_a_remote_worker_gone_leaves_health_200_until_a_request_times_out(tmp_path):
    """The head does not watch remote workers: /health stays 200 (it only asks whether the engine core
    errored); the next request's step waits VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS for the gone worker, then the
    engine core dies on the RPC timeout, the request gets a bare 500 and the server exits."""
    ln = Lane(tmp_path, world=2, boot=0.3, extra=["--execute-model-timeout", "1.5",
                                                  "--ringbuffer-warning-interval", "0.5"]).start_all()
    try:
        ln.wait_health()
        ln.procs["r1"].kill()
        ln.wait_line("rank 1 (pid")  # the head saw the connection close (a SIMULATION line, not vLLM's)
        assert ln.health() == 200 and ln.procs["r0"].poll() is None
        assert ln.http.get(ln.url + "/v1/models").status_code == 200
        r = ln.chat({"messages": [{"role": "user", "content": "Count from 1 to 5."}]}, timeout=30)
        assert (r.status_code, r.content, r.headers.get("content-type")) == (500, b"", None)
        assert ln.wait_exit("r0") == 1
        log = ln.log()
        assert FATAL in log and RPC_TIMEOUT in log and "failed (engine dead)." in log
        assert "The above exception was the direct cause of the following exception:" in log
        assert "AsyncLLM output_handler failed." in log
        assert "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue." in log
        # the wait's own line, every --ringbuffer-warning-interval while the step waits
        assert "No available shared memory broadcast block found in 0.5 seconds." in log
        assert DIED not in log and "NCCL error" not in log  # nothing names the worker or NCCL
        assert log.index(FATAL) < log.index("failed (engine dead).") < log.index("INFO:     Finished server process")
    finally:
        ln.stop()


def test_keep_alive_on_engine_death_answers_models_but_not_health(tmp_path):
    ln = Lane(tmp_path, world=2, boot=0.3, extra=["--keep-alive-on-engine-death",
                                                  "--execute-model-timeout", "1"]).start_all()
    try:
        ln.wait_health()
        ln.procs["r1"].kill()
        ln.wait_line("rank 1 (pid")
        assert ln.chat({"messages": [{"role": "user", "content": "hi"}]}).status_code == 500  # the timed-out step
        assert ln.health() == 503  # health.py: EngineDeadError from check_health is a bare 503
        assert ln.http.get(ln.url + "/v1/models").status_code == 200
        r = ln.chat({"messages": [{"role": "user", "content": "hi"}]})
        assert (r.status_code, r.content) == (500, b"")
        ln.procs["r0"].send_signal(signal.SIGTERM)
        assert ln.wait_exit("r0") == 1
    finally:
        ln.stop()


def test_shutdown_leaves_no_process_behind(tmp_path):
    ln = Lane(tmp_path, world=4, boot=0.3).start_all()
    try:
        ln.wait_health()
        assert len(ln.leftovers()) == 4
        ln.procs["r0"].send_signal(signal.SIGTERM)
        assert [ln.wait_exit(f"r{r}") for r in range(4)] == [0, 0, 0, 0]
        assert ln.leftovers() == []
        for port in (ln.master_port, ln.port):  # nothing listens there any more (TIME_WAIT is fine)
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                s.listen()
    finally:
        ln.stop()


def test_config_file_launch_and_stop_signal_during_boot(tmp_path):
    cfg = tmp_path / "engine.json"
    cfg.write_text(json.dumps({"served_names": ["from-json"], "kv_tokens": 1263118, "engram_ranges": [[1, 0, 5]],
                               "faults": ["engine-warning"]}))
    ln = Lane(tmp_path, world=1, boot=0.2, served=(), extra=["--config", str(cfg)])
    ln.start(0)
    try:
        ln.wait_health()
        assert [m["id"] for m in ln.http.get(ln.url + "/v1/models").json()["data"]] == ["from-json"]
        log = ln.log()
        # The file's values apply, and a flag (the helper's --kv-tokens) overrides the file's kv_tokens.
        assert "GPU KV cache size: 1,888,800 tokens" in log and "Engram DISK mode: layer 1 rows [0, 5)" in log
        assert " WARNING " in log
    finally:
        ln.stop()
    slow = Lane(tmp_path, world=2, boot=10, name="slow").start_all()
    slow.wait_line("Starting to load model")
    slow.procs["r0"].send_signal(signal.SIGTERM)
    assert slow.wait_exit("r0", timeout=5) == 0 and slow.wait_exit("r1", timeout=5) == 0
    assert slow.leftovers() == []


def test_bad_arguments_are_refused():
    def run(*args):
        return subprocess.run([sys.executable, "-m", "sparkfleet.simengine", *args], capture_output=True, text=True,
                              timeout=20)

    r = run("--rank", "4", "--world-size", "4")
    assert r.returncode == 2 and "outside --world-size" in r.stderr
    assert "invalid choice" in run("--fault", "meteor-strike").stderr
    assert "needs --leak-file" in run("--fault", "memory-leak").stderr
    assert "LAYER:START:END" in run("--engram-ranges", "1:2").stderr


def test_a_budget_with_no_room_for_kv_names_it_and_exits(tmp_path):
    """A launch whose budget the weights ate (FM-45): vLLM's line names the budget it was given, negative,
    then the engine refuses to start."""
    ln = Lane(tmp_path, boot=0.1, kv=-1, extra=["--kv-memory-bytes", str(-(2**30) * 13 // 5)], name="no-kv")
    ln.start(0)
    try:
        assert ln.wait_exit("r0") == 1
        log = ln.log()
        assert "Available KV cache memory: -2.60 GiB" in log and "EngineCore failed to start." in log
        assert "GPU KV cache size" not in log and "Application startup complete" not in log
    finally:
        ln.stop()


# -------------------------------------------------------------------------- vLLM's own lines (issue 24)

def boot_one(tmp_path, name: str, extra: list[str], env: dict[str, str] | None = None) -> tuple[Lane, list[str]]:
    """A one-GPU head of the given options, booted and asked for its models once; its log as `tail` counts lines."""
    ln = Lane(tmp_path, world=1, boot=0.3, name=name, extra=extra, env=env)
    ln.start_all()
    try:
        assert ln.wait_health()[-1] == 200
        assert ln.http.get(ln.url + "/v1/models").status_code == 200
        deadline = time.monotonic() + 10
        while "GET /v1/models" not in ln.log() and time.monotonic() < deadline:
            time.sleep(0.02)
        return ln, split_lines(ln.log_path("r0").read_bytes().decode())
    finally:
        ln.stop()


def test_a_0_11_head_prints_vllm_0_11s_lines(tmp_path):
    ln, lines = boot_one(tmp_path, "v011", ["--vllm-version", "0.11.0", "--moe-backend", "MARLIN",
                                            "--kv-cache-memory-bytes", str(6 * 2**30), "--gpu-memory-bytes",
                                            str(128 * 2**30)], env={"NO_COLOR": "1"})
    # 0.11 colours the prefix whatever NO_COLOR says (vllm/utils/__init__.py:3463); one GPU: the engine core's
    pid = re.match(r"\x1b\[1;36m\(APIServer pid=(\d+)\)\x1b\[0;0m ", lines[0])
    assert pid, lines[0]
    prefixes = {f"\x1b[1;36m({p} pid={pid.group(1)})\x1b[0;0m " for p in ("APIServer", "EngineCore_DP0")}
    assert all(any(x.startswith(p) for p in prefixes) for x in lines), [x for x in lines
                                                                         if not any(x.startswith(p) for p in prefixes)]
    # tqdm's bars: refreshes behind \r (the weights' format ends each refresh with \n, the graphs' do not)
    weights = [x for x in lines if "Loading safetensors checkpoint shards" in x]
    graphs = [x for x in lines if "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)" in x]
    assert len(weights) == SHARDS + 2 and all("\r" in x for x in weights)
    assert len(graphs) == 1 and graphs[0].count("\r") == GRAPH_SIZES + 2
    assert text(graphs[0]).startswith("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|")
    said = [text(x) for x in lines]
    assert re.match(r"INFO \d\d-\d\d \d\d:\d\d:\d\d \[simengine\] SIMULATION: ", said[0])  # vllm/logger.py:25
    assert any(x.endswith("] Using Marlin backend") for x in said)  # quantization/mxfp4.py:161 (0.13.0)
    assert not any("Available KV cache memory" in x for x in said)  # gpu_worker.py returns before it
    assert any("reserved 6.00 GiB memory for KV Cache as specified by kv_cache_memory_bytes" in x for x in said)
    routes = [x.split("] ", 1)[1] for x in said if "] Route: " in x]
    assert routes == [f"Route: {p}, Methods: {m}" for p, m in PRINTED_ROUTES]
    assert any(re.fullmatch(r'INFO:     127\.0\.0\.1:\d+ - "GET /v1/models HTTP/1\.1" 200 OK', x) for x in said)
    f = parse("\n".join(lines) + "\n", [], VLLM)
    assert (f.moe_backend, f.kv_tokens, f.api_up, f.fatal) == ("Marlin", 1_888_800, True, None)


def test_a_0_13_head_under_no_color_prints_plain_prefixes(tmp_path):
    _, lines = boot_one(tmp_path, "v013", ["--moe-backend", "B12X_MXFP4_MXFP8"], env={"NO_COLOR": "1"})
    assert not any("\x1b[" in x for x in lines)  # utils/system_utils.py:178 (0.13.0)
    assert all(re.match(r"\((APIServer|EngineCore_DP0) pid=\d+\) ", x) for x in lines)
    said = [text(x) for x in lines]
    assert any(x.endswith("] Using 'B12X_MXFP4_MXFP8' Mxfp4 MoE backend.") for x in said)
    assert any(x.endswith("] Available KV cache memory: 6.00 GiB") for x in said)


def test_a_0_20_head_names_its_engine_core_and_prints_plain_in_a_container(tmp_path):
    _, lines = boot_one(tmp_path, "v020", ["--vllm-version", "0.20.0"])
    assert not any("\x1b[" in x for x in lines)  # no tty (utils/system_utils.py:203-207, 0.20.0)
    assert any(x.startswith("(EngineCore pid=") for x in lines)
    said = [text(x) for x in lines]
    assert any(re.search(r"\] Starting vLLM server on http://127\.0\.0\.1:\d+$", x) for x in said)


def test_a_station_rank_tunes_into_an_empty_hash_dir_and_loads_a_filled_one(tmp_path):
    """The FlashInfer autotune (FM-40): the rank makes its hash dir as it starts and reads it after the KV line;
    empty, it tunes (silent, one CPU busy) and writes its configs there; a later boot on the same dir loads them."""
    hash_dir = tmp_path / "cache" / "flashinfer_autotune_cache" / "abc123"
    tune = ["--autotune-dir", str(hash_dir), "--autotune-shown", "/root/.cache/vllm/flashinfer_autotune_cache/abc123",
            "--autotune-read-seconds", "0.2", "--autotune-tune-seconds", "0.3", "--autotune-tuned", "168"]
    _, cold = boot_one(tmp_path, "cold", tune)
    body = [text(line).split("] ", 1)[-1] for line in cold]  # the messages, after vLLM's header
    tuning = body.index("[Autotuner]: Autotuning process starts ...")
    assert body[tuning + 1] == "[Autotuner]: Autotuning process ends"  # nothing in the log while it tunes
    assert body.index("Available KV cache memory: 6.00 GiB") < tuning
    assert len(json.loads((hash_dir / "autotune_configs.json").read_text())["configs"]) == 168
    assert parse("\n".join(cold), [], VLLM).autotune_loaded is None
    _, warm = boot_one(tmp_path, "warm", tune)
    assert "[Autotuner]: Loaded 168 configs from /root/.cache/vllm/flashinfer_autotune_cache/abc123/" \
        "autotune_configs.json" in [text(line).split("] ", 1)[-1] for line in warm]
    assert not any("Autotuning process" in line for line in warm)
    assert parse("\n".join(warm), [], VLLM).autotune_loaded == 168
