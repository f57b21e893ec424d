#!/usr/bin/env python3
"""sparkfleet Engram copy: a sparse, verified, resumable node-local copy of one rank's Engram rows.

Stdlib only: this file is shipped to nodes (~/.cache/sparkfleet/bin/) and run with the system
python3; `sparkfleet engram-local copy` imports it, so both run the same code.

    python3 engram_copy.py copy --source CKPT --dest DIR --tensors 'PATTERN{layer}*' \
        --range 1:START:END --range 14:START:END [--no-verify]
    python3 engram_copy.py copy --source CKPT --dest DIR --whole-shards --shards 47,48
    python3 engram_copy.py verify --dest DIR [--source CKPT]
    python3 engram_copy.py status --dest DIR [--source CKPT]
    python3 engram_copy.py < request.json      # {"op": "copy" | "verify" | "status", ...}

Each shard holding selected tensors is written as a sparse file of the same name and size with the
rank's bytes (and the shard's header) at their original offsets, so the engine's reader uses the
local file unchanged. Chunks are read with pread, hashed, written with pwrite, made durable, dropped
from the page cache and (unless --no-verify) read back from the disk and compared. A journal
(.engram-progress.jsonl) records each durable chunk so an interrupted copy resumes where it
stopped; engram-manifest.json is written last and atomically, and only a complete copy has one.
Output: JSON lines on stdout ({"event": "plan" | "progress" | "done" | "error" | "verify" | ...}).
Exit 0 ok, 1 a fault (disk full, source changed, verify failed), 2 bad input.
Paths are node paths (the library functions take `root=` to work under another directory, for tests).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import fnmatch
import hashlib
import json
import mmap
import os
import queue
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

TOOL_VERSION = "1.0"
MANIFEST_SCHEMA = "sparkfleet.engram-manifest/1"
JOURNAL_SCHEMA = "sparkfleet.engram-progress/1"
MANIFEST = "engram-manifest.json"
JOURNAL = ".engram-progress.jsonl"
STATUS = ".engram-status.json"
LOCK = ".engram-lock"
HASH = "sha256"
MiB = 1 << 20
# 8 MiB chunks in 32 MiB windows: the verified copy at 0.95x and 1.11x dd (two runs) where 4 in 16 gave 0.83x on the
# 2-core VM (bench/engram_copy.py, docs/engram-local.md), for 230 MiB of peak RSS instead of 128 on a node of 121 GiB
DEFAULT_CHUNK = 8 * MiB
DEFAULT_WINDOW = 32 * MiB  # bytes per fdatasync + read-back; verify keeps up to 4 + VERIFIERS windows of buffers
READ_AHEAD = 2  # chunks the reader thread may hold beyond the window
# Threads reading windows back. One: on the virtio disks measured (docs/engram-local.md) a second was no
# faster and costs another window of buffers; an NVMe with deep queues may like 2.
VERIFIERS = 1
MAX_HEADER = 100 * MiB  # safetensors refuses larger headers too
WHOLE_TENSOR_MAX = 1 * MiB  # 0-/1-D tensors of a layer (NVFP4's global scale) are copied whole
PROGRESS_EVERY_S = 0.5

# Bits per element of every safetensors dtype (F4/F6 are sub-byte, packed).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "I64": 64,
    "U64": 64, "F64": 64,
}
FP8_VALUES = {"F8_E4M3"}  # fp8 tables: e4m3 values, per-32 E8M0 scales (F8_E8M0 or U8)
NVFP4_VALUES = {"U8", "F4"}  # NVFP4 tables: e2m1 packed two per byte, e4m3 scales per 16
SNAPSHOT_REV = re.compile(r"/snapshots/([0-9a-f]{40})(?:/|$)")
SHARD_NUMBER = re.compile(r"(\d+)-of-\d+\.safetensors$")


class EngramError(Exception):
    """A failure with one line for people; code 2 = bad input, 1 = a fault during the copy."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# -- safetensors headers ---------------------------------------------------------------------------
@dataclass
class Tensor:
    name: str
    dtype: str
    shape: list[int]
    begin: int  # relative to the data start (8 + header length)
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    def row_bytes(self) -> int | None:
        """Bytes per first-dimension row; None for scalars or rows that are not whole bytes."""
        if not self.shape:
            return None
        bits = DTYPE_BITS[self.dtype]
        for d in self.shape[1:]:
            bits *= d
        return bits // 8 if bits % 8 == 0 else None


@dataclass
class Shard:
    path: str  # real path read
    name: str  # file name (the copy has the same name)
    size: int
    mtime_ns: int
    header_len: int  # N: the JSON header's length; data starts at 8 + N
    header_sha256: str  # of the first 8 + N bytes
    tensors: dict[str, Tensor]

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    def identity(self) -> dict:
        return {"file": self.name, "size": self.size, "mtime_ns": self.mtime_ns,
                "header_len": self.header_len, "header_sha256": self.header_sha256}


