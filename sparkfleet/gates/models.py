"""models / health: /health is 200, /v1/models lists every served name, and a request naming each is answered.

/v1/models can answer while the engine behind it is dead; /health cannot (vLLM answers 503 on
EngineDeadError), so both are asked.
"""

from __future__ import annotations

import time

from sparkfleet.gates.client import clip
from sparkfleet.gates.env import GateEnv, user
from sparkfleet.gates.result import GateResult, Recorder, verdict

NAME = "models"


def judge_listed(listed: list[str], wanted: list[str]) -> tuple[bool, str]:
    missing = [n for n in wanted if n not in listed]
    if missing:
        return False, f"/v1/models lacks {', '.join(missing)} (it lists {', '.join(listed) or 'nothing'})"
    return True, f"lists {', '.join(wanted)}"


def run(env: GateEnv) -> GateResult:
    t0 = time.monotonic()
    rec = Recorder()
    with rec.step("health", "GET /health") as c:
        resp = env.client.request("GET", "/health")
        c.got = f"HTTP {resp.status_code}" + (f" {clip(resp.text, 80)!r}" if resp.text.strip() else "")
        c.ok = resp.status_code == 200
        c.why = "healthy" if c.ok else f"/health answered {resp.status_code}: the engine is not serving"
    wanted = env.served_names or [env.model]
    with rec.step("models", "GET /v1/models") as c:
        listed = [str(m.get("id")) for m in env.client.models()]
        c.got = ", ".join(listed) or "(empty list)"
        rec.judge(c, judge_listed(listed, wanted))
    for name in wanted:
        body = {**env.body(user("Say OK."), max_tokens=4), "model": name}
        with rec.step(f"answers as {name}", f"POST /v1/chat/completions model={name!r}, max_tokens 4") as c:
            reply = env.client.chat(body)
            c.got = reply.show()
            c.ok, c.why = True, "answered (HTTP 200)"
    return verdict(NAME, rec.checks, t0, f"/health 200; /v1/models lists and answers {', '.join(wanted)}")
