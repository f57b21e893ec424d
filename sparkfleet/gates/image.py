"""image: generated PNGs with known answers, sent as base64 data URLs (HLT-42/45).

V1 three stripes left to right -> red, green, blue; V2 two images in one message -> first red,
second blue; V3 a 2x2 grid's top-right square -> green. The PNGs are written here with zlib and
struct (no imaging library), so what was sent is exactly known.
"""

from __future__ import annotations

import base64
import re
import struct
import time
import zlib
from collections.abc import Callable

from sparkfleet.gates.env import GateEnv
from sparkfleet.gates.result import GateResult, Recorder, skipped, verdict
from sparkfleet.gates.text import degenerate

NAME = "image"
RGB = tuple[int, int, int]
RED, GREEN, BLUE, YELLOW = (220, 20, 20), (20, 170, 40), (20, 40, 220), (240, 220, 30)
SIZE = 96
COLOUR_WORDS = ("red", "green", "blue", "yellow", "orange", "purple", "violet", "pink", "cyan", "magenta", "white",
                "black", "gray", "grey", "brown", "teal", "turquoise")
COLOUR = re.compile(r"\b(" + "|".join(COLOUR_WORDS) + r")\b", re.I)


def png(width: int, height: int, pixel: Callable[[int, int], RGB]) -> bytes:
    """An 8-bit RGB PNG (colour type 2, no interlace, filter 0 on every row)."""
    raw = bytearray()
    for y in range(height):
        raw.append(0)
        for x in range(width):
            raw.extend(pixel(x, y))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(raw), 9)) \
        + chunk(b"IEND", b"")


def stripes(colours: list[RGB], size: int = SIZE) -> bytes:
    """Vertical stripes, left to right."""
    return png(size, size, lambda x, y: colours[x * len(colours) // size])


def solid(colour: RGB, size: int = SIZE // 2) -> bytes:
    return png(size, size, lambda x, y: colour)


def grid(tl: RGB, tr: RGB, bl: RGB, br: RGB, size: int = SIZE) -> bytes:
    half = size // 2
    return png(size, size, lambda x, y: ((tl, tr), (bl, br))[y >= half][x >= half])


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def colours_named(text: str) -> list[str]:
    """Colour words in order of first mention (grey counted as gray)."""
    out: list[str] = []
    for m in COLOUR.finditer(text):
        word = m.group(1).lower().replace("grey", "gray")
        if word not in out:
            out.append(word)
    return out


def judge(text: str, want: list[str]) -> tuple[bool, str]:
    """The answer names `want` first, in that order (later mentions may add detail)."""
    why = degenerate(text)
    if why:
        return False, why
    named = colours_named(text)
    if named[:len(want)] == want:
        return True, "names " + ", ".join(want)
    return False, (f"expected {', '.join(want)} in that order; the answer names "
                   + (", ".join(named) if named else "no colour"))


# name, images, question, the colours the answer must name first
CASES: list[tuple[str, list[bytes], str, list[str]]] = [
    ("V1 three stripes", [stripes([RED, GREEN, BLUE])],
     "This image has three vertical stripes of colour. Name the colours from left to right, comma separated.",
     ["red", "green", "blue"]),
    ("V2 two images", [solid(RED), solid(BLUE)],
     "Here are two images. What is the colour of each? Answer as: first: <colour>, second: <colour>.",
     ["red", "blue"]),
    ("V3 grid top-right", [grid(RED, GREEN, BLUE, YELLOW)],
     "This image is a 2x2 grid of coloured squares. What colour is the top-right square? Answer with one word.",
     ["green"]),
]


def message(images: list[bytes], question: str) -> list[dict]:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": data_url(b)}} for b in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]


def run(env: GateEnv) -> GateResult:
    if not env.vision:
        return skipped(NAME, "the profile has vision off (text-only lane)")
    t0 = time.monotonic()
    rec = Recorder()
    for name, images, question, want in CASES:
        sent = f"{len(images)} PNG(s) {', '.join(f'{len(b)} bytes' for b in images)} + {question!r}"
        with rec.step(name, sent) as c:
            reply = env.client.chat(env.body(message(images, question), max_tokens=64))
            rec.judge(c, judge(reply.content, want), reply.show())
    return verdict(NAME, rec.checks, t0, "V1 red, green, blue; V2 red then blue; V3 green")
