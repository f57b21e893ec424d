"""What the sim engine says: it does the work on the request it got, so answer gates test something real.

Counting requests are counted, needles are searched for in the prompt, PNGs are decoded and their
colours named, tools are chosen from the request's own schemas with arguments read from the user's
text, and a tool result is read back into the answer. Everything else gets a short sentence seeded by
a hash of the request, so temperature 0 gives the same text alone or under concurrency. Faults that
change answers (garbage-tokens, count-off-by-one, needle-blind, no-tool-calls, nondeterministic)
are applied here. All functions are pure except for the randomness the `nondeterministic` fault and
sampling at temperature > 0 ask for.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from sparkfleet.simengine import png

GARBAGE_TOKEN = "!"  # what NaN logits decode to on many checkpoints; the seeds saw one repeated token
GARBAGE_MAX = 256
LEAD_INS = ("Sure.", "Here you go:", "Okay:", "Answer:", "Certainly:", "As asked:", "Right:")  # no digits/colours

NEEDLE_WORDS = (r"secret(?:\s+\w+)?|pass\s?phrase|password|nonce|magic\s+(?:number|word)|code\s?word|"
                r"hidden\s+(?:number|word|phrase|code)|special\s+(?:number|word)|needle")
NEEDLE = re.compile(rf"\b({NEEDLE_WORDS})\b", re.I)
ASKING = re.compile(r"\b(what|which|tell|find|give|repeat|quote|recall|say|report|state)\b", re.I)
COUNT_RANGE = re.compile(r"\bcount(?:ing)?\s+(?:up\s+|down\s+)?from\s+(-?\d+)\s+(?:to|through|until|up to)\s+(-?\d+)",
                         re.I)
COUNT_TO = re.compile(r"\bcount(?:ing)?\s+(?:up\s+)?to\s+(\d+)", re.I)
PRIME = re.compile(r"\bis\s+(\d+)\s+(?:a\s+)?prime\b", re.I)
ARITH = re.compile(r"(-?\d+(?:\.\d+)?)\s*([-+*/x×÷])\s*(-?\d+(?:\.\d+)?)")
QUADRANT = re.compile(r"\b(top|upper|bottom|lower)[\s-]*(left|right)\b", re.I)
PLACE = re.compile(r"(?<![\w])([A-ZÀ-Þ][\w'’.-]*(?:\s+[A-ZÀ-Þ][\w'’.-]*)*)")

NOT_PLACES = {
    "what", "what's", "whats", "how", "is", "are", "can", "could", "would", "will", "please", "tell", "give", "get",
    "show", "find", "check", "call", "use", "i", "i'm", "the", "a", "an", "and", "or", "in", "on", "at", "for",
    "then", "also", "hi", "hello", "hey", "thanks", "thank", "do", "does", "celsius", "fahrenheit", "kelvin", "c",
    "f", "which", "when", "where", "who", "why", "it", "it's", "my", "me", "both", "let", "let's", "now", "today",
    "tomorrow", "yes", "no", "ok", "okay", "sure", "weather", "time", "look", "answer", "current", "you",
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "january", "february", "march",
    "april", "may", "june", "july", "august", "september", "october", "november", "december", "utc", "gmt",
}
LOCATION_KEYS = ("city", "location", "place", "town", "country", "region", "destination", "where", "area")
TEXT_KEYS = ("query", "q", "text", "prompt", "input", "question", "expression", "search", "message")
GENERIC_NAME_WORDS = {
    "get", "set", "fetch", "lookup", "look", "find", "query", "retrieve", "current", "info", "information", "data",
    "tool", "do", "run", "make", "the", "for", "by", "of", "api", "func", "function", "call", "check", "up",
}
STOP_WORDS = {"about", "which", "there", "their", "would", "could", "should", "these", "those", "where", "given",
              "return", "returns", "using", "other", "value", "values", "string", "number", "object"}
UNIT_ALIASES = {"c": ("celsius", "centigrade", "°c"), "f": ("fahrenheit", "°f"), "k": ("kelvin",)}
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")
WORDS = ("quiet", "river", "lantern", "harbour", "amber", "signal", "meadow", "copper", "window", "orbit", "garden",
         "thread", "silver", "morning", "circuit", "compass", "valley", "paper", "engine", "echo", "bridge", "cloud",
         "marble", "path", "little", "steady", "distant", "careful", "bright", "simple", "gentle", "patient", "open",
         "carries", "follows", "holds", "turns", "finds", "keeps", "meets", "shows", "joins", "waits", "builds",
         "across", "beside", "under", "beyond", "toward", "through", "along", "within", "the", "a", "every", "one")


class ApiError(Exception):
    """An OpenAI-style error response (status, message, type, param)."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass(frozen=True)
