"""reasoning: thinking on request returns its reasoning separately from the answer, plain and streamed.

HLT-54's example: "Is 91 a prime number?" comes back with reasoning_content and "No. 91 = 7 × 13".
Reasoning that leaks into the content (a <think> block in the answer) means the reasoning parser is
missing. `reasoning_effort: medium` is never sent: the V4.1 template rejects it (GateOptions refuses it).
"""

from __future__ import annotations

import re
import time

from sparkfleet.gates.client import Reply
from sparkfleet.gates.env import GateEnv, user
from sparkfleet.gates.result import GateResult, Recorder, verdict
from sparkfleet.gates.text import degenerate

NAME = "reasoning"
PROMPT = "Is 91 a prime number? Answer yes or no, and if not, give its factors."
MAX_TOKENS = 4096  # room to think; lanes default to a high effort
THINK_TAG = re.compile(r"</?think>", re.I)
SAYS_NO = re.compile(r"\b(no|not (?:a )?prime|composite)\b", re.I)


def judge(reply: Reply) -> tuple[bool, str]:
    if not reply.reasoning.strip():
        why = "no reasoning content came back separately"
        if THINK_TAG.search(reply.content):
            why += " (a <think> block is inside the answer: the reasoning parser is not splitting it out)"
        return False, why
    why = degenerate(reply.content)
    if why:
        return False, why
    if THINK_TAG.search(reply.content):
        return False, "a <think> tag is left in the answer"
    if not (SAYS_NO.search(reply.content) or ("7" in reply.content and "13" in reply.content)):
        return False, "the answer does not say 91 is not prime (91 = 7 × 13)"
    return True, f"{len(reply.reasoning)} characters of reasoning, then the answer"


def run(env: GateEnv) -> GateResult:
    t0 = time.monotonic()
    rec = Recorder()
    extra = {}
    if env.options.reasoning_effort is not None:
        extra["reasoning_effort"] = env.options.reasoning_effort
    body = env.body(user(PROMPT), max_tokens=MAX_TOKENS, thinking=True, **extra)
    sent = f"{PROMPT!r} with chat_template_kwargs thinking: true" + (
        f", reasoning_effort {env.options.reasoning_effort!r}" if extra else "")
    with rec.step("thinking on request", sent) as c:
        reply = env.client.chat(body)
        rec.judge(c, judge(reply), reply.show())
    with rec.step("streamed reasoning", sent + ", stream: true") as c:
        reply = env.client.stream(body)
        rec.judge(c, judge(reply), reply.show())
    return verdict(NAME, rec.checks, t0, "reasoning comes back separately from the answer, plain and streamed")
