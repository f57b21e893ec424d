"""determinism: concurrent == solo. Prompts at temperature 0 sent one by one, then all at once, must give
identical text (HLT-49/50: "drafted == serial 8 of 8 token for token").

Batching, speculative drafting and prefix caching must not change greedy output; when they do, a
lane gives different answers under load than in a quick manual test.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from sparkfleet.gates.client import ApiClient, RequestFailed
from sparkfleet.gates.env import GateEnv, user
from sparkfleet.gates.result import Check, GateResult, Recorder, verdict
from sparkfleet.gates.text import degenerate, first_difference

NAME = "determinism"
MAX_TOKENS = 96
PROMPTS = (
    "Describe a lighthouse at night in two sentences.",
    "List five uses for a paperclip, one per line.",
    "Explain what a hash table is to a new programmer, briefly.",
    "Write a short haiku about autumn rain.",
    "Give three tips for keeping houseplants healthy.",
    "Summarise the water cycle in two sentences.",
    "Name four planets and one fact about each.",
    "Explain why bread rises, in plain words.",
    "Describe the smell of a forest after rain.",
    "Give two reasons people keep diaries.",
    "Explain what an index in a database is for.",
    "Write one sentence about the sea from a gull's point of view.",
)


def judge(solo: str, together: str) -> tuple[bool, str]:
    why = degenerate(solo)
    if why:
        return False, why + " (identical garbage proves nothing)"
    if solo != together:
        return False, "concurrent text differs from solo: " + first_difference(solo, together)
    return True, f"identical ({len(solo)} characters)"


def _ask(client: ApiClient, body: dict) -> str | RequestFailed:
    try:
        return client.chat(body).content
    except RequestFailed as exc:
        return exc


def run(env: GateEnv) -> GateResult:
    t0 = time.monotonic()
    rec = Recorder()
    n = max(1, min(env.options.determinism_prompts, len(PROMPTS)))
    bodies = [env.body(user(p), max_tokens=MAX_TOKENS) for p in PROMPTS[:n]]
    solo = [_ask(env.client, b) for b in bodies]
    clients = [env.client.clone() for _ in bodies]  # one connection each, so they really run together
    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            together = list(pool.map(_ask, clients, bodies))
    finally:
        for c in clients:
            c.close()
    for i, (prompt, a, b) in enumerate(zip(PROMPTS[:n], solo, together, strict=True)):
        check = Check(f"prompt {i + 1}", None, sent=repr(prompt))
        if isinstance(a, RequestFailed) or isinstance(b, RequestFailed):
            check.ok = False
            check.why = f"request failed ({'solo' if isinstance(a, RequestFailed) else 'concurrent'}): " \
                        f"{a if isinstance(a, RequestFailed) else b}"
        else:
            check.ok, check.why = judge(a, b)
            check.got = repr(a[:120]) if check.ok else f"solo {a[:80]!r} / concurrent {b[:80]!r}"
        rec.add(check)
    same = sum(1 for c in rec.checks if c.ok)
    return verdict(NAME, rec.checks, t0, f"{same} of {n} identical solo and {n}-way concurrent",
                   {"identical": same, "prompts": n})