class Options:
    """Engine-wide settings that change answers."""

    faults: frozenset[str] = frozenset()
    vision: bool = True
    tools: bool = True
    thinking_default: bool = False


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it


@dataclass
class Answer:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


# ---------------------------------------------------------------------------------------------- helpers


def digest(*parts: Any) -> str:
    """A stable hash of JSON-able parts (the seed of every deterministic choice)."""
    text = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def text_of(content: Any) -> str:
    """The text of a message's content (a string, or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                out.append(str(part.get("text", "")))
            elif isinstance(part, str):
                out.append(part)
        return "\n".join(out)
    return str(content)


def image_urls(content: Any) -> list[str]:
    """Image URLs in a message's content parts, in order."""
    urls = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                ref = part.get("image_url")
                url = ref.get("url") if isinstance(ref, dict) else ref
                if isinstance(url, str):
                    urls.append(url)
    return urls


def places(text: str) -> list[str]:
    """Capitalised names in the text that are not sentence words: the cities a user asks about."""
    found: list[tuple[list[str], bool]] = []
    for m in PLACE.finditer(text):
        words = m.group(1).split()
        while words and words[0].lower().strip(".'’") in NOT_PLACES:
            words.pop(0)
        while words and words[-1].lower().strip(".'’") in NOT_PLACES:
            words.pop()
        if not words:
            continue
        before = text[:m.start()].rstrip()
        # A capital at the start of a sentence may just be the sentence's first word ("Compare ...");
        # a lone word is kept when it is clearly part of a list ("Tokyo and Berlin", "Tokyo, Berlin").
        initial = (not before or before[-1] in ".!?:\n\"'“") and words[0] == m.group(1).split()[0]
        listed = re.match(r"\s*(?:,|and\b|or\b|&|vs\b)", text[m.end():]) is not None
        found.append((words, initial and (not listed or len(words) > 1)))
    others = any(not initial for _, initial in found)
    out: list[str] = []
    for words, initial in found:
        if initial and others:
            words = words[1:]  # drop the sentence's first word; other names show what the user meant
        phrase = re.sub(r"['’]s$", "", " ".join(words)).rstrip(".'’")
        if phrase and phrase not in out:
            out.append(phrase)
    return out


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", name)
    return [w.lower() for w in re.split(r"[\s_\-.]+", spaced) if w]


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(word)}", text, re.I) is not None


# ---------------------------------------------------------------------------------------------- tasks


