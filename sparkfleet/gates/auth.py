"""auth: with an API key set, no key and a wrong key are refused (401/403) and the right key is served (HLT-48).

The key itself never appears in evidence: checks describe it as "the key from $ENV".
"""

from __future__ import annotations

import secrets
import time

from sparkfleet.gates.client import clip
from sparkfleet.gates.env import GateEnv, user
from sparkfleet.gates.result import GateResult, Recorder, skipped, verdict

NAME = "auth"
REFUSED = (401, 403)


def judge_refused(status: int) -> tuple[bool, str]:
    if status in REFUSED:
        return True, f"refused with {status}"
    return False, f"answered {status}: the endpoint serves requests without a valid key"


def run(env: GateEnv) -> GateResult:
    if not env.api_key_env:
        return skipped(NAME, "the profile sets no API key (api_key_env)")
    if not env.options.api_key:
        return skipped(NAME, f"${env.api_key_env} is not set here, so the key cannot be tested")
    t0 = time.monotonic()
    rec = Recorder()
    wrong = "sk-wrong-" + secrets.token_hex(8)
    chat = env.body(user("Say OK."), max_tokens=4)
    variants = [("no key", None), ("wrong key", wrong)]
    for route, method, body in (("/v1/chat/completions", "POST", chat), ("/v1/models", "GET", None)):
        for label, key in variants:
            with rec.step(f"{label}: {method} {route}", f"{method} {route} with {label}") as c:
                resp = env.client.request(method, route, body=body, key=key)
                c.got = f"HTTP {resp.status_code} {clip(resp.text, 100)!r}"
                rec.judge(c, judge_refused(resp.status_code))
    with rec.step("right key: POST /v1/chat/completions", f"POST /v1/chat/completions with the key from "
                  f"${env.api_key_env}") as c:
        resp = env.client.request("POST", "/v1/chat/completions", body=chat)
        c.got = f"HTTP {resp.status_code}"
        c.ok = resp.status_code == 200
        c.why = "served" if c.ok else f"refused the right key with {resp.status_code}: {clip(resp.text, 100)}"
    return verdict(NAME, rec.checks, t0, f"no key and a wrong key refused; the key from ${env.api_key_env} served")
