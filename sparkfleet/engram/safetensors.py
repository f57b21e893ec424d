"""safetensors files: the header parser (shared with the node-side copy) and a writer for test checkpoints.

The parser lives in the stdlib-only node-side helper so that the copy on a node and the controller
read headers with the same code; this module re-exports it and adds `write_shard` and
`make_checkpoint`, which build small (or benchmark-sized) checkpoints with Engram-like tables.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.fleet.nodeside.engram_copy import (
    DTYPE_BITS,
    EngramError,
    Shard,
    Tensor,
    read_shard,
    shard_number,
)

__all__ = ["DTYPE_BITS", "EngramError", "Shard", "Tensor", "read_shard", "shard_number", "TensorSpec",
           "write_shard", "make_checkpoint", "EngramFixture"]

FILL_CHUNK = 4 << 20


@dataclass
class TensorSpec:
    name: str
    dtype: str
    shape: list[int]
    data: bytes | None = None  # None: deterministic pseudo-random bytes from the seed

    @property
    def nbytes(self) -> int:
        n = DTYPE_BITS[self.dtype]
        for d in self.shape:
            n *= d
        assert n % 8 == 0, f"{self.name}: {self.shape} {self.dtype} is not whole bytes"
        return n // 8


def write_shard(path: Path, tensors: list[TensorSpec], *, seed: int = 0, header_align: int = 8,
                data_align: int = 1, header_extra: int = 0, metadata: dict[str, str] | None = None) -> dict:
    """Write a safetensors file; returns its header. `data_align` 1 gives odd tensor offsets, and
    `header_extra` pads the header with that many spaces before aligning (odd header lengths)."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for t in tensors:
        offset = -(-offset // data_align) * data_align
        header[t.name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode() + b" " * header_extra
    if header_align > 1:
        raw += b" " * (-(len(raw)) % header_align)  # the format's own padding: spaces
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        pos = 0
        for t in tensors:
            begin, end = header[t.name]["data_offsets"]
            if begin > pos:
                f.write(b"\0" * (begin - pos))
            if t.data is not None:
                assert len(t.data) == t.nbytes, t.name
                f.write(t.data)
            else:
                left = t.nbytes
                while left:
                    n = min(left, FILL_CHUNK)
                    f.write(rng.randbytes(n))
                    left -= n
            pos = end
    return header


@dataclass
class EngramFixture:
    """A generated checkpoint dir and what a copy of it should hold."""

    root: Path
    pattern: str
    rows: int
    layers: dict[int, str]  # layer -> shard file holding its table
    format: str


def make_checkpoint(root: Path, *, rows: int = 4096, width: int = 256, layers: tuple[int, ...] = (1, 14),
                    fmt: str = "fp8", scale_dtype: str = "F8_E8M0", shards: tuple[int, ...] = (47, 48),
                    total_shards: int = 48, seed: int = 1, data_align: int = 1, header_extra: int = 3,
                    filler_bytes: int = 4099, index: bool = True) -> EngramFixture:
    """A checkpoint directory with one Engram table per layer in its own shard (47, 48), other tensors
    around them (odd sizes, odd offsets), a shard without Engram tensors, and an index.

    fp8: values F8_E4M3 [rows, width], scales per 32 (`scale_dtype`: F8_E8M0 or U8) [rows, width/32].
    nvfp4: values U8 [rows, width/2] (e2m1 packed two per byte), scales F8_E4M3 [rows, width/16] and a
    scalar F32 global scale.
    """
    root.mkdir(parents=True, exist_ok=True)
    pattern = "model.layers.{layer}.engram.*"
    weight_map: dict[str, str] = {}
    where: dict[int, str] = {}
    for i, layer in enumerate(layers):
        number = shards[i % len(shards)]
        name = f"model-{number:05d}-of-{total_shards:05d}.safetensors"
        pre = f"model.layers.{layer}.engram"
        tensors = [TensorSpec(f"model.layers.{layer}.attn.filler", "U8", [filler_bytes + 2 * i])]  # odd offsets
        if fmt == "fp8":
            tensors += [TensorSpec(f"{pre}.embed.weight", "F8_E4M3", [rows, width]),
                        TensorSpec(f"{pre}.embed.scale", scale_dtype, [rows, width // 32])]
        elif fmt == "nvfp4":
            tensors += [TensorSpec(f"{pre}.embed.weight", "U8", [rows, width // 2]),
                        TensorSpec(f"{pre}.embed.scale", "F8_E4M3", [rows, width // 16]),
                        TensorSpec(f"{pre}.embed.global_scale", "F32", [])]
        else:
            raise ValueError(f"unknown format {fmt!r}")
        tensors.append(TensorSpec(f"model.layers.{layer}.mlp.after", "F32", [filler_bytes // 4 + 1]))
        if name in where.values():  # two layers in one shard: append to it
            raise ValueError("one layer per shard in this fixture")
        write_shard(root / name, tensors, seed=seed + i, data_align=data_align, header_extra=header_extra,
                    metadata={"format": "pt"})
        where[layer] = name
        weight_map.update({t.name: name for t in tensors})
    other = f"model-00001-of-{total_shards:05d}.safetensors"
    write_shard(root / other, [TensorSpec("model.embed_tokens.weight", "BF16", [33, 17])], seed=seed + 99)
    weight_map["model.embed_tokens.weight"] = other
    if index:
        (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return EngramFixture(root, pattern, rows, where, fmt)


def allocated_bytes(path: Path) -> int:
    """Bytes the filesystem allocated for a file (st_blocks are 512-byte units)."""
    return os.stat(path).st_blocks * 512
