"""Judging answer text: degenerate output, counted lists, numbers. Pure functions."""

from __future__ import annotations

import re
from collections import Counter

# Between two numbers of one list: separators only (commas, spaces, newlines, bullets, full stops).
LIST_GAP = re.compile(r"^[\s,;.|/*•·\-–—]*$")
NUMBER = re.compile(r"\d+")
GROUPED = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+")  # 1,234,567 or 1234567


def degenerate(text: str) -> str | None:
    """Why the text is not an answer at all (empty, one repeated character or word), else None.

    The seeds' wrong-engine-commit symptom was one garbage token repeated to max_tokens (HLT-53);
    identical garbage would pass a text-equality check, so equality gates call this first.
    """
    stripped = text.strip()
    if not stripped:
        return "the answer is empty"
    chars = Counter(c for c in stripped if not c.isspace())
    if chars:
        char, n = chars.most_common(1)[0]
        if n >= 16 and n >= 0.9 * sum(chars.values()):
            return f"the answer is one repeated token: {char!r} ×{n}"
    words = stripped.split()
    if len(words) >= 8:
        word, n = Counter(words).most_common(1)[0]
        if n >= 0.9 * len(words):
            return f"the answer is one repeated token: {clip_word(word)!r} ×{n}"
    return None


def clip_word(word: str, limit: int = 24) -> str:
    return word if len(word) <= limit else word[:limit] + "…"


def number_runs(text: str) -> list[list[int]]:
    """Maximal runs of integers separated only by list separators, in order of appearance.

    "Here are the numbers from 1 to 5: 1, 2, 3, 4, 5" gives [[1], [5], [1, 2, 3, 4, 5]]: a preamble
    that repeats the range is a run of its own, so the list itself can be judged whole.
    """
    runs: list[list[int]] = []
    last_end = None
    for m in NUMBER.finditer(text):
        value = int(m.group())
        if runs and last_end is not None and LIST_GAP.match(text[last_end:m.start()]):
            runs[-1].append(value)
        else:
            runs.append([value])
        last_end = m.end()
    return runs


def judge_count(text: str, start: int, end: int) -> tuple[bool, str]:
    """The answer lists exactly start..end in order: nothing missing, repeated, extra or out of order."""
    why = degenerate(text)
    if why:
        return False, why
    runs = number_runs(text)
    if not runs:
        return False, "the answer has no numbers"
    listed = max(runs, key=len)  # the first longest run: the list itself, not a "1 to 100" preamble
    want = list(range(start, end + 1))
    if listed == want:
        return True, f"{start}..{end} exact ({len(want)} numbers)"
    problems = []
    seen = Counter(listed)
    missing = [n for n in want if n not in seen]
    if missing:
        problems.append(f"missing {_ints(missing)}")
    repeated = sorted(n for n, c in seen.items() if c > 1)
    if repeated:
        problems.append(f"repeated {_ints(repeated)}")
    extra = sorted({n for n in listed if not start <= n <= end})
    if extra:
        problems.append(f"outside {start}..{end}: {_ints(extra)}")
    if not problems:
        at = next(i for i, (a, b) in enumerate(zip(listed, want, strict=False)) if a != b)
        problems.append(f"out of order at position {at + 1}: {listed[at]} where {want[at]} belongs")
    return False, "; ".join(problems) + f" (the list has {len(listed)} numbers, from {listed[0]} to {listed[-1]})"


def _ints(values: list[int], limit: int = 10) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f" and {len(values) - limit} more" if len(values) > limit else "")


def numbers(text: str) -> list[int]:
    """Every integer in the text, thousands separators understood (1,234 is one number)."""
    return [int(m.group().replace(",", "")) for m in GROUPED.finditer(text)]


def judge_number(text: str, want: int) -> tuple[bool, str]:
    """The answer's last number is `want` (a worked answer may show its steps first)."""
    why = degenerate(text)
    if why:
        return False, why
    found = numbers(text)
    if not found:
        return False, f"no number in the answer; expected {want}"
    if found[-1] != want:
        return False, f"the answer ends with {found[-1]}; expected {want}"
    return True, f"{want}, correct"


def first_difference(a: str, b: str) -> str:
    """Where two texts part: the position and a little of each side."""
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo = max(0, n - 20)
    return f"they differ at character {n}: {a[lo:n + 30]!r} vs {b[lo:n + 30]!r}"