def read_shard(path: str) -> Shard:
    """Parse a safetensors header (8-byte LE length, JSON, data); every problem names the file."""
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            first = f.read(8)
            if len(first) < 8:
                raise EngramError(f"{path}: not a safetensors file ({st.st_size} bytes, shorter than "
                                  "the 8-byte header length)")
            n = int.from_bytes(first, "little")
            if n < 2 or n > MAX_HEADER:
                raise EngramError(f"{path}: not a safetensors file (header length {n} is implausible)")
            if 8 + n > st.st_size:
                raise EngramError(f"{path}: truncated header: it declares {n} bytes but only "
                                  f"{st.st_size - 8} follow the length")
            raw = f.read(n)
    except OSError as exc:
        raise EngramError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) < n:
        raise EngramError(f"{path}: truncated header: read {len(raw)} of {n} bytes")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise EngramError(f"{path}: not a safetensors file (the header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise EngramError(f"{path}: not a safetensors file (the header is not a JSON object)")
    tensors: dict[str, Tensor] = {}
    data_len = st.st_size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor(path, name, info, data_len)
    spans = sorted((t.begin, t.end, t.name) for t in tensors.values() if t.nbytes)
    for (_, e1, a), (b2, _, b) in zip(spans, spans[1:], strict=False):
        if b2 < e1:
            raise EngramError(f"{path}: tensors {a} and {b} overlap in the data section")
    return Shard(path=path, name=os.path.basename(path), size=st.st_size, mtime_ns=st.st_mtime_ns,
                 header_len=n, header_sha256=hashlib.sha256(first + raw).hexdigest(), tensors=tensors)


def _tensor(path: str, name: str, info: Any, data_len: int) -> Tensor:
    if not isinstance(info, dict):
        raise EngramError(f"{path}: tensor {name}: header entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise EngramError(f"{path}: tensor {name}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise EngramError(f"{path}: tensor {name}: shape {shape!r} is not a list of sizes")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise EngramError(f"{path}: tensor {name}: data_offsets {offsets!r} are not [begin, end]")
    numel = 1
    for d in shape:
        numel *= d
    bits = numel * DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
        raise EngramError(f"{path}: tensor {name}: data_offsets hold {offsets[1] - offsets[0]} bytes but "
                          f"shape {shape} of {dtype} needs {bits / 8:g}")
    if offsets[1] > data_len:
        raise EngramError(f"{path}: truncated: tensor {name} ends at data byte {offsets[1]} but the file "
                          f"has {data_len} bytes of data")
    return Tensor(name, dtype, list(shape), offsets[0], offsets[1])


def shard_number(name: str) -> int | None:
    m = SHARD_NUMBER.search(name)
    return int(m.group(1)) if m else None


def find_shards(source: str, shards: list[int] | None = None) -> list[str]:
    """The shard files to look at: those numbered in `shards`, else every *.safetensors in the dir."""
    try:
        names = sorted(n for n in os.listdir(source) if n.endswith(".safetensors"))
    except OSError as exc:
        raise EngramError(f"{source}: cannot list the checkpoint directory: {exc.strerror or exc}") from None
    if shards:
        picked = [n for n in names if shard_number(n) in set(shards)]
        found = {shard_number(n) for n in picked}
        missing = [s for s in shards if s not in found]
        if missing:
            raise EngramError(f"{source}: no shard numbered {', '.join(map(str, missing))} "
                              f"(files like model-000{missing[0]:02d}-of-000NN.safetensors)")
        names = picked
    if not names:
        raise EngramError(f"{source}: no *.safetensors files")
    return [os.path.join(source, n) for n in names]


# -- the plan: which bytes of which file --------------------------------------------------------------
@dataclass
class Span:
    """Bytes [offset, offset + length) of one shard, copied as one unit (chunks never cross spans)."""

    file: str
    offset: int
    length: int
    kind: str  # header | rows | whole | file
    tensor: str | None = None
    row_bytes: int = 0  # rows: bytes per row (chunks are whole rows)
    first_row: int = 0  # rows: the table row at `offset`


@dataclass
class Chunk:
    file: str
    offset: int
    length: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.file, self.offset, self.length)


@dataclass
class Plan:
    mode: str  # rows | whole-shards
    shards: list[Shard]
    spans: list[Span]
    tensors: list[dict]
    layers: dict[int, dict]
    format: str | None
    chunk_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(s.length for s in self.spans)

    def chunks(self) -> list[Chunk]:
        out: list[Chunk] = []
        for s in self.spans:
            step = self.chunk_bytes
            if s.row_bytes:  # whole rows per chunk, so a bad chunk names a row range
                step = max(s.row_bytes, self.chunk_bytes // s.row_bytes * s.row_bytes)
            for off in range(s.offset, s.offset + s.length, step):
                out.append(Chunk(s.file, off, min(step, s.offset + s.length - off)))
        return out


def _layer_tensors(shards: list[Shard], pattern: str, layer: int) -> list[tuple[Shard, Tensor]]:
    glob = pattern.replace("{layer}", str(layer))
    return sorted(((s, t) for s in shards for t in s.tensors.values() if fnmatch.fnmatchcase(t.name, glob)),
                  key=lambda st: (st[0].name, st[1].begin))


def _format_of(values: Tensor, shard: Shard) -> str:
    if values.dtype in FP8_VALUES:
        return "fp8"
    if values.dtype in NVFP4_VALUES:
        return "nvfp4"
    raise EngramError(f"{shard.path}: tensor {values.name} is {values.dtype}: cannot tell the Engram format "
                      "(expected F8_E4M3 values for fp8, U8/F4 packed e2m1 for nvfp4)")


def _tensor_entry(shard: Shard, t: Tensor, layer: int | None, kind: str, rows: tuple[int, int] | None,
                  offset: int, length: int) -> dict:
    return {"name": t.name, "file": shard.name, "layer": layer, "dtype": t.dtype, "shape": t.shape,
            "kind": kind, "rows": list(rows) if rows else None, "row_bytes": t.row_bytes(),
            "tensor_offset": shard.data_start + t.begin, "offset": offset, "length": length}


def plan_rows(shards: list[Shard], pattern: str, ranges: dict[int, tuple[int, int]],
              chunk_bytes: int = DEFAULT_CHUNK) -> Plan:
    """Per layer: the tensors matching the pattern, each copied over the rank's rows [start, end)."""
    if "{layer}" not in pattern:
        raise EngramError(f"tensor pattern {pattern!r} has no {{layer}} placeholder")
    if not ranges:
        raise EngramError("no row ranges given (one per Engram layer: --range LAYER:START:END)")
    spans: list[Span] = []
    tensors: list[dict] = []
    layers: dict[int, dict] = {}
    formats: dict[str, int] = {}
    used: dict[str, Shard] = {}
    for layer, (start, end) in sorted(ranges.items()):
        matched = _layer_tensors(shards, pattern, layer)
        if not matched:
            where = ", ".join(s.name for s in shards)
            raise EngramError(f"no tensor matches {pattern.replace('{layer}', str(layer))!r} for layer {layer} "
                              f"in {where}")
        vshard, values = max(matched, key=lambda st: st[1].nbytes)
        if len(values.shape) < 2:
            raise EngramError(f"{vshard.path}: tensor {values.name} has shape {values.shape}; an Engram table "
                              "is [rows, values]")
        rows = values.shape[0]
        fmt = _format_of(values, vshard)
        formats.setdefault(fmt, layer)
        if not 0 <= start < end:
            raise EngramError(f"layer {layer}: rows [{start}, {end}) is not a range (start < end, both >= 0)")
        if end > rows:
            raise EngramError(f"layer {layer}: rows [{start}, {end}) run past the table end: {values.name} in "
                              f"{vshard.path} has {rows} rows")
        layers[layer] = {"start": start, "end": end, "rows": rows, "tensors": []}
        for shard, t in matched:
            used[shard.name] = shard
            if t.shape and t.shape[0] == rows:
                rb = t.row_bytes()
                if rb is None:
                    raise EngramError(f"{shard.path}: tensor {t.name}: rows of shape {t.shape[1:]} {t.dtype} are "
                                      "not whole bytes")
                off = shard.data_start + t.begin + start * rb
                span = Span(shard.name, off, (end - start) * rb, "rows", t.name, rb, start)
                entry = _tensor_entry(shard, t, layer, "rows", (start, end), off, span.length)
            elif len(t.shape) <= 1 and t.nbytes <= WHOLE_TENSOR_MAX:
                span = Span(shard.name, shard.data_start + t.begin, t.nbytes, "whole", t.name)
                entry = _tensor_entry(shard, t, layer, "whole", None, span.offset, t.nbytes)
            else:
                raise EngramError(f"{shard.path}: tensor {t.name} matches the Engram pattern but has shape {t.shape}; "
                                  f"the layer-{layer} table has {rows} rows ({values.name} {values.shape})")
            if span.length:
                spans.append(span)
            tensors.append(entry)
            layers[layer]["tensors"].append(t.name)
    if len(formats) > 1:
        raise EngramError(f"the Engram layers disagree on the format: {formats}")
    for shard in used.values():
        spans.append(Span(shard.name, 0, shard.data_start, "header"))
    spans.sort(key=lambda s: (s.file, s.offset))
    return Plan("rows", sorted(used.values(), key=lambda s: s.name), spans, tensors, layers,
                next(iter(formats)), chunk_bytes)


def plan_whole(shards: list[Shard], pattern: str | None, layers: list[int] | None = None,
               chunk_bytes: int = DEFAULT_CHUNK) -> Plan:
    """Whole shards (TensorFold lanes, ENG-29): every byte, chunked and verified the same way."""
    spans = [Span(s.name, 0, s.size, "file") for s in shards]
    tensors = []
    fmt = None
    layer_info: dict[int, dict] = {}
    for s in shards:
        for t in sorted(s.tensors.values(), key=lambda t: t.begin):
            tensors.append(_tensor_entry(s, t, None, "whole", None, s.data_start + t.begin, t.nbytes))
    if pattern:
        formats = set()
        for layer in layers or []:
            matched = _layer_tensors(shards, pattern, layer)
            if not matched:
                raise EngramError(f"no tensor matches {pattern.replace('{layer}', str(layer))!r} for layer {layer} "
                                  f"in {', '.join(s.name for s in shards)}")
            vshard, values = max(matched, key=lambda st: st[1].nbytes)
            formats.add(_format_of(values, vshard))
            rows = values.shape[0] if values.shape else 0
            layer_info[layer] = {"start": 0, "end": rows, "rows": rows, "tensors": [t.name for _, t in matched]}
            names = {t.name for _, t in matched}
            for e in tensors:
                if e["name"] in names:
                    e["layer"] = layer
        if len(formats) > 1:
            raise EngramError(f"the Engram layers disagree on the format: {sorted(formats)}")
        fmt = formats.pop() if formats else None
    return Plan("whole-shards", shards, spans, tensors, layer_info, fmt, chunk_bytes)


# -- requests ---------------------------------------------------------------------------------------
@dataclass
class CopyRequest:
    source: str
    dest: str
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    layers: list[int] = field(default_factory=list)  # whole shards: the Engram layers (for the format)
    tensors: str | None = None
    shards: list[int] = field(default_factory=list)
    whole_shards: bool = False
    revision: str | None = None
    tp: int | None = None
    rank: int | None = None
    verify: bool = True
    force: bool = False
    chunk_bytes: int = DEFAULT_CHUNK
    window_bytes: int = DEFAULT_WINDOW

    @classmethod
    def from_dict(cls, d: dict) -> CopyRequest:
        """From the JSON request the controller sends; types checked, mistakes named."""
        def need(key: str, kind: type | tuple, default: Any = None) -> Any:
            v = d.get(key, default)
            if v is not None and not isinstance(v, kind):
                raise EngramError(f"request field {key!r}: expected {getattr(kind, '__name__', kind)}, got {v!r}")
            return v
        for key in ("source", "dest"):
            if not isinstance(d.get(key), str) or not d[key]:
                raise EngramError(f"request field {key!r}: expected a path")
        ranges = {}
        for layer, pair in (need("ranges", dict) or {}).items():
            if (not isinstance(pair, list | tuple) or len(pair) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)):
                raise EngramError(f"request field 'ranges': layer {layer}: expected [start, end], got {pair!r}")
            try:
                ranges[int(layer)] = (pair[0], pair[1])
            except ValueError:
                raise EngramError(f"request field 'ranges': {layer!r} is not a layer number") from None
        shards, layers = need("shards", list) or [], need("layers", list) or []
        for key, v in (("shards", shards), ("layers", layers)):
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise EngramError(f"request field {key!r}: expected numbers, got {v!r}")
        return cls(source=d["source"], dest=d["dest"], ranges=ranges, tensors=need("tensors", str),
                   shards=list(shards), layers=list(layers), whole_shards=bool(need("whole_shards", bool)),
                   revision=need("revision", str), tp=need("tp", int), rank=need("rank", int),
                   verify=bool(need("verify", bool, True)), force=bool(need("force", bool, False)),
                   chunk_bytes=int(need("chunk_bytes", int, DEFAULT_CHUNK)),
                   window_bytes=int(need("window_bytes", int, DEFAULT_WINDOW)))


def snapshot_revision(path: str) -> str | None:
    """The HF commit of a `.../snapshots/<40 hex>` checkpoint dir, if the path says it."""
    m = SNAPSHOT_REV.search(os.path.abspath(path).rstrip("/") + "/")
    return m.group(1) if m else None


def build_plan(req: CopyRequest, source: str) -> Plan:
    """Read the headers under `source` (a real path) and decide every span."""
    if req.chunk_bytes < 4096 or req.window_bytes < req.chunk_bytes:
        raise EngramError("chunk size must be at least 4 KiB and the window at least one chunk")
    if req.whole_shards:
        if not req.shards:
            raise EngramError("--whole-shards needs the shard numbers (--shards 47,48)")
        shards = [read_shard(p) for p in find_shards(source, req.shards)]
        return plan_whole(shards, req.tensors, req.layers or sorted(req.ranges), req.chunk_bytes)
    if not req.tensors:
        raise EngramError("name the Engram tensors with --tensors PATTERN (a glob with {layer}, "
                          "e.g. 'model.layers.{layer}.engram.*')")
    paths = find_shards(source, req.shards or None)
    index = os.path.join(source, "model.safetensors.index.json")
    if not req.shards and os.path.isfile(index):
        paths = _indexed(index, paths, req.tensors, sorted(req.ranges))
    return plan_rows([read_shard(p) for p in paths], req.tensors, req.ranges, req.chunk_bytes)


def _indexed(index: str, paths: list[str], pattern: str, layers: list[int]) -> list[str]:
    """Only the shards the index names for matching tensors: no need to read 48 headers over NFS."""
    try:
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
    except (OSError, ValueError, AttributeError) as exc:
        raise EngramError(f"{index}: not a safetensors index: {exc}") from None
    globs = [pattern.replace("{layer}", str(layer)) for layer in layers]
    files = {f for name, f in weight_map.items() if any(fnmatch.fnmatchcase(name, g) for g in globs)}
    picked = [p for p in paths if os.path.basename(p) in files]
    return picked or paths


# -- I/O helpers ------------------------------------------------------------------------------------
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _fadvise_dontneed(fd: int, offset: int, length: int) -> None:
    # Keep the page cache out of it: the node needs its memory for the engine (ENG-23).
    # Whole pages: the kernel keeps a partly covered page, and chunks start at odd offsets, so a
    # read-back would find the edges of each chunk in the cache instead of on the disk.
    if hasattr(os, "posix_fadvise"):
        start = offset - offset % PAGE
        end = -(-(offset + length) // PAGE) * PAGE
        try:
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def _pread_into(fd: int, buf: bytearray, offset: int, path: str) -> None:
    view = memoryview(buf)
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise EngramError(f"{path}: file ended at byte {offset + got}, expected data up to "
                              f"{offset + len(buf)} (did it change during the copy?)", 1)
        got += n


class Readback:
    """Reads a file's bytes from the disk, not from the page cache: with O_DIRECT where the filesystem
    has it (that also flushes any cached dirty page in the range first), else buffered reads of a
    range just dropped from the cache. Verification compares these bytes, never a buffer in memory."""

    def __init__(self, path: str, max_len: int) -> None:
        self.path = path
        self.direct: int | None = None
        if hasattr(os, "O_DIRECT"):
            try:
                self.direct = os.open(path, os.O_RDONLY | os.O_DIRECT)
            except OSError:
                self.direct = None
        self.fd = os.open(path, os.O_RDONLY)
        self.mm = mmap.mmap(-1, max_len + 2 * PAGE) if self.direct is not None else None  # page-aligned
        self.buf = bytearray(0)

    @property
    def method(self) -> str:
        return "O_DIRECT" if self.direct is not None else "page cache dropped"

    def read(self, offset: int, length: int) -> memoryview:
        """The bytes [offset, offset + length) as on the disk (valid until the next read)."""
        if self.direct is not None and self.mm is not None:
            start = offset - offset % PAGE
            size = -(-(offset + length - start) // PAGE) * PAGE
            view = memoryview(self.mm)[:size]
            need = offset + length - start
            got = 0
            try:
                while got < need:
                    n = os.preadv(self.direct, [view[got:]], start + got)
                    if n == 0:
                        raise EngramError(f"{self.path}: file ended at byte {start + got}, expected data up to "
                                          f"{offset + length}", 1)
                    got += n
                return view[offset - start:offset - start + length]
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                os.close(self.direct)  # the filesystem refuses this O_DIRECT read after all: fall back
                self.direct = None
        if len(self.buf) != length:
            self.buf = bytearray(length)
        _fadvise_dontneed(self.fd, offset, length)
        _pread_into(self.fd, self.buf, offset, self.path)
        _fadvise_dontneed(self.fd, offset, length)
        return memoryview(self.buf)

    def close(self) -> None:
        for fd in (self.direct, self.fd):
            if fd is not None:
                os.close(fd)
        self.direct = None
        # self.mm is left to the garbage collector: a view handed out may still be referenced


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


def _full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _same(a: bytearray, b: bytearray | memoryview) -> bool:
    return a == b  # bytearray == buffer is a memcmp; memoryview == memoryview goes element by element


def _atomic_write(path: str, data: bytes, fsync: bool = True) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _pwrite_all(fd, memoryview(data), 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync:
        _fsync_dir(os.path.dirname(path))


def _fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Faults:
    """Test hooks from $SPARKFLEET_ENGRAM_FAULT ("crash_after_chunks=3,sleep_per_chunk=0.01"): a crash
    (SIGKILL of this process) after N chunks are journaled this run, or after chunk N is written but
    before it is journaled; ENOSPC once N bytes were written this run; a free-space figure; a delay."""

    def __init__(self, spec: str | None = None) -> None:
        spec = os.environ.get("SPARKFLEET_ENGRAM_FAULT", "") if spec is None else spec
        self.values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, _, value = part.partition("=")
            self.values[key] = float(value or 1)

    def get(self, key: str) -> float | None:
        return self.values.get(key)

    @staticmethod
    def crash() -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class BufferPool:
    """At most `count` chunk buffers alive: bounded memory whatever the table size."""

    def __init__(self, count: int) -> None:
        self.slots = threading.Semaphore(count)
        self.free: list[bytearray] = []
        self.lock = threading.Lock()
        self.count = count

    def get(self, n: int) -> bytearray:
        self.slots.acquire()
        with self.lock:
            for i, b in enumerate(self.free):
                if len(b) == n:
                    return self.free.pop(i)
            if len(self.free) >= self.count:
                self.free.pop(0)
        return bytearray(n)

    def put(self, buf: bytearray) -> None:
        with self.lock:
            self.free.append(buf)
        self.slots.release()


# -- the copy ---------------------------------------------------------------------------------------
Progress = Callable[[dict], None]


def _fingerprint(plan: Plan, source_node_path: str) -> str:
    data = {"mode": plan.mode, "source": source_node_path, "hash": HASH,
            "shards": [s.identity() for s in plan.shards],
            "spans": [[s.file, s.offset, s.length] for s in plan.spans],
            "chunks": plan.chunk_bytes}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _read_journal(path: str, fingerprint: str, valid: set[tuple[str, int, int]]) -> tuple[dict, str | None]:
    """Chunks journaled by an earlier run of the same plan; else ({}, why it cannot be used)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return {}, None
    if not lines:
        return {}, None
    try:
        head = json.loads(lines[0])
    except ValueError:
        return {}, "the progress journal's first line is not JSON"
    if head.get("schema") != JOURNAL_SCHEMA or head.get("fingerprint") != fingerprint:
        return {}, "the source, ranges or chunk size changed since the interrupted copy"
    done: dict[tuple[str, int, int], dict] = {}
    for line in lines[1:]:
        try:  # the last line can be torn by a crash: it and anything unparsable is copied again
            e = json.loads(line)
            key = (e["f"], int(e["o"]), int(e["n"]))
        except (ValueError, KeyError, TypeError):
            continue
        if key in valid and isinstance(e.get("h"), str):
            done[key] = {"hash": e["h"], "verified": bool(e.get("v"))}
    return done, None


class Copier:
    """One copy into one destination directory; use run()."""

    def __init__(self, req: CopyRequest, *, root: str = "/", progress: Progress | None = None,
                 on_chunk: Callable[[Chunk], None] | None = None, faults: Faults | None = None) -> None:
        self.req = req
        self.root = root
        self.progress = progress or (lambda e: None)
        self.on_chunk = on_chunk
        self.faults = faults or Faults()
        self.source = _real(root, req.source)
        self.dest = _real(root, req.dest)
        self._last_emit = 0.0
        self._local = threading.local()  # each verifier thread reads back through its own Readbacks
        self._readers: list[Readback] = []
        self._lock = threading.Lock()
        self._max_chunk = 0

    def _reader(self, name: str) -> Readback:
        mine = self._local.__dict__.setdefault("readers", {})
        if name not in mine:
            mine[name] = Readback(os.path.join(self.dest, name), self._max_chunk)
            with self._lock:
                self._readers.append(mine[name])
        return mine[name]

    def emit(self, event: dict, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_emit < PROGRESS_EVERY_S:
            return
        self._last_emit = now
        self.progress(event)
        try:  # for the controller's poll (fleet mode); losing one is harmless
            _atomic_write(os.path.join(self.dest, STATUS), json.dumps({**event, "pid": os.getpid(),
                                                                      "at": _now()}).encode(), fsync=False)
        except OSError:
            pass

    def run(self) -> dict:
        req = self.req
        if not os.path.isdir(self.source):
            raise EngramError(f"{req.source}: no such checkpoint directory")
        revision = req.revision
        seen = snapshot_revision(req.source)
        if revision and seen and revision != seen:
            raise EngramError(f"{req.source} is snapshot {seen} but the copy was asked for revision {revision} "
                              "(docs/failure-modes.md FM-62: a copy must come from the lane's checkpoint)")
        revision = revision or seen
        plan = build_plan(req, self.source)
        # A fresh copy removes the files it will write: never let that be the checkpoint itself.
        if os.path.realpath(self.dest) == os.path.realpath(self.source):
            raise EngramError(f"{req.dest}: the destination is the checkpoint directory itself")
        for shard in plan.shards:
            target = os.path.join(self.dest, shard.name)
            if os.path.exists(target) and os.path.samefile(target, shard.path):
                raise EngramError(f"{target} is the source shard itself (a link to it?): choose another --dest")
        try:
            os.makedirs(self.dest, exist_ok=True)
        except OSError as exc:
            raise EngramError(f"{req.dest}: cannot create the destination: {exc.strerror or exc}") from None
        lock_fd = os.open(os.path.join(self.dest, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise EngramError(f"{req.dest}: another engram copy is running into this directory") from None
            return self._run_locked(plan, revision)
        finally:
            os.close(lock_fd)

    def _run_locked(self, plan: Plan, revision: str | None) -> dict:
        req = self.req
        fingerprint = _fingerprint(plan, os.path.abspath(req.source))
        manifest_path = os.path.join(self.dest, MANIFEST)
        journal_path = os.path.join(self.dest, JOURNAL)
        chunks = plan.chunks()
        valid = {c.key for c in chunks}
        old = _load_json(manifest_path)
        if old is not None and old.get("fingerprint") == fingerprint and not req.force \
                and (old.get("verified") or not req.verify) and self._files_ok(plan):
            summary = {"event": "done", "already_complete": True, "manifest": os.path.join(req.dest, MANIFEST),
                       "bytes_total": plan.total_bytes, "bytes_copied": 0, "chunks_copied": 0,
                       "chunks_skipped": len(chunks), "chunks_reverified": 0, "verified": bool(old.get("verified")),
                       "format": plan.format, "elapsed_s": 0.0}
            self.emit(summary, force=True)
            return summary
        done: dict[tuple[str, int, int], dict] = {}
        why = None
        if old is not None and old.get("fingerprint") == fingerprint and not req.force:
            # an unverified copy asked to verify: its chunks become journal entries to re-check
            for fname, rows in (old.get("chunks", {}).get("files") or {}).items():
                for off, n, h in rows:
                    if (fname, off, n) in valid:
                        done[(fname, off, n)] = {"hash": h, "verified": bool(old.get("verified"))}
        elif not req.force:
            done, why = _read_journal(journal_path, fingerprint, valid)
        # A copy is valid only while its manifest says so: an old one goes before any byte changes.
        if old is not None or os.path.exists(manifest_path):
            os.unlink(manifest_path)
            _fsync_dir(self.dest)
        fresh = not done
        fds: dict[str, tuple[int, int]] = {}
        self._max_chunk = max((c.length for c in chunks), default=0)
        try:
            for shard in plan.shards:
                dpath = os.path.join(self.dest, shard.name)
                if fresh:
                    _unlink(dpath)  # start over: no stale bytes where the holes should be
                elif not _size_is(dpath, shard.size):
                    done = {k: v for k, v in done.items() if k[0] != shard.name}
                    _unlink(dpath)
                try:
                    dfd = os.open(dpath, os.O_RDWR | os.O_CREAT, 0o644)
                    if os.fstat(dfd).st_size != shard.size:
                        os.ftruncate(dfd, shard.size)  # sparse: holes everywhere until written
                except OSError as exc:
                    raise EngramError(f"{dpath}: cannot create: {exc.strerror or exc}", 1) from None
                fds[shard.name] = (os.open(shard.path, os.O_RDONLY), dfd)
            # Rewrite the journal for this plan: its header and the chunks already known good.
            lines = [json.dumps({"schema": JOURNAL_SCHEMA, "fingerprint": fingerprint, "started_at": _now()})]
            lines += [json.dumps({"f": k[0], "o": k[1], "n": k[2], "h": v["hash"], "v": v["verified"]})
                      for k, v in sorted(done.items())]
            _atomic_write(journal_path, ("\n".join(lines) + "\n").encode())
            todo = [c for c in chunks if c.key not in done]
            recheck = [c for c in chunks if c.key in done and req.verify and not done[c.key]["verified"]]
            remaining = sum(c.length for c in todo)
            self._check_space(remaining)
            base = {"mode": plan.mode, "bytes_total": plan.total_bytes, "chunks_total": len(chunks),
                    "dest": req.dest}
            self.emit({"event": "plan", **base, "bytes_done": plan.total_bytes - remaining,
                       "chunks_done": len(chunks) - len(todo), "format": plan.format,
                       "files": [s.name for s in plan.shards], "restart_reason": why}, force=True)
            started = time.monotonic()
            with open(journal_path, "a", encoding="utf-8") as journal:
                reverified = self._recheck(recheck, done, journal) if recheck else 0
                todo += [c for c in recheck if c.key not in done]
                self._copy(todo, fds, done, journal, base, plan.total_bytes - remaining, started)
            for _, dfd in fds.values():
                os.fsync(dfd)
            self._source_unchanged(plan)
            elapsed = time.monotonic() - started
            manifest = self._manifest(plan, revision, fingerprint, chunks, done)
            try:
                _atomic_write(manifest_path, (json.dumps(manifest, indent=1) + "\n").encode())
            except OSError as exc:
                _unlink(manifest_path + f".tmp.{os.getpid()}")
                if _full(exc):
                    raise EngramError(f"{manifest_path}: no space left for the manifest; free some and run the "
                                      "copy again (it resumes)", 1) from None
                raise
            _unlink(journal_path)
            copied = sum(c.length for c in todo)
            summary = {"event": "done", "already_complete": False, "manifest": os.path.join(req.dest, MANIFEST),
                       "bytes_total": plan.total_bytes, "bytes_copied": copied, "chunks_copied": len(todo),
                       "chunks_skipped": len(chunks) - len(todo), "chunks_reverified": reverified,
                       "verified": req.verify, "format": plan.format, "elapsed_s": round(elapsed, 3),
                       "rate_mb_s": round(copied / MiB / elapsed, 1) if elapsed > 0 else None}
            self.emit(summary, force=True)
            return summary
        finally:
            for sfd, dfd in fds.values():
                os.close(sfd)
                os.close(dfd)
            for r in self._readers:
                r.close()

    def _files_ok(self, plan: Plan) -> bool:
        return all(_size_is(os.path.join(self.dest, s.name), s.size) for s in plan.shards)

    def _check_space(self, remaining: int) -> None:
        free = self.faults.get("free_bytes")
        if free is None:
            st = os.statvfs(self.dest)
            free = st.f_bavail * st.f_frsize
        need = remaining + MiB  # plus the manifest and the journal
        if need > free:
            raise EngramError(f"{self.req.dest}: not enough space: the copy needs {need / MiB:.1f} MiB more and "
                              f"{free / MiB:.1f} MiB are free", 1)

    def _recheck(self, chunks: list[Chunk], done: dict, journal) -> int:
        """Chunks copied without verification earlier: read them back from disk and compare hashes."""
        ok = 0
        for c in chunks:
            if hashlib.new(HASH, self._reader(c.file).read(c.offset, c.length)).hexdigest() == done[c.key]["hash"]:
                done[c.key]["verified"] = True
                journal.write(json.dumps({"f": c.file, "o": c.offset, "n": c.length, "h": done[c.key]["hash"],
                                          "v": True}) + "\n")
                ok += 1
            else:
                del done[c.key]
        journal.flush()
        return ok

    def _copy(self, todo: list[Chunk], fds: dict, done: dict, journal, base: dict, done_before: int,
              started: float) -> None:
        """A pipeline of five stages, each in its own thread, so neither the disks nor a CPU wait on the
        others: reader (pread the source) -> hasher (sha256; hashlib drops the GIL) -> writer (pwrite,
        this thread) -> syncer (fdatasync a window, drop it from the page cache) -> verifier (read the
        window back from the disk, compare, journal). Memory is the buffers in flight, nothing more."""
        req = self.req
        per_window = max(1, req.window_bytes // req.chunk_bytes)
        # verify keeps each source buffer until its chunk was read back (a window being written, one
        # being synced, one being verified, one waiting between each); without verify a buffer is free
        # once written
        pool = BufferPool(((4 + VERIFIERS) * per_window if req.verify else 2) + 2 * READ_AHEAD)
        reads: queue.Queue = queue.Queue(maxsize=READ_AHEAD)
        hashed: queue.Queue = queue.Queue(maxsize=READ_AHEAD)
        to_sync: queue.Queue = queue.Queue(maxsize=1)
        to_verify: queue.Queue = queue.Queue(maxsize=1)
        stop = threading.Event()
        failed: list[BaseException] = []
        state = {"copied": 0, "journaled": 0, "file": None}
        crash_after = self.faults.get("crash_after_chunks")
        crash_before_journal = self.faults.get("crash_before_journal")
        enospc_after = self.faults.get("enospc_after_bytes")
        delay = self.faults.get("sleep_per_chunk")
        end = None  # the end-of-stream marker each stage passes on

        def release(item: Any) -> None:
            for entry in item if isinstance(item, list) else [item]:
                if isinstance(entry, tuple) and entry[1] is not None:
                    pool.put(entry[1])

        def fail(exc: BaseException, item: Any) -> None:
            failed.append(exc)
            stop.set()
            release(item)

        def stage(inq: queue.Queue, outq: queue.Queue | None, work: Callable[[Any], Any],
                  consumers: int = 1) -> Callable[[], None]:
            """Run `work` on each item until the end marker; after any failure, only drain and free."""
            def loop() -> None:
                while True:
                    item = inq.get()
                    if item is end:
                        for _ in range(consumers if outq is not None else 0):
                            outq.put(end)
                        return
                    if failed:
                        release(item)
                        continue
                    try:
                        result = work(item)
                    except BaseException as exc:  # noqa: B036 - raised again by the writer thread
                        fail(exc, item)
                        continue
                    if outq is not None and result is not None:
                        outq.put(result)
            return loop

        def reader() -> None:
            try:
                for c in todo:
                    if stop.is_set():
                        break
                    buf = pool.get(c.length)
                    sfd, _ = fds[c.file]
                    try:
                        _pread_into(sfd, buf, c.offset, os.path.join(req.source, c.file))
                    except BaseException:
                        pool.put(buf)
                        raise
                    _fadvise_dontneed(sfd, c.offset, c.length)
                    reads.put((c, buf))
            except BaseException as exc:  # noqa: B036 - raised again by the writer thread
                fail(exc, None)
            reads.put(end)

        def hash_chunk(item: tuple) -> tuple:
            c, buf = item
            return (c, buf, hashlib.new(HASH, buf).hexdigest())

        def sync_window(window: list) -> list:
            for name in {c.file for c, _, _ in window}:
                try:
                    os.fdatasync(fds[name][1])  # durable before it is read back or journaled
                except OSError as exc:
                    if _full(exc):
                        raise EngramError(f"{os.path.join(self.dest, name)}: no space left on device; free "
                                          "space and run the copy again (it resumes from the last verified chunk)",
                                          1) from None
                    raise
            for c, _, _ in window:
                _fadvise_dontneed(fds[c.file][1], c.offset, c.length)
            return window

        def verify_window(window: list) -> None:
            while window:
                c, buf, digest = window[0]
                if req.verify:
                    # read back past the page cache: the disk's bytes, not the buffer just written
                    if not _same(buf, self._reader(c.file).read(c.offset, c.length)):
                        dpath = os.path.join(self.dest, c.file)
                        raise EngramError(f"{dpath}: bytes {c.offset}..{c.offset + c.length} read back from the "
                                          "disk differ from the source: check the disk (dmesg) and run again", 1)
                with self._lock:  # VERIFIERS threads share the journal and the counts
                    journal.write(json.dumps({"f": c.file, "o": c.offset, "n": c.length, "h": digest,
                                              "v": req.verify}) + "\n")
                    done[c.key] = {"hash": digest, "verified": req.verify}
                    state["copied"] += c.length
                    state["journaled"] += 1
                    if crash_after is not None and state["journaled"] >= crash_after:
                        journal.flush()
                        Faults.crash()
                window.pop(0)
                if buf is not None:
                    pool.put(buf)
            with self._lock:
                journal.flush()
                elapsed = max(time.monotonic() - started, 1e-9)
                rate = state["copied"] / elapsed
                left = base["bytes_total"] - done_before - state["copied"]
                self.emit({"event": "progress", **base, "bytes_done": done_before + state["copied"],
                           "rate_mb_s": round(rate / MiB, 1), "eta_s": round(left / rate, 1) if rate else None,
                           "file": state["file"]})

        threads = [threading.Thread(target=t, name=f"engram-{n}", daemon=True) for n, t in (
            ("reader", reader), ("hasher", stage(reads, hashed, hash_chunk)),
            ("syncer", stage(to_sync, to_verify, sync_window, consumers=VERIFIERS)),
            *((f"verifier{i}", stage(to_verify, None, verify_window)) for i in range(VERIFIERS)))]
        for t in threads:
            t.start()
        window: list[tuple[Chunk, bytearray | None, str]] = []
        window_bytes = written = written_chunks = 0
        finished = False
        try:
            while True:  # the writer
                item = hashed.get()
                if item is end:
                    finished = True
                    break
                if failed:
                    release(item)
                    continue
                c, buf, digest = item
                state["file"] = c.file
                dpath = os.path.join(self.dest, c.file)
                try:
                    if enospc_after is not None and written + c.length > enospc_after:
                        raise OSError(errno.ENOSPC, "No space left on device (injected)")
                    _pwrite_all(fds[c.file][1], memoryview(buf), c.offset)
                except OSError as exc:
                    if _full(exc):
                        error = EngramError(f"{dpath}: no space left on device after {done_before + written} of "
                                            f"{base['bytes_total']} bytes; free space and run the copy again "
                                            "(it resumes from the last verified chunk)", 1)
                    else:
                        error = EngramError(f"{dpath}: write failed: {exc.strerror or exc}", 1)
                    fail(error, item)
                    continue
                written += c.length
                written_chunks += 1
                if crash_before_journal is not None and written_chunks >= crash_before_journal:
                    Faults.crash()  # written, maybe durable, never journaled: must be copied again
                if not req.verify:
                    pool.put(buf)
                    buf = None
                window.append((c, buf, digest))
                window_bytes += c.length
                if self.on_chunk is not None:
                    self.on_chunk(c)
                if delay:
                    time.sleep(delay)
                if window_bytes >= req.window_bytes:
                    to_sync.put(window)
                    window, window_bytes = [], 0
            if window and not failed:
                to_sync.put(window)
                window = []
        finally:
            stop.set()
            release(window)
            while not finished:  # left early: drain what the reader and hasher still pass on, to their end
                item = hashed.get()
                finished = item is end
                release(item)
            to_sync.put(end)
            for t in threads:
                t.join()
        if failed:
            raise failed[0]

    def _source_unchanged(self, plan: Plan) -> None:
        """Size, mtime and header hash again at the end: a copy of a moving source is not a copy."""
        for shard in plan.shards:
            try:
                now = read_shard(shard.path)
            except EngramError as exc:
                raise EngramError(f"{shard.path}: changed during the copy ({exc}); run the copy again", 1) from None
            what = [k for k in ("size", "mtime_ns", "header_sha256") if getattr(now, k) != getattr(shard, k)]
            if what:
                _unlink(os.path.join(self.dest, JOURNAL))  # its chunks are of the old source
                raise EngramError(f"{shard.path}: changed during the copy ({', '.join(what)} differ); "
                                  "no manifest was written; run the copy again once the source is stable", 1)

    def _manifest(self, plan: Plan, revision: str | None, fingerprint: str, chunks: list[Chunk],
                  done: dict) -> dict:
        req = self.req
        files: dict[str, list] = {}
        for c in chunks:
            files.setdefault(c.file, []).append([c.offset, c.length, done[c.key]["hash"]])
        return {
            "schema": MANIFEST_SCHEMA,
            "tool": {"name": "sparkfleet engram_copy", "version": TOOL_VERSION},
            "completed_at": _now(),
            "complete": True,
            "verified": req.verify and all(done[c.key]["verified"] for c in chunks),
            # how verification read the copy back: O_DIRECT, or buffered reads of ranges just dropped
            "readback": ", ".join(sorted({r.method for r in self._readers})) or None,
            "mode": plan.mode,
            "fingerprint": fingerprint,
            "source": {"path": os.path.abspath(req.source), "revision": revision,
                       "shards": [s.identity() for s in plan.shards]},
            "format": plan.format,
            "tensor_pattern": req.tensors,
            "tp": {"size": req.tp, "rank": req.rank},
            "layers": {str(k): v for k, v in sorted(plan.layers.items())},
            "tensors": plan.tensors,
            "bytes": plan.total_bytes,
            "chunks": {"algorithm": HASH, "size": plan.chunk_bytes, "files": files},
        }


def _real(root: str, path: str) -> str:
    return path if root in ("", "/") else os.path.join(root, path.lstrip("/"))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _size_is(path: str, size: int) -> bool:
    try:
        return os.stat(path).st_size == size
    except OSError:
        return False


def _load_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: treated as "not a valid manifest", and replaced
    return data if isinstance(data, dict) else {}


def copy(req: CopyRequest, *, root: str = "/", progress: Progress | None = None,
         on_chunk: Callable[[Chunk], None] | None = None, faults: Faults | None = None) -> dict:
    """Copy (or resume) one rank's Engram bytes; returns the "done" summary, raises EngramError."""
    return Copier(req, root=root, progress=progress, on_chunk=on_chunk, faults=faults).run()


# -- verify -----------------------------------------------------------------------------------------
def load_manifest(dest: str) -> dict:
    path = os.path.join(dest, MANIFEST)
    data = _load_json(path)
    if data is None:
        hint = (" (an interrupted copy is in progress there: run the copy again to resume)"
                if os.path.exists(os.path.join(dest, JOURNAL)) else "")
        raise EngramError(f"{path}: no manifest: the copy is incomplete or was never made{hint}", 1)
    if data.get("schema") != MANIFEST_SCHEMA:
        raise EngramError(f"{path}: not an Engram manifest (schema {data.get('schema')!r}, "
                          f"expected {MANIFEST_SCHEMA})", 1)
    return data


def locate(manifest: dict, file: str, offset: int) -> dict:
    """Which tensor and row holds byte `offset` of `file` (or the header region)."""
    for t in manifest.get("tensors", []):
        if t["file"] != file:
            continue
        start, end = t["tensor_offset"], t["tensor_offset"] + _tensor_len(t)
        if start <= offset < end:
            rb = t.get("row_bytes")
            row = (offset - start) // rb if rb else None
            return {"tensor": t["name"], "row": row}
    for s in manifest.get("source", {}).get("shards", []):
        if s["file"] == file and offset < 8 + s["header_len"]:
            return {"tensor": "(header)", "row": None}
    return {"tensor": None, "row": None}


def _tensor_len(t: dict) -> int:
    if t["kind"] == "rows":
        return t["shape"][0] * t["row_bytes"]
    return t["length"]


def _first_diff(a: bytes | bytearray | memoryview, b: bytes | bytearray | memoryview) -> int:
    a, b = bytes(a), bytes(b)
    n = min(len(a), len(b))
    step = 4096
    for i in range(0, n, step):
        if a[i:i + step] != b[i:i + step]:
            for j in range(i, min(i + step, n)):
                if a[j] != b[j]:
                    return j
    return n


def verify(dest: str, source: str | None = None, *, root: str = "/",
           progress: Progress | None = None) -> dict:
    """Re-check a copy against its manifest's chunk hashes (and the source when given).

    Reports the first bad row of each tensor: exact when the source is there to compare with, else
    the rows of the first chunk whose hash differs."""
    emit = progress or (lambda e: None)
    rdest = _real(root, dest)
    rsource = _real(root, source) if source else None
    m = load_manifest(rdest)
    problems: list[dict] = []
    reported: set[tuple[str, str | None]] = set()
    algo = m["chunks"]["algorithm"]
    shards = {s["file"]: s for s in m["source"]["shards"]}
    total = sum(n for rows in m["chunks"]["files"].values() for _, n, _ in rows)
    checked = 0
    last = 0.0
    started = time.monotonic()
    if rsource:
        for name, ident in shards.items():
            try:
                now = read_shard(os.path.join(rsource, name))
            except EngramError as exc:
                problems.append({"file": name, "tensor": None, "problem": f"source: {exc}"})
                continue
            if now.header_sha256 != ident["header_sha256"] or now.size != ident["size"]:
                problems.append({"file": name, "tensor": "(header)", "problem": "the source shard's header or size "
                                 "differs from the one copied: the checkpoint changed since the copy"})
    for name, rows in m["chunks"]["files"].items():
        dpath = os.path.join(rdest, name)
        try:
            reader = Readback(dpath, max((n for _, n, _ in rows), default=0))
        except OSError as exc:
            problems.append({"file": name, "tensor": None, "problem": f"missing: {exc.strerror or exc}"})
            continue
        sfd = None
        try:
            size = os.fstat(reader.fd).st_size
            if size != shards[name]["size"]:
                problems.append({"file": name, "tensor": None,
                                 "problem": f"size {size}, the manifest says {shards[name]['size']}"})
                continue
            if rsource:
                try:
                    sfd = os.open(os.path.join(rsource, name), os.O_RDONLY)
                except OSError as exc:
                    problems.append({"file": name, "tensor": None, "problem": f"source: {exc.strerror or exc}"})
            for off, n, want in rows:
                buf = reader.read(off, n)  # the disk's bytes, not a cached copy
                got = hashlib.new(algo, buf).hexdigest()
                src = None
                if sfd is not None:
                    src = bytearray(n)
                    try:
                        _pread_into(sfd, src, off, os.path.join(source or "", name))
                    except EngramError:
                        src = None
                    _fadvise_dontneed(sfd, off, n)
                checked += n
                bad_dest = got != want
                bad_src = src is not None and hashlib.new(algo, src).hexdigest() != want
                if bad_dest or bad_src:
                    _report(m, name, off, n, buf, src, bad_dest, bad_src, problems, reported)
                now = time.monotonic()
                if now - last >= PROGRESS_EVERY_S:
                    last = now
                    rate = checked / max(now - started, 1e-9)
                    emit({"event": "progress", "bytes_done": checked, "bytes_total": total,
                          "rate_mb_s": round(rate / MiB, 1), "eta_s": round((total - checked) / rate, 1),
                          "file": name})
        finally:
            reader.close()
            if sfd is not None:
                os.close(sfd)
    result = {"event": "verify", "ok": not problems, "dest": dest, "source": source, "bytes_checked": checked,
              "bytes_total": total,
              "format": m.get("format"), "revision": m["source"].get("revision"), "problems": problems}
    emit(result)
    return result


def _report(m: dict, name: str, off: int, n: int, buf: memoryview, src: bytearray | None, bad_dest: bool,
            bad_src: bool, problems: list[dict], reported: set) -> None:
    if bad_dest and src is not None and not bad_src:
        at = off + _first_diff(buf, src)  # exact: the first byte that differs from the source
        where = locate(m, name, at)
        key = (name, where["tensor"])
        if key not in reported:
            reported.add(key)
            problems.append({"file": name, **where, "offset": at,
                             "problem": "the copy differs from the source"})
        return
    first, last = locate(m, name, off), locate(m, name, off + n - 1)
    key = (name, first["tensor"])
    if key in reported:
        return
    reported.add(key)
    entry = {"file": name, "tensor": first["tensor"], "row": None, "offset": off}
    if first["row"] is not None and last["tensor"] == first["tensor"]:
        entry["rows"] = [first["row"], last["row"] + 1]
    if bad_src and not bad_dest:
        entry["problem"] = "the source differs from the manifest: the checkpoint changed since the copy"
    elif bad_src:
        entry["problem"] = "both the copy and the source differ from the manifest"
    else:
        entry["problem"] = "chunk hash differs from the manifest (give --source to name the exact row)"
    problems.append(entry)


def status(dest: str, source: str | None = None, *, root: str = "/") -> dict:
    """What a controller needs before launch: the manifest (without chunk hashes) or why there is none,
    and, with the source, whether its shard headers are still the ones copied. Cheap: no data read."""
    rdest = _real(root, dest)
    out: dict[str, Any] = {"event": "status", "dest": dest, "manifest": None, "problem": None,
                           "in_progress": os.path.exists(os.path.join(rdest, JOURNAL))}
    try:
        m = load_manifest(rdest)
    except EngramError as exc:
        out["problem"] = str(exc)
        return out
    out["manifest"] = {k: v for k, v in m.items() if k != "chunks"} | {
        "chunks": {"algorithm": m["chunks"]["algorithm"], "size": m["chunks"]["size"],
                   "count": sum(len(v) for v in m["chunks"]["files"].values())}}
    if source:
        changed = []
        for s in m["source"]["shards"]:
            try:
                now = read_shard(os.path.join(_real(root, source), s["file"]))
            except EngramError as exc:
                changed.append(f"{s['file']}: {exc}")
                continue
            if now.header_sha256 != s["header_sha256"] or now.size != s["size"]:
                changed.append(f"{s['file']}: header or size differs from the copied shard")
        out["source_changed"] = changed
    return out


# -- command line -----------------------------------------------------------------------------------
def parse_range(text: str) -> tuple[int, tuple[int, int]]:
    """LAYER:START:END -> (layer, (start, end))."""
    parts = text.split(":")
    try:
        layer, start, end = (int(p) for p in parts)
    except ValueError:
        raise EngramError(f"--range {text!r}: expected LAYER:START:END (integers)") from None
    return layer, (start, end)


def number_list(text: str | None, what: str) -> list[int]:
    """"47,48" -> [47, 48]."""
    try:
        return [int(s) for s in (text or "").split(",") if s.strip()]
    except ValueError:
        raise EngramError(f"{what} {text!r}: expected numbers like 47,48") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="engram_copy.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="op", required=True)
    c = sub.add_parser("copy")
    c.add_argument("--source", required=True)
    c.add_argument("--dest", required=True)
    c.add_argument("--range", action="append", default=[], dest="ranges", metavar="LAYER:START:END")
    c.add_argument("--tensors")
    c.add_argument("--shards", default="")
    c.add_argument("--layers", default="", help="whole shards: the Engram layers, for the format")
    c.add_argument("--whole-shards", action="store_true")
    c.add_argument("--revision")
    c.add_argument("--tp", type=int)
    c.add_argument("--rank", type=int)
    c.add_argument("--no-verify", action="store_true")
    c.add_argument("--force", action="store_true")
    c.add_argument("--chunk-mb", type=float, default=DEFAULT_CHUNK / MiB)
    c.add_argument("--window-mb", type=float, default=DEFAULT_WINDOW / MiB)
    for name in ("verify", "status"):
        v = sub.add_parser(name)
        v.add_argument("--dest", required=True)
        v.add_argument("--source")
    return p


def request_from_args(ns: argparse.Namespace) -> dict:
    ranges = dict(parse_range(r) for r in ns.ranges)
    return {"op": "copy", "source": ns.source, "dest": ns.dest, "ranges": {k: list(v) for k, v in ranges.items()},
            "tensors": ns.tensors, "shards": number_list(ns.shards, "--shards"),
            "layers": number_list(ns.layers, "--layers"), "whole_shards": ns.whole_shards, "revision": ns.revision,
            "tp": ns.tp, "rank": ns.rank, "verify": not ns.no_verify, "force": ns.force,
            "chunk_bytes": int(ns.chunk_mb * MiB), "window_bytes": int(ns.window_mb * MiB)}


def handle(request: dict, *, root: str = "/", progress: Progress | None = None) -> dict:
    """Run one request (the stdin JSON form); returns the final event."""
    op = request.get("op")
    if op in ("verify", "status") and not isinstance(request.get("dest"), str):
        raise EngramError(f"request field 'dest': expected a path for {op}")
    if op == "copy":
        return copy(CopyRequest.from_dict(request), root=root, progress=progress)
    if op == "verify":
        return verify(request["dest"], request.get("source"), root=root, progress=progress)
    if op == "status":
        return status(request["dest"], request.get("source"), root=root)
    raise EngramError(f"unknown op {op!r} (copy, verify, status)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv

    def line(event: dict) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    root = "/"
    try:
        if argv:
            ns = _parser().parse_args(argv)
            request = request_from_args(ns) if ns.op == "copy" else {"op": ns.op, "dest": ns.dest,
                                                                     "source": ns.source}
        else:
            try:
                request = json.loads(sys.stdin.read())
            except ValueError as exc:
                raise EngramError(f"the request on stdin is not JSON: {exc}") from None
            if not isinstance(request, dict):
                raise EngramError("the request on stdin must be a JSON object")
        final = handle(request, root=root, progress=line if request.get("op") != "status" else None)
        if request.get("op") == "status":
            line(final)
        return 0 if final.get("ok", True) else 1
    except EngramError as exc:
        line({"event": "error", "message": str(exc), "code": exc.code})
        sys.stderr.write(f"engram_copy: {exc}\n")
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