def count_answer(text: str, faults: frozenset[str], limit: int) -> tuple[str, str] | None:
    """`count from A to B` / `count to N` -> the numbers, comma separated (and the plan, as reasoning)."""
    m = COUNT_RANGE.search(text)
    if m:
        start, end = int(m.group(1)), int(m.group(2))
    else:
        m = COUNT_TO.search(text)
        if not m:
            return None
        start, end = 1, int(m.group(1))
    step = 1 if end >= start else -1
    # Each number is at least one token plus a comma, so more than `limit` numbers can never be sent.
    numbers = []
    for value in range(start, end + step, step):
        numbers.append(value)
        if len(numbers) > limit:
            break
    if "count-off-by-one" in faults and len(numbers) > 1:
        del numbers[len(numbers) // 2]
    plan = f"The user wants the numbers from {start} to {end} in order. I will list every one, separated by commas."
    return ", ".join(str(n) for n in numbers), plan


def needle_answer(question: str, haystack: str, faults: frozenset[str]) -> tuple[str, str] | None:
    """A question about a secret/passphrase/nonce -> the sentence in the prompt that states it."""
    # The question is the last sentence asking something; the haystack may be in the same message.
    asks = re.findall(r"[^.!?\n]*\?", question)
    ask = asks[-1] if asks else re.split(r"(?<=[.!])\s+|\n+", question.strip())[-1]
    m = NEEDLE.search(ask)
    if not m or not ASKING.search(ask):
        return None
    keyword = re.sub(r"\s+", " ", m.group(1).lower())
    head = keyword.split()[0]
    plan = f"The question asks for the {keyword}. I will look for the sentence in the text that states it."
    if "needle-blind" in faults:
        return f"I could not find a {keyword} in the text.", plan
    candidates = []
    for sentence in re.split(r"(?<=[.!?])\s+|\n+", haystack):
        s = sentence.strip()
        if not s or s.endswith("?") or not re.search(rf"\b{re.escape(head)}", s, re.I):
            continue
        candidates.append(s)
    if not candidates:
        return f"I could not find a {keyword} in the text.", plan
    # Prefer the sentence carrying a value (digits, or a code-like token) over filler mentioning the word.
    valued = [s for s in candidates if re.search(r"\d|\b[A-Z0-9]{2,}[-_][A-Z0-9]+\b", s)]
    return (valued or candidates)[0], plan


def prime_answer(text: str) -> tuple[str, str] | None:
    m = PRIME.search(text)
    if not m:
        return None
    n = int(m.group(1))
    plan = f"I check whether {n} has a divisor other than 1 and itself by trying divisors up to its square root."
    if n < 2:
        return f"No. {n} is not a prime number.", plan
    d = 2
    while d * d <= n:
        if n % d == 0:
            return f"No. {n} = {d} × {n // d}.", plan
        d += 1
    return f"Yes. {n} is a prime number.", plan


def arithmetic_answer(text: str) -> tuple[str, str] | None:
    if not re.search(r"\b(what is|what's|compute|calculate|how much is|evaluate)\b|=\s*\?", text, re.I):
        return None
    m = ARITH.search(text)
    if not m:
        return None
    a, op, b = float(m.group(1)), m.group(2), float(m.group(3))
    if op == "+":
        value = a + b
    elif op == "-":
        value = a - b
    elif op in "*x×":
        value = a * b
    elif b == 0:
        return "Division by zero is undefined.", "The divisor is zero."
    else:
        value = a / b
    shown = str(int(value)) if value == int(value) else f"{value:.6g}"
    return f"{m.group(1)} {op} {m.group(3)} = {shown}.", f"I compute {m.group(1)} {op} {m.group(3)}."


def image_answer(images: list[png.Image], question: str) -> tuple[str, str]:
    """Name colours by reading the decoded pixels: several images, a grid square, stripes, or the whole."""
    q = question.lower()
    if len(images) >= 2:
        parts = []
        for i, img in enumerate(images):
            ordinal = ORDINALS[i] if i < len(ORDINALS) else f"{i + 1}th"
            parts.append(f"the {ordinal} image is {png.region_colour(img, 0, 0, 1, 1)}")
        text = "; ".join(parts)
        return text[0].upper() + text[1:] + ".", f"There are {len(images)} images; I look at each one's main colour."
    img = images[0]
    m = QUADRANT.search(question)
    if m:
        top = m.group(1).lower() in ("top", "upper")
        left = m.group(2).lower() == "left"
        x0, y0 = (0.0 if left else 0.5), (0.0 if top else 0.5)
        colour = png.region_colour(img, x0, y0, x0 + 0.5, y0 + 0.5)
        where = f"{'top' if top else 'bottom'}-{'left' if left else 'right'}"
        return f"The {where} square is {colour}.", f"I look at the {where} quarter of the image."
    if "stripe" in q or "left to right" in q or "band" in q:
        names = png.stripes(img)
        return f"From left to right: {', '.join(names)}.", "I read the colours along the middle row, left to right."
    votes: dict[str, int] = {}
    for j in range(4):
        for i in range(4):
            c = png.region_colour(img, i / 4, j / 4, (i + 1) / 4, (j + 1) / 4)
            votes[c] = votes.get(c, 0) + 1
    ranked = [c for c, _ in sorted(votes.items(), key=lambda kv: -kv[1])]
    if len(ranked) == 1:
        return f"The image is {ranked[0]}.", "The whole image has one colour."
    return f"The image shows {', '.join(ranked[:-1])} and {ranked[-1]}.", "I list the colours by the area they cover."


def generic_answer(text: str, rng: random.Random) -> tuple[str, str]:
    """A short sentence chosen by the seeded generator, naming a word or two of the prompt."""
    seen: list[str] = []
    for w in re.findall(r"[A-Za-z]{5,}", text):
        lw = w.lower()
        if lw not in seen and lw not in STOP_WORDS:
            seen.append(lw)
        if len(seen) == 2:
            break
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
    sentence = " ".join(words)
    sentence = sentence[0].upper() + sentence[1:] + "."
    topic = f"On {' and '.join(seen)}: " if seen else ""
    return topic + sentence, f"The prompt has {len(text.split())} words; a short answer will do."


# ---------------------------------------------------------------------------------------------- tools


def _function(tool: Any) -> dict:
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict) or not tool["function"].get("name"):
        raise ApiError(400, "each tool needs {'type': 'function', 'function': {'name': ...}}", param="tools")
    params = tool["function"].get("parameters")
    if params is not None and not (isinstance(params, dict) and isinstance(params.get("properties", {}), dict)
                                   and isinstance(params.get("required", []), list)):
        raise ApiError(400, f"tool {tool['function']['name']!r}: parameters must be a JSON schema object "
                       "(properties an object, required a list)", param="tools")
    return tool["function"]


