"""streaming: a stream ends with a usage block, and streamed text equals non-streamed text at temperature 0.

Token counts must come from that usage block: DSpark packs several tokens into one chunk, so a
client that counts chunks undercounts (the evidence shows chunks against tokens).
"""

from __future__ import annotations

import time

from sparkfleet.gates.client import Reply
from sparkfleet.gates.env import GateEnv, user
from sparkfleet.gates.result import GateResult, Recorder, verdict
from sparkfleet.gates.text import degenerate, first_difference

NAME = "streaming"
PROMPT = "In three or four sentences, explain why the sky is blue during the day and red at sunset."
MAX_TOKENS = 200


def judge_usage(streamed: Reply) -> tuple[bool, str]:
    n = streamed.completion_tokens
    if streamed.usage is None:
        return False, ("the stream carried no usage block (stream_options.include_usage was asked): token counts "
                       "would have to come from counting chunks, which undercounts multi-token chunks")
    if n is None or n <= 0:
        return False, f"the usage block has no completion_tokens: {streamed.usage}"
    per = n / streamed.chunks if streamed.chunks else 0.0
    return True, f"usage block: {n} completion tokens in {streamed.chunks} chunks ({per:.2f} tokens per chunk)"


def judge_same(plain: Reply, streamed: Reply) -> tuple[bool, str]:
    why = degenerate(plain.content)
    if why:
        return False, why + " (identical garbage proves nothing)"
    if plain.content != streamed.content:
        return False, ("streamed text differs from the non-streamed text: "
                       + first_difference(plain.content, streamed.content))
    if (plain.completion_tokens is not None and streamed.completion_tokens is not None
            and plain.completion_tokens != streamed.completion_tokens):
        return False, (f"same text but {plain.completion_tokens} completion tokens plain vs "
                       f"{streamed.completion_tokens} streamed")
    return True, f"identical ({len(plain.content)} characters)"


def run(env: GateEnv) -> GateResult:
    t0 = time.monotonic()
    rec = Recorder()
    body = env.body(user(PROMPT), max_tokens=MAX_TOKENS)
    sent = f"{PROMPT!r} (temperature 0, thinking off, max_tokens {MAX_TOKENS})"
    plain: Reply | None = None
    streamed: Reply | None = None
    with rec.step("non-streamed", sent) as c:
        plain = env.client.chat(body)
        c.got = plain.show()
        c.ok, c.why = (False, degenerate(plain.content)) if degenerate(plain.content) else (True, "answered")
    with rec.step("usage block", sent + ", stream: true, stream_options.include_usage") as c:
        streamed = env.client.stream(body)
        rec.judge(c, judge_usage(streamed), streamed.show() + f", usage {streamed.usage}")
    data = {}
    if plain is not None and streamed is not None:
        with rec.step("streamed == non-streamed", "the same request, plain and streamed") as c:
            rec.judge(c, judge_same(plain, streamed), f"plain {plain.content[:60]!r}…, streamed "
                      f"{streamed.content[:60]!r}…")
        data = {"completion_tokens": streamed.completion_tokens, "chunks": streamed.chunks,
                "ttft_s": round(streamed.ttft_s, 4) if streamed.ttft_s is not None else None}
    return verdict(NAME, rec.checks, t0, "usage block present; streamed text equals non-streamed", data)
