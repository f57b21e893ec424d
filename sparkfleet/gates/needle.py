"""needle: a fresh nonce hidden at a chosen depth in fresh random filler; the answer must quote it (HLT-41/47).

The filler is drawn anew on every run (from the first word on), so no prefix-cache entry from an
earlier run can answer for the engine. Sizes are prompt tokens as the server counts them: when the
endpoint has vLLM's /tokenize the filler is trimmed until the count is exact; otherwise the size is
estimated and the usage block's prompt_tokens is reported next to it.
"""

from __future__ import annotations

import random
import secrets
import string
import time
from dataclasses import dataclass

from sparkfleet.gates.client import ApiClient, RequestFailed, clip
from sparkfleet.gates.env import GateEnv
from sparkfleet.gates.result import Check, GateResult, Recorder, verdict
from sparkfleet.gates.text import degenerate

NAME = "needle"
ANSWER_TOKENS = 64
TOKENS_PER_WORD = 1.25  # first guess for lower-case English filler; /tokenize corrects it
FIT_ROUNDS = 8
CALIBRATION_WORDS = (200, 1600)  # probe sizes when the endpoint has no /tokenize
INTRO = "Read the following text carefully, then answer the question after it.\n\n"
QUESTION = ("\n\nQuestion: what is the secret passphrase stated in the text above? "
            "Reply with the passphrase only.")

# Plain words with no digits and none of the words a needle question uses (secret, passphrase,
# password, code, nonce...), so the needle is the only sentence that can answer.
WORDS = (
    "the", "a", "of", "and", "to", "in", "on", "at", "with", "from", "by", "over", "under", "after", "before",
    "river", "garden", "window", "morning", "evening", "harbour", "lantern", "meadow", "valley", "bridge", "forest",
    "mountain", "village", "station", "market", "library", "kitchen", "letter", "journey", "winter", "summer",
    "autumn", "spring", "ocean", "island", "road", "path", "field", "stone", "cloud", "rain", "wind", "light",
    "shadow", "music", "story", "teacher", "farmer", "sailor", "painter", "doctor", "child", "friend", "neighbour",
    "walks", "carries", "follows", "builds", "paints", "reads", "writes", "watches", "finds", "keeps", "opens",
    "closes", "crosses", "remembers", "gathers", "sings", "waits", "turns", "brings", "leaves", "quiet", "bright",
    "gentle", "distant", "early", "late", "slow", "careful", "small", "large", "old", "new", "warm", "cold",
    "green", "grey", "golden", "narrow", "wide", "open", "calm", "busy", "empty", "full", "soft", "steady",
    "slowly", "often", "always", "sometimes", "together", "again", "already", "still", "there", "here",
)
NONCE_WORDS = ("ORCHID", "FALCON", "COBALT", "JUNIPER", "TUNDRA", "QUARTZ", "SAFFRON", "ZEPHYR", "MAGNOLIA")


@dataclass
class Haystack:
    text: str  # the whole user message
    nonce: str
    depth: float
    words: int


def make_nonce(rng: random.Random) -> str:
    """e.g. 'ORCHID-4821-KQZ': a word, four digits and three letters; the filler has none of them."""
    word = rng.choice(NONCE_WORDS)
    digits = "".join(rng.choice(string.digits) for _ in range(4))
    letters = "".join(rng.choice(string.ascii_uppercase) for _ in range(3))
    return f"{word}-{digits}-{letters}"


def sentences(rng: random.Random, n_words: int) -> list[str]:
    """Random sentences of 8..16 words, n_words in all."""
    out: list[str] = []
    left = n_words
    while left > 0:
        k = min(left, rng.randint(8, 16))
        words = rng.choices(WORDS, k=k)
        out.append(words[0].capitalize() + " " + " ".join(words[1:]) + "." if k > 1 else words[0].capitalize() + ".")
        left -= k
    return out


def build(rng: random.Random, n_words: int, nonce: str, depth: float) -> Haystack:
    body = sentences(rng, n_words)
    at = round(depth * len(body))
    body.insert(at, f"The secret passphrase is {nonce}.")
    return Haystack(INTRO + " ".join(body) + QUESTION, nonce, depth, n_words)


def judge(answer: str, nonce: str) -> tuple[bool, str]:
    why = degenerate(answer)
    if why:
        return False, why
    if nonce.lower() in answer.lower():
        return True, f"quoted {nonce}"
    squashed = "".join(ch for ch in answer.upper() if ch.isalnum())
    if nonce.replace("-", "") in squashed:
        return True, f"quoted {nonce} (separators changed)"
    parts = [p for p in nonce.split("-") if p in answer.upper()]
    hint = f"; it has only {', '.join(parts)}" if parts else ""
    return False, f"the answer lacks the needle {nonce}{hint}"


def count_tokens(client: ApiClient, model: str, text: str) -> int | None:
    """The prompt's token count from vLLM's /tokenize (chat template applied), or None without it."""
    # A connection of its own: a server without the route may leave the unread body on a kept-alive
    # connection, and the next request on it would be misread.
    try:
        with client.clone() as probe:
            resp = probe.request("POST", "/tokenize", body={"model": model, "messages": [
                {"role": "user", "content": text}], "add_generation_prompt": True})
    except RequestFailed:
        return None
    if resp.status_code != 200:
        return None
    try:
        count = resp.json().get("count")
    except (ValueError, AttributeError):
        return None
    return count if isinstance(count, int) else None