def _score(fn: dict, text: str) -> int:
    score = 0
    for w in _words(fn["name"]):
        if w not in GENERIC_NAME_WORDS and len(w) >= 3 and _has_word(text, w):
            score += 3
    for w in set(re.findall(r"[a-z]{5,}", str(fn.get("description", "")).lower())):
        if w not in STOP_WORDS and _has_word(text, w):
            score += 1
    return score


def _match_enum(enum: list, text: str) -> Any:
    low = text.lower()
    for value in enum:
        v = str(value).lower()
        aliases = {v} if len(v) > 1 else set()
        for unit, names in UNIT_ALIASES.items():
            if v == unit or v in names:
                aliases.update(names)
        if any(re.search(rf"(?<![\w]){re.escape(a)}(?![\w])", low) for a in aliases):
            return value
    return None


def fill_arguments(fn: dict, text: str, place: str | None) -> dict:
    """Arguments for a function, read from the user's text following the function's JSON schema."""
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    found = places(text)
    args: dict[str, Any] = {}
    for pname, schema in props.items():
        schema = schema if isinstance(schema, dict) else {}
        ptype, enum, low = schema.get("type"), schema.get("enum"), pname.lower()
        value: Any = None
        if isinstance(enum, list) and enum:
            value = _match_enum(enum, text)
            if value is None and pname in required:
                value = enum[0]
        elif any(k in low for k in LOCATION_KEYS):
            value = place or (found[0] if found else None)
        elif ptype in ("integer", "number"):
            m = re.search(r"-?\d+(?:\.\d+)?", text)
            if m:
                value = int(float(m.group())) if ptype == "integer" else float(m.group())
        elif ptype == "boolean":
            value = False if pname in required else None
        elif ptype in (None, "string"):
            if "unit" in low:
                for unit, names in UNIT_ALIASES.items():
                    if any(n in text.lower() for n in names):
                        value = names[0] if unit != "c" else "celsius"
                        break
            elif low in TEXT_KEYS:
                value = text.strip()
            elif "date" in low:
                m = re.search(r"\d{4}-\d{2}-\d{2}", text)
                value = m.group() if m else None
            if value is None and pname in required:
                value = place or (found[0] if found else text.strip())
        elif pname in required:
            value = [] if ptype == "array" else {}
        if value is not None:
            args[pname] = value
    return args


