"""tools: tool calls with arguments, a round trip, parallel calls and a forced tool_choice (HLT-43/45/46).

T1 get_weather {"city": "Paris", "unit": "c"} with finish_reason tool_calls; T2 the tool result goes
back and the answer uses it ("18°C with light rain"); T3 parallel get_weather for Tokyo and Berlin
in one turn; T4 tool_choice forcing get_time {"city": "Sydney"}. T1 and T3 are also streamed, with
the tool-call deltas reassembled.
"""

from __future__ import annotations

import json
import time

from sparkfleet.gates.client import Reply, ToolCall
from sparkfleet.gates.env import GateEnv, user
from sparkfleet.gates.result import GateResult, Recorder, skipped, verdict

NAME = "tools"
MAX_TOKENS = 256

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["c", "f"], "description": "c for Celsius, f for Fahrenheit"}},
        "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
TOOLS = [WEATHER, TIME]

T1 = "What's the weather in Paris right now? Use Celsius."
T3 = "What's the weather in Tokyo and in Berlin right now? Use Celsius for both."
T4 = "I need to phone a colleague in Sydney."
RESULT = {"city": "Paris", "temperature": 18, "unit": "c", "condition": "light rain"}


def _city(call: ToolCall) -> str:
    args = call.args() or {}
    return str(args.get("city", "")).strip()


def judge_call(reply: Reply, name: str, want: dict[str, str],
               finish: tuple[str, ...] = ("tool_calls",)) -> tuple[bool, str]:
    """A call of `name` whose arguments carry `want` (city prefix-matched: 'Paris, France' is fine)."""
    if not reply.tool_calls:
        return False, "no tool_calls in the answer" + (f" (it answered in text: {reply.content[:80]!r})"
                                                       if reply.content.strip() else "")
    calls = [c for c in reply.tool_calls if c.name == name]
    if not calls:
        return False, f"called {', '.join(c.name for c in reply.tool_calls)}, not {name}"
    call = calls[0]
    args = call.args()
    if args is None:
        return False, f"the arguments are not a JSON object: {call.arguments[:80]!r}"
    for key, value in want.items():
        got = str(args.get(key, "")).strip()
        if key == "city" and got.lower().startswith(value.lower()):
            continue
        if got.lower() != value.lower():
            return False, f"argument {key} is {got!r}, expected {value!r}"
    if reply.finish_reason not in finish:
        return False, f"finish_reason is {reply.finish_reason!r}, expected {' or '.join(map(repr, finish))}"
    return True, f"{name}({json.dumps(args, ensure_ascii=False)})"


def judge_parallel(reply: Reply, cities: list[str]) -> tuple[bool, str]:
    if not reply.tool_calls:
        return False, "no tool_calls in the answer"
    weather = [c for c in reply.tool_calls if c.name == "get_weather"]
    got = [_city(c) for c in weather]
    missing = [city for city in cities if not any(g.lower().startswith(city.lower()) for g in got)]
    if missing:
        shown = ", ".join(c.show() for c in reply.tool_calls)
        return False, f"no get_weather call for {', '.join(missing)} (calls: {shown})"
    if reply.finish_reason != "tool_calls":
        return False, f"finish_reason is {reply.finish_reason!r}, expected 'tool_calls'"
    return True, f"{len(weather)} get_weather calls in one turn: {', '.join(got)}"


def judge_round_trip(text: str) -> tuple[bool, str]:
    low = text.lower()
    if "18" in low and "rain" in low:
        return True, "the answer uses the tool result (18, light rain)"
    return False, "the answer does not use the tool result (expected 18 and light rain in it)"


def _round_trip_messages(first: Reply | None) -> list[dict]:
    """T1's own call when it made one, else a well-formed call, so T2 is judged on its own."""
    call = None
    if first is not None:
        call = next((c for c in first.tool_calls if c.name == "get_weather"), None)
    call = call or ToolCall("call_gate_t2", "get_weather", json.dumps({"city": "Paris", "unit": "c"}))
    return [*user(T1),
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps(RESULT)}]


def run(env: GateEnv) -> GateResult:
    if not env.tools:
        return skipped(NAME, "the profile has tools off (no tool parser)")
    t0 = time.monotonic()
    rec = Recorder()
    first: Reply | None = None
    auto = {"tools": TOOLS, "tool_choice": "auto"}
    with rec.step("T1 tool call", f"{T1!r} with get_weather, get_time (tool_choice auto)") as c:
        first = env.client.chat(env.body(user(T1), max_tokens=MAX_TOKENS, **auto))
        rec.judge(c, judge_call(first, "get_weather", {"city": "Paris", "unit": "c"}), first.show())
    with rec.step("T1 streamed", f"{T1!r}, stream: true") as c:
        reply = env.client.stream(env.body(user(T1), max_tokens=MAX_TOKENS, **auto))
        rec.judge(c, judge_call(reply, "get_weather", {"city": "Paris", "unit": "c"}), reply.show())
    messages = _round_trip_messages(first)
    with rec.step("T2 round trip", f"the get_weather call and its result {json.dumps(RESULT)} sent back") as c:
        reply = env.client.chat(env.body(messages, max_tokens=MAX_TOKENS, **auto))
        rec.judge(c, judge_round_trip(reply.content), reply.show())
    with rec.step("T3 parallel", f"{T3!r}") as c:
        reply = env.client.chat(env.body(user(T3), max_tokens=MAX_TOKENS, **auto))
        rec.judge(c, judge_parallel(reply, ["Tokyo", "Berlin"]), reply.show())
    with rec.step("T3 streamed", f"{T3!r}, stream: true") as c:
        reply = env.client.stream(env.body(user(T3), max_tokens=MAX_TOKENS, **auto))
        rec.judge(c, judge_parallel(reply, ["Tokyo", "Berlin"]), reply.show())
    forced = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    with rec.step("T4 forced tool_choice", f"{T4!r} with tool_choice forcing get_time") as c:
        reply = env.client.chat(env.body(user(T4), max_tokens=MAX_TOKENS, **forced))
        # vLLM ends a named tool_choice with finish_reason "stop": the call is constrained, not parsed
        rec.judge(c, judge_call(reply, "get_time", {"city": "Sydney"}, ("tool_calls", "stop")), reply.show())
    return verdict(NAME, rec.checks, t0, "T1 call (plain and streamed), T2 round trip, T3 parallel (plain and "
                   "streamed), T4 forced tool_choice")

