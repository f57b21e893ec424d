"""The sim engine's tokenizer: words and punctuation marks, each carrying the whitespace before it.

One tokenizer is used for everything (prompt counts, output chunks, usage blocks, /metrics), so the
numbers a client sees always agree with each other. Joining the pieces gives back the text exactly.
"""

from __future__ import annotations

import re

# A run of whitespace belongs to the token after it; whitespace at the very end is a token of its own.
_TOKEN = re.compile(r"\s*(?:\w+|[^\w\s])|\s+\Z")


def tokenize(text: str) -> list[str]:
    """Split text into pieces whose concatenation is the text."""
    return _TOKEN.findall(text)


def count(text: str) -> int:
    """How many tokens the text is."""
    return sum(1 for _ in _TOKEN.finditer(text))