def _has_location(fn: dict) -> bool:
    props = (fn.get("parameters") or {}).get("properties") or {}
    return any(any(k in p.lower() for k in LOCATION_KEYS) for p in props)


def plan_tool_calls(body: dict, user_text: str, opts: Options, key: str) -> list[ToolCall]:
    """The tool calls a model would make for this request, or [] to answer in text."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise ApiError(400, "tools must be a list", param="tools")
    fns = [_function(t) for t in tools]
    choice = body.get("tool_choice")
    if not fns or choice == "none":
        return []
    forced: dict | None = None
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        forced = next((f for f in fns if f["name"] == wanted), None)
        if forced is None:
            raise ApiError(400, f"tool_choice names {wanted!r}, which is not among the tools", param="tool_choice")
    elif choice not in (None, "auto", "required"):
        raise ApiError(400, f"tool_choice {choice!r} is not one of none, auto, required or a named function",
                       param="tool_choice")
    elif not opts.tools:
        # What vLLM answers when the lane was started without a tool parser (PARSERS=0).
        raise ApiError(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
    if forced is not None:
        fn = forced
    else:
        scored = sorted(((_score(f, user_text), i) for i, f in enumerate(fns)), key=lambda s: (-s[0], s[1]))
        best, index = scored[0]
        if best < 3 and choice != "required":
            return []
        fn = fns[index]
    cities = places(user_text) if _has_location(fn) else []
    targets: list[str | None] = list(cities) if cities else [None]
    if body.get("parallel_tool_calls") is False:
        targets = targets[:1]
    calls = []
    for i, place in enumerate(targets):
        args = fill_arguments(fn, user_text, place)
        calls.append(ToolCall(f"chatcmpl-tool-{digest(key, i)[:32]}", fn["name"], json.dumps(args, ensure_ascii=False)))
    return calls


def render_tool_result(content: str) -> str:
    """A tool result as words: weather-like JSON as '18°C with light rain', other JSON as key: value pairs."""
    try:
        data = json.loads(content)
    except (ValueError, TypeError):
        return content.strip()
    if not isinstance(data, dict):
        return content.strip()
    low = {str(k).lower(): v for k, v in data.items()}
    temp = next((low[k] for k in ("temperature", "temp", "temp_c", "temperature_c") if k in low), None)
    cond = next((low[k] for k in ("condition", "conditions", "description", "weather", "summary") if k in low), None)
    if temp is not None:
        unit = str(low.get("unit", "")).lower()
        mark = "°C" if unit in ("c", "celsius") else "°F" if unit in ("f", "fahrenheit") else "°"
        return f"{temp}{mark} with {cond}" if cond else f"{temp}{mark}"
    return ", ".join(f"{k}: {v}" for k, v in data.items())


def tool_result_answer(messages: list[dict]) -> tuple[str, str] | None:
    """After `role: tool` messages, answer with what the tools returned."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    later = messages[last_user + 1:]
    results = [m for m in later if m.get("role") == "tool"]
    if not results:
        return None
    calls: dict[str, tuple[str, dict]] = {}
    for m in later:
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                args = {}
            calls[str(call.get("id"))] = (str(fn.get("name", "the tool")), args if isinstance(args, dict) else {})
    sentences = []
    for m in results:
        name, args = calls.get(str(m.get("tool_call_id")), (str(m.get("name") or "the tool"), {}))
        place = next((v for k, v in args.items() if any(x in k.lower() for x in LOCATION_KEYS)), None)
        rendered = render_tool_result(text_of(m.get("content"))).rstrip(".")
        if "weather" in name.lower() and place:
            sentences.append(f"The weather in {place}: {rendered}.")
        else:
            sentences.append(f"{name}{' for ' + str(place) if place else ''} returned: {rendered}.")
    return " ".join(sentences), "The tool answered; I report its result."


# ---------------------------------------------------------------------------------------------- entry points


