"""A small PNG reader (stdlib zlib) and colour naming, so the sim engine answers image questions by looking.

Supported: 8-bit, non-interlaced, colour types 0 (grey), 2 (RGB), 3 (palette), 4 (grey+alpha) and
6 (RGBA), filter types 0-4. Alpha is composited over white. Anything else raises PngError, which
the API turns into a 400 like an engine that cannot read the image.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass

SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_PIXELS = 4_000_000  # pure-Python unfiltering is slow; the gates send small generated images
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}

# Reference colours; several shades may share a name (pure and web green are both "green").
PALETTE: list[tuple[str, tuple[int, int, int]]] = [
    ("red", (255, 0, 0)), ("red", (200, 30, 30)),
    ("green", (0, 128, 0)), ("green", (0, 255, 0)), ("green", (40, 180, 60)),
    ("blue", (0, 0, 255)), ("blue", (30, 60, 200)), ("blue", (0, 0, 139)),
    ("yellow", (255, 255, 0)), ("yellow", (240, 220, 40)),
    ("orange", (255, 165, 0)), ("orange", (255, 120, 0)),
    ("purple", (128, 0, 128)), ("purple", (150, 60, 200)),
    ("pink", (255, 192, 203)), ("pink", (255, 105, 180)),
    ("cyan", (0, 255, 255)), ("magenta", (255, 0, 255)),
    ("white", (255, 255, 255)), ("black", (0, 0, 0)), ("gray", (128, 128, 128)), ("gray", (192, 192, 192)),
    ("brown", (139, 69, 19)),
]


class PngError(ValueError):
    """The bytes are not a PNG this reader supports."""


@dataclass
class Image:
    width: int
    height: int
    rows: list[bytes]  # RGB, 3 bytes per pixel

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        x = min(max(x, 0), self.width - 1)
        y = min(max(y, 0), self.height - 1)
        row = self.rows[y]
        return row[3 * x], row[3 * x + 1], row[3 * x + 2]


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(raw: bytes, width: int, height: int, bpp: int) -> list[bytearray]:
    stride = width * bpp
    if len(raw) < height * (stride + 1):
        raise PngError("image data is shorter than the header says")
    rows: list[bytearray] = []
    prev = bytearray(stride)
    pos = 0
    for _ in range(height):
        ftype = raw[pos]
        line = bytearray(raw[pos + 1:pos + 1 + stride])
        pos += stride + 1
        if ftype == 1:  # Sub
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
        elif ftype == 3:  # Average
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:  # Paeth
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                upleft = prev[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + _paeth(left, prev[i], upleft)) & 0xFF
        elif ftype != 0:
            raise PngError(f"unknown filter type {ftype}")
        rows.append(line)
        prev = line
    return rows


def _over_white(value: int, alpha: int) -> int:
    return (value * alpha + 255 * (255 - alpha)) // 255


def decode(data: bytes) -> Image:
    """Decode PNG bytes into RGB rows."""
    if not data.startswith(SIGNATURE):
        raise PngError("not a PNG (bad signature)")
    pos = len(SIGNATURE)
    header: tuple[int, ...] | None = None
    palette = b""
    idat: list[bytes] = []
    while pos + 12 <= len(data):
        length, ctype = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length] or b"\0\0\0\0")
        if len(body) != length or zlib.crc32(ctype + body) != crc:
            raise PngError(f"chunk {ctype!r} is truncated or has a bad CRC")
        pos += 12 + length
        if ctype == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif ctype == b"PLTE":
            palette = body
        elif ctype == b"IDAT":
            idat.append(body)
        elif ctype == b"IEND":
            break
    if header is None:
        raise PngError("no IHDR chunk")
    width, height, depth, colour, _compression, _filter, interlace = header
    if depth != 8 or colour not in CHANNELS or interlace != 0:
        raise PngError(f"unsupported PNG: bit depth {depth}, colour type {colour}, interlace {interlace} "
                       "(the sim reads 8-bit non-interlaced images)")
    if width == 0 or height == 0 or width * height > MAX_PIXELS:
        raise PngError(f"unsupported size {width}x{height}")
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as exc:
        raise PngError(f"image data does not inflate: {exc}") from None
    bpp = CHANNELS[colour]
    out: list[bytes] = []
    for line in _unfilter(raw, width, height, bpp):
        if colour == 2:
            out.append(bytes(line))
            continue
        rgb = bytearray(3 * width)
        for x in range(width):
            px = line[x * bpp:(x + 1) * bpp]
            if colour == 0:
                r = g = b = px[0]
            elif colour == 4:
                r = g = b = _over_white(px[0], px[1])
            elif colour == 3:
                if 3 * px[0] + 3 > len(palette):
                    raise PngError("palette index out of range")
                r, g, b = palette[3 * px[0]:3 * px[0] + 3]
            else:
                r, g, b = (_over_white(px[i], px[3]) for i in range(3))
            rgb[3 * x:3 * x + 3] = bytes((r, g, b))
        out.append(bytes(rgb))
    return Image(width, height, out)


def decode_data_url(url: str) -> Image:
    """Decode a `data:image/png;base64,...` URL (the sim never fetches remote images)."""
    if not url.startswith("data:"):
        raise PngError("only data: URLs are read by the sim engine (it makes no outside requests)")
    meta, sep, payload = url[5:].partition(",")
    if not sep or ";base64" not in meta:
        raise PngError("expected a base64 data URL")
    try:
        data = base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise PngError(f"bad base64 payload: {exc}") from None
    return decode(data)


def name(rgb: tuple[int, int, int]) -> str:
    """The palette name nearest to an RGB colour."""
    best, best_d = "gray", None
    for label, ref in PALETTE:
        d = sum((a - b) ** 2 for a, b in zip(rgb, ref, strict=True))
        if best_d is None or d < best_d:
            best, best_d = label, d
    return best


def region_colour(img: Image, x0: float, y0: float, x1: float, y1: float) -> str:
    """The most common colour name in a region given as fractions of the image (sampled on a grid)."""
    votes: dict[str, int] = {}
    for j in range(7):
        for i in range(7):
            x = int((x0 + (x1 - x0) * (i + 0.5) / 7) * img.width)
            y = int((y0 + (y1 - y0) * (j + 0.5) / 7) * img.height)
            label = name(img.pixel(x, y))
            votes[label] = votes.get(label, 0) + 1
    return max(votes.items(), key=lambda kv: kv[1])[0]


def stripes(img: Image) -> list[str]:
    """Colour names of the vertical bands along the middle row, left to right (tiny runs ignored)."""
    y = img.height // 2
    runs: list[list] = []
    for x in range(img.width):
        label = name(img.pixel(x, y))
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    keep = [label for label, width in runs if width >= max(1, img.width // 50)]
    out: list[str] = []
    for label in keep:
        if not out or out[-1] != label:
            out.append(label)
    return out


def size_of_data_url(url: str) -> tuple[int, int] | None:
    """Width and height from a PNG data URL's IHDR, without decoding the pixels (None if unreadable)."""
    meta, sep, payload = url.partition(",")
    if not sep or not meta.startswith("data:"):
        return None
    try:
        head = base64.b64decode(payload[:64] + "=" * (-len(payload[:64]) % 4))
    except (binascii.Error, ValueError):
        return None
    if not head.startswith(SIGNATURE) or head[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", head[16:24])
    return width, height
