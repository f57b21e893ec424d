"""Gate judgements over canned responses: each gate's pass case and the failures it must catch.

The canned endpoint is an httpx.MockTransport speaking the OpenAI API (JSON and SSE), so the gates'
HTTP code runs too; no socket is opened.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable

import httpx
import pytest

from sparkfleet.gates import auth, count, determinism, image, needle, reasoning, soak, streaming, tools
from sparkfleet.gates.client import ApiClient, Reply, RequestFailed, ToolCall, clip
from sparkfleet.gates.env import GateEnv, GateOptions, MemSample
from sparkfleet.gates.run import GateSetupError, default_gates, left_out, options_from_args, parse_only, run_gates
from sparkfleet.gates.text import degenerate, judge_count, judge_number, number_runs
from sparkfleet.schema.profile import Profile

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

KEY = "sk-test-0123456789abcdef"


def profile(**kw) -> Profile:
    base = dict(name="lane", engine="vllm", image={"ref": "img:1"}, model={"repo_dir": "m"}, group="g", port=8000,
                served_names=["dsv"], vision=True, tools=True)
    return Profile(**{**base, **kw})


# ---------------------------------------------------------------------------------------------- a canned API

Answer = dict  # {"content": str, "reasoning": str, "tool_calls": [(name, args_json)], "finish": str}


class FakeApi:
    """Answers chat requests with `answer(body)`; streams in chunks of `chunk` characters."""

    def __init__(self, answer: Callable[[dict], Answer], *, usage: bool = True, chunk: int = 7,
                 key: str | None = None, stream_answer: Callable[[dict], Answer] | None = None,
                 models: list[str] | None = None, tokenize: bool = False) -> None:
        self.answer, self.stream_answer = answer, stream_answer or answer
        self.usage, self.chunk, self.key, self.tokenize = usage, chunk, key, tokenize
        self.models = models or ["dsv"]
        self.bodies: list[dict] = []
        self.lock = threading.Lock()

    def client(self, key: str | None = None) -> ApiClient:
        return ApiClient("http://fake", key, transport=httpx.MockTransport(self.handle))

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if self.key and request.headers.get("authorization") != f"Bearer {self.key}":
            return httpx.Response(401, json={"error": {"message": "Unauthorized"}})
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": m, "max_model_len": 200_000} for m in self.models]})
        body = json.loads(request.content or b"{}")
        if path == "/tokenize" and self.tokenize:
            text = body["messages"][0]["content"]
            return httpx.Response(200, json={"count": len(text.split()) + 5})
        if path != "/v1/chat/completions":
            return httpx.Response(404, json={"detail": "Not Found"})
        with self.lock:
            self.bodies.append(body)
        ans = (self.stream_answer if body.get("stream") else self.answer)(body)
        content, reasoning_text = ans.get("content", ""), ans.get("reasoning", "")
        calls = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                 for i, (n, a) in enumerate(ans.get("tool_calls", []))]
        finish = ans.get("finish", "tool_calls" if calls else "stop")
        tokens = max(1, len(content.split()) + len(reasoning_text.split()))
        prompt = sum(len(str(m.get("content") or "").split()) for m in body["messages"]) + 5  # one token a word
        usage = {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}
        if not body.get("stream"):
            msg = {"role": "assistant", "content": content or None, "reasoning_content": reasoning_text or None,
                   "tool_calls": calls}
            return httpx.Response(200, json={"choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                                             "usage": usage})
        events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
        for i in range(0, len(reasoning_text), self.chunk):
            events.append({"choices": [{"index": 0, "delta": {"reasoning_content": reasoning_text[i:i + self.chunk]}}]})
        for i in range(0, len(content), self.chunk):
            events.append({"choices": [{"index": 0, "delta": {"content": content[i:i + self.chunk]}}]})
        for i, c in enumerate(calls):
            args = c["function"]["arguments"]
            events.append({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "id": c["id"], "type": "function", "function": {"name": c["function"]["name"],
                                                                              "arguments": args[:5]}}]}}]})
            events.append({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "function": {"arguments": args[5:]}}]}}]})
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if self.usage and (body.get("stream_options") or {}).get("include_usage"):
            events.append({"choices": [], "usage": usage})
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})


def env_for(api: FakeApi, **opts) -> GateEnv:
    options = GateOptions(**opts)
    return GateEnv(api.client(options.api_key), "dsv", ["dsv"], True, True, None, options)


def text(content: str, **kw) -> Callable[[dict], Answer]:
    return lambda body: {"content": content, **kw}


def last_user(body: dict) -> str:
    content = body["messages"][-1]["content"] if body["messages"][-1]["role"] == "user" else ""
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if p.get("type") == "text")
    return content


# ---------------------------------------------------------------------------------------------- text judgements


def test_degenerate_output_is_named():
    assert degenerate("!" * 256) == "the answer is one repeated token: '!' ×256"
    assert degenerate("the " * 30).startswith("the answer is one repeated token: 'the'")
    assert degenerate("   ") == "the answer is empty"
    assert degenerate("1, 2, 3, 4, 5, 6, 7, 8, 9, 10") is None


def test_number_runs_split_a_preamble_from_the_list():
    assert number_runs("Here are the numbers from 1 to 5: 1, 2, 3, 4, 5") == [[1], [5], [1, 2, 3, 4, 5]]
    assert number_runs("1\n2\n3") == [[1, 2, 3]]


def test_count_exact_passes_even_after_a_preamble():
    ok, why = judge_count("Sure! Counting from 1 to 100:\n" + ", ".join(map(str, range(1, 101))), 1, 100)
    assert ok, why


def test_count_with_45_missing_fails_naming_45():
    nums = [n for n in range(1, 101) if n != 45]
    ok, why = count.judge(", ".join(map(str, nums)), "stop")
    assert not ok
    assert why.startswith("missing 45 ")


def test_count_with_a_repeated_number_fails_naming_it():
    nums = list(range(1, 13)) + [12] + list(range(13, 101))
    ok, why = count.judge(", ".join(map(str, nums)), "stop")
    assert not ok
    assert "repeated 12" in why and "missing" not in why


def test_count_out_of_order_and_truncated():
    nums = list(range(1, 101))
    nums[9], nums[10] = nums[10], nums[9]
    ok, why = count.judge(", ".join(map(str, nums)), "stop")
    assert not ok and "out of order at position 10: 11 where 10 belongs" in why
    ok, why = count.judge(", ".join(map(str, range(1, 61))), "length")
    assert not ok and "missing 61, 62" in why and "cut at max_tokens" in why


def test_count_garbage_tokens_fail_as_garbage():
    ok, why = count.judge("!" * 1024, "length")
    assert not ok and "one repeated token: '!'" in why


def test_judge_number_takes_the_last_number():
    assert judge_number("12 + 30 = 42", 42)[0]
    assert judge_number("The answer is 1,234.", 1234)[0]
    ok, why = judge_number("42, I think. Or 41", 42)
    assert not ok and "ends with 41" in why


# ---------------------------------------------------------------------------------------------- the client


def test_stream_reassembles_multi_token_chunks_tool_calls_and_usage():
    api = FakeApi(lambda b: {"content": "alpha beta gamma delta", "reasoning": "think think",
                             "tool_calls": [("get_weather", '{"city": "Paris", "unit": "c"}')]})
    reply = api.client().stream({"model": "dsv", "messages": []})
    assert reply.content == "alpha beta gamma delta"
    assert reply.reasoning == "think think"
    assert [(c.name, c.args()) for c in reply.tool_calls] == [("get_weather", {"city": "Paris", "unit": "c"})]
    assert reply.finish_reason == "tool_calls"
    assert reply.completion_tokens == 6  # from the usage block, not the chunk count
    assert reply.chunks == 8 and reply.ttft_s is not None


def test_stream_error_chunk_and_missing_done_are_failures():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'data: {"error": {"message": "boom"}}\n\n')

    with pytest.raises(RequestFailed, match="error chunk: boom"):
        ApiClient("http://x", transport=httpx.MockTransport(handler)).stream({})

    def cut(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n')

    with pytest.raises(RequestFailed, match=r"without 'data: \[DONE\]'"):
        ApiClient("http://x", transport=httpx.MockTransport(cut)).stream({})


def test_http_errors_carry_the_servers_message():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "maximum context length is 4096"}})

    with pytest.raises(RequestFailed, match="HTTP 400: maximum context length is 4096"):
        ApiClient("http://x", transport=httpx.MockTransport(handler)).chat({})


def test_clip_keeps_both_ends():
    s = "a" * 500 + "END"
    assert clip(s, 100).endswith("END") and len(clip(s, 100)) < 130


# ---------------------------------------------------------------------------------------------- gates


def test_count_gate_passes_and_sends_thinking_off_at_temperature_0():
    api = FakeApi(text(", ".join(map(str, range(1, 101)))))
    r = count.run(env_for(api))
    assert r.status == "pass", r.as_dict()
    body = api.bodies[0]
    assert body["temperature"] == 0 and body["chat_template_kwargs"] == {"thinking": False}


def test_count_gate_fails_with_evidence():
    api = FakeApi(text(", ".join(str(n) for n in range(1, 101) if n != 45)))
    r = count.run(env_for(api))
    assert r.status == "fail"
    c = r.checks[0]
    assert "missing 45" in c.why and "Count from 1 to 100" in c.sent and "44, 46" in c.got


def _needle_answer(body: dict) -> Answer:
    m = re.search(r"The secret passphrase is ([A-Z]+-\d{4}-[A-Z]{3})\.", body["messages"][0]["content"])
    return {"content": m.group(1) if m else "none"}


def test_needle_gate_finds_a_fresh_needle_and_fails_when_blind():
    api = FakeApi(_needle_answer)
    r = needle.run(env_for(api, needle_tokens=(1000, 2000)))
    assert r.status == "pass", r.as_dict()
    sent = [b["messages"][0]["content"] for b in api.bodies if b["max_tokens"] == needle.ANSWER_TOKENS]
    assert len(sent) == 2 and sent[0][:300] != sent[1][:300]  # fresh filler from the first word on
    nonces = [re.search(r"passphrase is (\S+)\.", s).group(1) for s in sent]
    assert nonces[0] != nonces[1]
    blind = needle.run(env_for(FakeApi(text("I could not find a passphrase in the text.")), needle_tokens=(1000,)))
    assert blind.status == "fail"
    assert "lacks the needle" in blind.checks[0].why and "depth 50%" in blind.checks[0].sent


def test_needle_size_is_exact_with_tokenize_and_places_the_needle_at_depth():
    api = FakeApi(_needle_answer, tokenize=True)
    r = needle.run(env_for(api, needle_tokens=(3000,), needle_depth=0.25))
    assert r.status == "pass"
    assert r.data["sizes"][0]["tokenized"] == 3000 and r.data["sizes"][0]["sizing"] == "tokenize"
    prompt = [b for b in api.bodies if b["max_tokens"] == needle.ANSWER_TOKENS][0]["messages"][0]["content"]
    at = prompt.index("The secret passphrase is") / len(prompt)
    assert 0.2 < at < 0.3


def test_needle_without_tokenize_is_sized_from_two_probes_usage_blocks():
    api = FakeApi(_needle_answer)
    r = needle.run(env_for(api, needle_tokens=(5000, 9000)))
    assert r.status == "pass"
    for size in r.data["sizes"]:
        assert size["sizing"] == "calibrated" and size["tokenized"] is None
        assert abs(size["prompt_tokens"] - size["target"]) <= 20, size
    probes = [b for b in api.bodies if b["max_tokens"] == 1]
    assert len(probes) == 2  # calibrated once per run, not per size
    assert "sized from two probes' usage blocks" in r.checks[0].sent


def test_needle_judge():
    assert needle.judge("It is ORCHID-1234-ABC.", "ORCHID-1234-ABC")[0]
    assert needle.judge("orchid 1234 abc", "ORCHID-1234-ABC")[0]
    ok, why = needle.judge("ORCHID-1234", "ORCHID-1234-ABC")
    assert not ok and "it has only ORCHID, 1234" in why


def test_needle_sizes_over_max_model_len_are_not_sent():
    r = needle.run(env_for(FakeApi(_needle_answer), needle_tokens=(1000, 300_000)))
    assert r.status == "pass"
    assert r.checks[1].ok is None and "max_model_len 200,000" in r.checks[1].why


def _image_answer(colours: dict[str, str]) -> Callable[[dict], Answer]:
    def answer(body: dict) -> Answer:
        q = last_user(body)
        key = "stripes" if "stripes" in q else "two" if "two images" in q else "grid"
        return {"content": colours[key]}
    return answer


def test_image_pngs_are_valid_and_the_gate_passes_on_right_colours():
    data = image.stripes([image.RED, image.GREEN, image.BLUE])
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR"
    api = FakeApi(_image_answer({"stripes": "Red, green, blue.", "two": "first: red, second: blue",
                                 "grid": "Green."}))
    r = image.run(env_for(api))
    assert r.status == "pass", r.as_dict()
    urls = [p["image_url"]["url"] for b in api.bodies for p in b["messages"][0]["content"] if p["type"] == "image_url"]
    assert len(urls) == 4 and all(u.startswith("data:image/png;base64,") for u in urls)


def test_image_wrong_colour_fails():
    api = FakeApi(_image_answer({"stripes": "blue, green, red", "two": "first: red, second: blue",
                                 "grid": "The top-right square is yellow."}))
    r = image.run(env_for(api))
    assert r.status == "fail"
    bad = {c.name: c.why for c in r.failures()}
    assert set(bad) == {"V1 three stripes", "V3 grid top-right"}
    assert "expected red, green, blue in that order; the answer names blue, green, red" == bad["V1 three stripes"]
    assert "names yellow" in bad["V3 grid top-right"]


def test_image_is_skipped_on_a_text_only_lane():
    env = env_for(FakeApi(text("x")))
    env.vision = False
    r = image.run(env)
    assert r.status == "skip" and "vision off" in r.summary


def _tool_answer(calls_ok: bool) -> Callable[[dict], Answer]:
    def answer(body: dict) -> Answer:
        if any(m["role"] == "tool" for m in body["messages"]):
            return {"content": "In Paris it is 18°C with light rain."}
        q = last_user(body)
        if not calls_ok:
            return {"content": "I cannot call tools."}
        if body.get("tool_choice", {}) != "auto":
            return {"tool_calls": [("get_time", '{"city": "Sydney"}')], "finish": "stop"}
        if "Tokyo" in q:
            return {"tool_calls": [("get_weather", '{"city": "Tokyo", "unit": "c"}'),
                                   ("get_weather", '{"city": "Berlin", "unit": "c"}')]}
        return {"tool_calls": [("get_weather", '{"city": "Paris", "unit": "c"}')]}
    return answer


def test_tools_gate_passes_plain_and_streamed():
    api = FakeApi(_tool_answer(True))
    r = tools.run(env_for(api))
    assert r.status == "pass", r.as_dict()
    assert [c.name for c in r.checks] == ["T1 tool call", "T1 streamed", "T2 round trip", "T3 parallel", "T3 streamed",
                                          "T4 forced tool_choice"]
    forced = [b for b in api.bodies if isinstance(b.get("tool_choice"), dict)]
    assert forced[0]["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}


def test_tools_gate_fails_without_tool_calls():
    r = tools.run(env_for(FakeApi(_tool_answer(False))))
    assert r.status == "fail"
    bad = {c.name: c.why for c in r.failures()}
    assert set(bad) == {"T1 tool call", "T1 streamed", "T3 parallel", "T3 streamed", "T4 forced tool_choice"}
    assert bad["T1 tool call"] == "no tool_calls in the answer (it answered in text: 'I cannot call tools.')"


def test_tool_call_judgements():
    good = Reply(tool_calls=[ToolCall("1", "get_weather", '{"city": "Paris, France", "unit": "c"}')],
                 finish_reason="tool_calls")
    assert tools.judge_call(good, "get_weather", {"city": "Paris", "unit": "c"})[0]
    wrong_unit = Reply(tool_calls=[ToolCall("1", "get_weather", '{"city": "Paris", "unit": "f"}')],
                       finish_reason="tool_calls")
    assert tools.judge_call(wrong_unit, "get_weather", {"city": "Paris", "unit": "c"}) == (
        False, "argument unit is 'f', expected 'c'")
    bad_finish = Reply(tool_calls=good.tool_calls, finish_reason="stop")
    assert not tools.judge_call(bad_finish, "get_weather", {"city": "Paris"})[0]
    one = Reply(tool_calls=[ToolCall("1", "get_weather", '{"city": "Tokyo"}')], finish_reason="tool_calls")
    ok, why = tools.judge_parallel(one, ["Tokyo", "Berlin"])
    assert not ok and "no get_weather call for Berlin" in why
    assert not tools.judge_round_trip("It is sunny.")[0]


def test_reasoning_gate_needs_separate_reasoning_and_never_sends_medium():
    api = FakeApi(lambda b: {"reasoning": "91 = 7 * 13, so it is composite.", "content": "No. 91 = 7 × 13."})
    r = reasoning.run(env_for(api, reasoning_effort=25))
    assert r.status == "pass", r.as_dict()
    assert all(b["chat_template_kwargs"] == {"thinking": True} and b["reasoning_effort"] == 25 for b in api.bodies)
    leaked = reasoning.run(env_for(FakeApi(text("<think>91 = 7 * 13</think>No."))))
    assert leaked.status == "fail" and "<think> block is inside the answer" in leaked.checks[0].why
    with pytest.raises(ValueError, match="medium"):
        GateOptions(reasoning_effort="medium")
    plain = FakeApi(lambda b: {"reasoning": "x", "content": "No."})
    reasoning.run(env_for(plain))
    assert all("reasoning_effort" not in b for b in plain.bodies)


def test_streaming_gate_passes_and_counts_tokens_from_usage():
    api = FakeApi(text("The sky scatters blue light more than red light, so it looks blue by day."), chunk=12)
    r = streaming.run(env_for(api))
    assert r.status == "pass", r.as_dict()
    assert r.data["completion_tokens"] == 15 and r.data["chunks"] == 7  # 15 words in the usage block, 7 chunks
    assert r.checks[1].why == "usage block: 15 completion tokens in 7 chunks (2.14 tokens per chunk)"


def test_streaming_fails_when_streamed_differs():
    api = FakeApi(text("Blue light scatters more."), stream_answer=text("Red light scatters more."))
    r = streaming.run(env_for(api))
    assert r.status == "fail"
    assert [c.name for c in r.failures()] == ["streamed == non-streamed"]
    assert "differ at character 0" in r.failures()[0].why


def test_streaming_fails_without_the_usage_chunk():
    r = streaming.run(env_for(FakeApi(text("Blue light scatters more."), usage=False)))
    assert [c.name for c in r.failures()] == ["usage block"]
    assert "no usage block" in r.failures()[0].why


def test_determinism_passes_when_identical_and_fails_when_not():
    api = FakeApi(lambda b: {"content": f"answer to {last_user(b)}"})
    r = determinism.run(env_for(api))
    assert r.status == "pass" and r.data == {"identical": 8, "prompts": 8}
    assert len(api.bodies) == 16
    counter = iter(range(10_000))
    lock = threading.Lock()

    def drifting(b: dict) -> Answer:
        with lock:
            return {"content": f"answer {next(counter)} to {last_user(b)}"}

    r = determinism.run(env_for(FakeApi(drifting)))
    assert r.status == "fail" and len(r.failures()) == 8
    assert "concurrent text differs from solo" in r.failures()[0].why
    garbage = determinism.run(env_for(FakeApi(text("!" * 96))))
    assert garbage.status == "fail" and "identical garbage proves nothing" in garbage.failures()[0].why


def test_auth_gate_passes_when_keys_are_checked_and_fails_when_open():
    api = FakeApi(text("OK"), key=KEY)
    env = env_for(api, api_key=KEY)
    env.api_key_env = "LANE_KEY"
    r = auth.run(env)
    assert r.status == "pass", r.as_dict()
    assert KEY not in json.dumps(r.as_dict())
    open_api = FakeApi(text("OK"))
    env = env_for(open_api, api_key=KEY)
    env.api_key_env = "LANE_KEY"
    r = auth.run(env)
    assert r.status == "fail"
    assert len(r.failures()) == 4 and all("answered 200" in c.why for c in r.failures())
    assert auth.judge_refused(403)[0] and not auth.judge_refused(200)[0]


# ---------------------------------------------------------------------------------------------- soak


def _solver(body: dict) -> Answer:
    q = last_user(body)
    if m := re.search(r"Count from 1 to (\d+)", q):
        return {"content": ", ".join(map(str, range(1, int(m.group(1)) + 1)))}
    a, op, b = re.search(r"What is (\d+) ([+*]) (\d+)", q).groups()
    return {"content": str(int(a) + int(b) if op == "+" else int(a) * int(b))}


def test_soak_checks_every_answer_with_unique_tags():
    api = FakeApi(_solver)
    r = soak.run(env_for(api, soak_seconds=0.3, soak_streams=3))
    assert r.status == "pass", r.as_dict()
    tags = [re.match(r"\[([a-z]{12})\]", last_user(b)).group(1) for b in api.bodies]
    assert len(tags) == r.data["requests"] >= 3 and len(set(tags)) == len(tags)
    assert r.data["errors"] == 0 and r.data["ttft_s"]["p50"] is not None
    assert r.data["decode_tok_s"]["p50"] is not None and r.data["usage_missing"] == 0
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True} for b in api.bodies)


def test_soak_wrong_answers_are_errors_and_stop_it_early():
    def off_by_one(body: dict) -> Answer:
        ans = _solver(body)
        if ans["content"].startswith("1, 2"):
            ans["content"] = ans["content"].replace("2, ", "", 1)
        else:
            ans["content"] = str(int(ans["content"]) + 1)
        return ans

    r = soak.run(env_for(FakeApi(off_by_one), soak_seconds=30, soak_streams=2, soak_max_errors=4))
    assert r.status == "fail"
    assert r.data["seconds"] < 10 and r.data["errors"] >= 4
    assert "zero are allowed" in r.checks[0].why and "stopped early" in r.checks[0].why
    examples = [c for c in r.checks if c.name.startswith("error ")]
    assert examples and all(c.sent and c.why for c in examples)


def test_soak_fails_when_a_node_falls_under_its_floor_and_stops_the_load():
    calls = {"n": 0}
    GB = 10**9

    def sampler() -> dict[str, MemSample]:
        calls["n"] += 1
        head = 20 * GB - calls["n"] * GB  # a leak: one GB per sample
        return {"head": MemSample(head, floor=16 * GB, sigterm=2 * GB), "worker": MemSample(50 * GB, None, 2 * GB)}

    r = soak.run(env_for(FakeApi(_solver), soak_seconds=30, soak_streams=2, soak_sample_s=0.02, mem_sampler=sampler))
    assert r.status == "fail"
    assert r.data["seconds"] < 5  # stopped by the breach, not by the clock
    mem = {c.name: c for c in r.checks if c.name.startswith("memory")}
    assert mem["memory worker"].ok is True
    assert mem["memory head"].ok is False and "under its floor 16.00 GB" in mem["memory head"].why
    assert r.checks[0].ok is True  # the answers were right; memory failed the gate


def test_soak_fails_near_earlyooms_line_without_a_floor():
    GB = 10**9
    sample = {"spark4": MemSample(int(2.9 * GB), None, int(2.4 * GB))}
    r = soak.run(env_for(FakeApi(_solver), soak_seconds=0.2, soak_streams=1, mem_sampler=lambda: sample))
    bad = r.failures()
    assert r.status == "fail" and bad[0].name == "memory spark4"
    assert "within 1 GB of earlyoom's SIGTERM line 2.40 GB" in bad[0].why


def test_soak_counts_a_broken_sampler_as_unverified_memory():
    def broken() -> dict[str, MemSample]:
        raise OSError("ssh: connection refused")

    r = soak.run(env_for(FakeApi(_solver), soak_seconds=0.2, soak_streams=1, soak_sample_s=0.05, mem_sampler=broken))
    assert r.status == "fail"
    assert "could not be read" in r.failures()[0].why and "connection refused" in r.failures()[0].got


def test_percentile_nearest_rank():
    assert soak.percentile([], 50) is None
    assert soak.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert soak.percentile(list(map(float, range(1, 101))), 99) == 99.0


# ---------------------------------------------------------------------------------------------- the set


def test_default_set_follows_the_profile():
    assert default_gates(profile()) == ["models", "count100", "needle", "image", "tools", "reasoning", "streaming",
                                        "determinism", "soak"]
    text_only = profile(vision=False, tools=False, api_key_env="LANE_KEY")
    assert set(left_out(text_only)) == {"image", "tools"}
    assert "auth" in default_gates(text_only)


def test_parse_only_and_step_args():
    assert parse_only("soak,count100") == ["count100", "soak"]
    with pytest.raises(GateSetupError, match="unknown gate"):
        parse_only("count100,bogus")
    only, opts = options_from_args({"only": ["needle"], "soak_minutes": 0.5, "long": True})
    assert only == ["needle"] and opts.soak_seconds == 30 and max(opts.needle_tokens) == 500_000
    with pytest.raises(GateSetupError, match="unknown gates argument"):
        options_from_args({"soak_hours": 1})


def test_run_gates_skips_with_reasons_and_never_leaks_the_key(monkeypatch):
    # An endpoint that echoes the Authorization header back in its answers.
    def echo(body: dict) -> Answer:
        return {"content": "your header was Bearer " + KEY}

    api = FakeApi(echo, key=KEY)
    monkeypatch.setenv("LANE_KEY", KEY)
    p = profile(vision=False, tools=False, api_key_env="LANE_KEY")
    results = run_gates("http://fake", p, None, GateOptions(soak_seconds=0.2, soak_streams=1, needle_tokens=(500,)),
                        client=api.client(KEY))
    by = {r.name: r for r in results}
    assert by["image"].status == "skip" and "vision off" in by["image"].summary
    assert by["tools"].status == "skip"
    assert by["models"].status == "pass" and by["auth"].status == "pass"
    assert by["count100"].status == "fail"
    dumped = json.dumps([r.as_dict() for r in results])
    assert KEY not in dumped and "***" in dumped


def test_run_gates_refuses_an_unset_key(monkeypatch):
    monkeypatch.delenv("LANE_KEY", raising=False)
    with pytest.raises(GateSetupError, match=r"\$LANE_KEY, which is not set"):
        run_gates("http://fake", profile(api_key_env="LANE_KEY"), ["models"])


def test_an_unreachable_endpoint_fails_every_gate_quickly():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    client = ApiClient("http://fake", transport=httpx.MockTransport(refuse))
    results = run_gates("http://fake", profile(), ["models", "count100", "streaming"], client=client)
    assert [r.status for r in results] == ["fail", "fail", "fail"]
    assert "ConnectError" in results[1].checks[0].why


def test_a_crashing_gate_is_a_failure_not_a_traceback(monkeypatch):
    from sparkfleet.gates import run as runmod

    def boom(env):
        raise KeyError("content")

    monkeypatch.setitem(runmod.GATES, "count100", boom)
    api = FakeApi(text("OK"))
    results = run_gates("http://fake", profile(), ["models", "count100"], client=api.client())
    assert [r.status for r in results] == ["pass", "fail"]
    assert "the gate itself crashed (a sparkfleet bug): KeyError" in results[1].summary


def test_requests_keep_the_clients_timeout():
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return httpx.Response(200, json={"data": []})

    client = ApiClient("http://x", timeout_s=7.0, transport=httpx.MockTransport(handler))
    client.request("GET", "/v1/models")
    client.request("GET", "/v1/models", timeout_s=3.0)
    assert seen[0]["read"] == 7.0 and seen[1]["read"] == 3.0