def _rng(body: dict, key: str, faults: frozenset[str]) -> random.Random:
    temperature = body.get("temperature", 1.0)
    seed = body.get("seed")
    if "nondeterministic" in faults:
        return random.Random()
    if temperature == 0 or temperature is None:
        return random.Random(key)
    if seed is not None:
        return random.Random(f"{key}:{seed}")
    return random.Random()  # sampling without a seed: text may differ between calls, as on a real engine


def _finish(content: str, plan: str, thinking: bool, rng: random.Random, faults: frozenset[str]) -> Answer:
    if "nondeterministic" in faults:
        content = f"{rng.choice(LEAD_INS)} {content}"
    return Answer(content=content, reasoning=plan if thinking else "")


def _text_task(question: str, haystack: str, opts: Options, limit: int) -> tuple[str, str] | None:
    return (count_answer(question, opts.faults, limit) or needle_answer(question, haystack, opts.faults)
            or prime_answer(question) or arithmetic_answer(question))


def chat(body: dict, opts: Options, limit: int) -> Answer:
    """Answer a /v1/chat/completions body. `limit` is the most tokens that can be sent back."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise ApiError(400, "messages must be a non-empty list of objects", param="messages")
    effort = body.get("reasoning_effort")
    if isinstance(effort, str) and effort.lower() == "medium":
        # The DeepSeek-V4.1 chat template raises on 'medium' and vLLM answers 400 (LCH-G11).
        raise ApiError(400, "reasoning_effort 'medium' is not supported by the DeepSeek-V4.1 chat template "
                       "(use 'low', 'high', 'max' or a number)", param="reasoning_effort")
    kwargs = body.get("chat_template_kwargs") or {}
    thinking = bool(kwargs.get("thinking", kwargs.get("enable_thinking", opts.thinking_default)))
    key = digest({k: v for k, v in body.items()
                  if k not in ("stream", "stream_options", "model", "max_tokens", "max_completion_tokens", "user")})
    users = [m for m in messages if m.get("role") == "user"]
    question = text_of(users[-1].get("content")) if users else ""
    urls = image_urls(users[-1].get("content")) if users else []
    if urls and not opts.vision:
        raise ApiError(400, "this lane was started text-only: image inputs are not supported", param="messages")
    images = []
    for url in urls:
        try:
            images.append(png.decode_data_url(url))
        except png.PngError as exc:
            raise ApiError(400, f"could not read image: {exc}", param="messages") from None
    if "garbage-tokens" in opts.faults:
        return Answer(content=GARBAGE_TOKEN * min(limit, GARBAGE_MAX))
    rng = _rng(body, key, opts.faults)
    done = tool_result_answer(messages)
    if done:
        return _finish(done[0], done[1], thinking, rng, opts.faults)
    calls = plan_tool_calls(body, question, opts, key)
    if calls:
        fn_names = ", ".join(sorted({c.name for c in calls}))
        plan = f"The user asks for something {fn_names} can answer, so I call it with arguments from the request."
        if "no-tool-calls" in opts.faults:
            return _finish(f"I would need to call {fn_names} for that, but I will not.", plan, thinking, rng,
                           opts.faults)
        return Answer(reasoning=plan if thinking else "", tool_calls=calls)
    if images:
        content, plan = image_answer(images, question)
        return _finish(content, plan, thinking, rng, opts.faults)
    haystack = "\n".join(text_of(m.get("content")) for m in messages if m.get("role") in ("system", "user"))
    task = _text_task(question, haystack, opts, limit)
    if task is None:
        task = generic_answer(question, rng)
    return _finish(task[0], task[1], thinking, rng, opts.faults)


def completion(body: dict, prompt: str, opts: Options, limit: int) -> Answer:
    """Answer a /v1/completions prompt: the same tasks as chat, without tools or images."""
    if "garbage-tokens" in opts.faults:
        return Answer(content=GARBAGE_TOKEN * min(limit, GARBAGE_MAX))
    key = digest(prompt, body.get("seed"), body.get("stop"))
    rng = _rng(body, key, opts.faults)
    task = _text_task(prompt, prompt, opts, limit) or generic_answer(prompt, rng)
    return _finish(task[0], "", False, rng, opts.faults)
