"""count100: "count from 1 to 100" at temperature 0 with thinking off lists exactly 1..100 (HLT-40).

An answer that drops or repeats a number, or that is one garbage token repeated (the seeds' wrong
engine commit, HLT-53), fails with what was missing or repeated.
"""

from __future__ import annotations

import re
import time

from sparkfleet.gates.env import GateEnv, user
from sparkfleet.gates.result import GateResult, Recorder, verdict
from sparkfleet.gates.text import judge_count

NAME = "count100"
TOP = 100
PROMPT = f"Count from 1 to {TOP}. Write every number, separated by commas, and nothing else."
MAX_TOKENS = 1024  # 100 numbers and commas take about 300 tokens; room for a preamble


def judge(text: str, finish_reason: str | None, top: int = TOP) -> tuple[bool, str]:
    ok, why = judge_count(text, 1, top)
    if not ok and finish_reason == "length":
        why += " (finish_reason length: the answer was cut at max_tokens)"
    return ok, why


def near_problem(text: str, why: str) -> str:
    """The few characters of the answer around the first missing or repeated number, or ''."""
    m = re.search(r"(?:missing|repeated) (\d+)", why)
    if not m:
        return ""
    n = int(m.group(1))
    hit = re.search(rf"(?<!\d){n - 1 if why.startswith('missing') else n}(?!\d)", text)
    if not hit:
        return ""
    return f"; around it: {text[max(0, hit.start() - 12):hit.end() + 16]!r}"


def run(env: GateEnv) -> GateResult:
    t0 = time.monotonic()
    rec = Recorder()
    with rec.step("count 1..100", f"{PROMPT!r} (temperature 0, thinking off, max_tokens {MAX_TOKENS})") as c:
        reply = env.client.chat(env.body(user(PROMPT), max_tokens=MAX_TOKENS))
        ok, why = judge(reply.content, reply.finish_reason)
        rec.judge(c, (ok, why), reply.show() + ("" if ok else near_problem(reply.content, why)))
    return verdict(NAME, rec.checks, t0, f"1..{TOP} exact, in order")