@dataclass
class Sizing:
    """How filler words turn into prompt tokens on this endpoint: tokens ≈ intercept + slope × words."""

    slope: float = TOKENS_PER_WORD
    intercept: float = 0.0
    how: str = "estimated"  # tokenize | calibrated | estimated

    def words_for(self, target: int) -> int:
        return max(16, round((target - self.intercept) / self.slope))


def calibrate(env: GateEnv) -> Sizing:
    """Two small probes (their own random filler, so they share no prefix with the real haystack) read
    back through the usage block: the slope and intercept of tokens over words on this tokenizer."""
    points = []
    for words in CALIBRATION_WORDS:
        rng = random.Random(secrets.randbits(64))
        hay = build(rng, words, make_nonce(rng), 0.5)
        try:
            reply = env.client.chat(env.body([{"role": "user", "content": hay.text}], max_tokens=1))
        except RequestFailed:
            return Sizing()
        if reply.prompt_tokens is None:
            return Sizing()
        points.append((words, reply.prompt_tokens))
    (w1, p1), (w2, p2) = points
    slope = (p2 - p1) / (w2 - w1)
    if slope <= 0:
        return Sizing()
    return Sizing(slope, p1 - slope * w1, "calibrated")


def fit(client: ApiClient, model: str, target: int, depth: float, sizing: Sizing,
        seed: int | None = None) -> tuple[Haystack, int | None]:
    """A haystack of `target` prompt tokens: exact when /tokenize answers (count returned), else sized by
    `sizing` (count None)."""
    seed = secrets.randbits(64) if seed is None else seed
    nonce = make_nonce(random.Random(seed ^ 0x5EED))
    n_words = sizing.words_for(target)
    if sizing.how != "tokenize":
        return build(random.Random(seed), n_words, nonce, depth), None
    best: tuple[Haystack, int] | None = None
    for _ in range(FIT_ROUNDS):
        hay = build(random.Random(seed), n_words, nonce, depth)  # same seed: the same words, more or fewer
        count = count_tokens(client, model, hay.text)
        if count is None:  # /tokenize answered before but not now: keep the closest fit so far
            return best if best is not None else (hay, None)
        if best is None or abs(count - target) < abs(best[1] - target):
            best = (hay, count)
        if count == target:
            break
        per_word = max(0.5, count / max(1, n_words))
        step = round((target - count) / per_word)
        n_words = max(16, n_words + (step or (1 if count < target else -1)))
    assert best is not None
    return best


def run(env: GateEnv) -> GateResult:
    t0 = time.monotonic()
    rec = Recorder()
    limit = None
    try:
        for m in env.client.models():
            if m.get("id") == env.model and isinstance(m.get("max_model_len"), int):
                limit = m["max_model_len"]
    except RequestFailed:
        pass  # the models gate reports it; here the size simply is not checked against the limit
    sizes = []
    sizing: Sizing | None = None
    for target in env.options.needle_tokens:
        name = f"{target:,} tokens"
        if limit is not None and target > limit:
            rec.add(Check(name, None, why=f"not sent: the endpoint serves max_model_len {limit:,}"))
            continue
        send = min(target, limit - ANSWER_TOKENS) if limit is not None else target
        with rec.step(name) as c:
            if sizing is None:
                probe = random.Random(secrets.randbits(64))
                sizing = Sizing(how="tokenize") if count_tokens(env.client, env.model, build(
                    probe, 64, make_nonce(probe), 0.5).text) is not None else calibrate(env)
            hay, counted = fit(env.client, env.model, send, env.options.needle_depth, sizing)
            if counted is not None:
                size = f"{counted:,} prompt tokens (/tokenize)"
            elif sizing.how == "tokenize":
                size = f"~{send:,} prompt tokens (/tokenize stopped answering; estimated)"
            elif sizing.how == "calibrated":
                size = f"~{send:,} prompt tokens (sized from two probes' usage blocks; no /tokenize)"
            else:
                size = f"~{send:,} prompt tokens (estimated at {TOKENS_PER_WORD} tokens per word; no /tokenize)"
            if send != target:
                size += f", {target - send} under the target to leave room for the answer in max_model_len"
            c.sent = (f"{size}: fresh random filler, the needle 'The secret passphrase is {hay.nonce}.' at depth "
                      f"{hay.depth:.0%}, then {QUESTION.strip()!r}")
            reply = env.client.chat(env.body([{"role": "user", "content": hay.text}], max_tokens=ANSWER_TOKENS))
            rec.judge(c, judge(reply.content, hay.nonce), clip(reply.content, 160)
                      + (f" (usage: prompt_tokens {reply.prompt_tokens:,})" if reply.prompt_tokens else ""))
            sizes.append({"target": target, "sent": send, "sizing": sizing.how, "tokenized": counted,
                          "prompt_tokens": reply.prompt_tokens, "found": c.ok})
    return verdict(NAME, rec.checks, t0, "needle found at " + ", ".join(f"{s['target']:,}" for s in sizes)
                   + f" tokens (depth {env.options.needle_depth:.0%})", {"sizes": sizes})
