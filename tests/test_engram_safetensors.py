"""safetensors header parsing: offsets, padding, odd alignments, and every kind of bad file named."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sparkfleet.engram.safetensors import (
    EngramError,
    TensorSpec,
    make_checkpoint,
    read_shard,
    shard_number,
    write_shard,
)

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


def test_header_offsets_are_relative_to_the_data_start_with_odd_alignment(tmp_path: Path) -> None:
    path = tmp_path / "model-00003-of-00009.safetensors"
    tensors = [TensorSpec("a", "BF16", [3, 5]), TensorSpec("b", "F8_E4M3", [7, 9]),
               TensorSpec("c", "F8_E8M0", [7]), TensorSpec("d", "U8", [1]), TensorSpec("e", "F32", [])]
    header = write_shard(path, tensors, seed=5, header_extra=5, data_align=1, metadata={"format": "pt"})
    shard = read_shard(str(path))
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert shard.header_len == n and n % 8 == 0  # padded with spaces, as the format does
    assert raw[8 + len(json.dumps(header, separators=(",", ":"))):8 + n].strip(b" ") == b""
    assert shard.data_start == 8 + n
    assert shard.header_sha256 == hashlib.sha256(raw[:8 + n]).hexdigest()
    assert shard.tensors["b"].begin == 30 and shard.tensors["b"].end == 93  # right after a's 30 bytes: odd offset
    assert shard.tensors["b"].row_bytes() == 9
    assert shard.tensors["a"].row_bytes() == 10
    assert shard.tensors["e"].row_bytes() is None
    assert shard.size == len(raw)
    assert shard_number(path.name) == 3


def test_fixture_checkpoint_parses(tmp_path: Path) -> None:
    fx = make_checkpoint(tmp_path / "ck", rows=64)
    shard = read_shard(str(fx.root / fx.layers[1]))
    v = shard.tensors["model.layers.1.engram.embed.weight"]
    assert v.dtype == "F8_E4M3" and v.shape == [64, 256]
    assert (shard.data_start + v.begin) % 2 == 1  # odd absolute offset: the copy must not assume alignment


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _header(d: dict) -> bytes:
    raw = json.dumps(d).encode()
    return len(raw).to_bytes(8, "little") + raw


@pytest.mark.parametrize(("data", "expect"), [
    (b"hello", "not a safetensors file (5 bytes, shorter than the 8-byte header length)"),
    (b"# a text file, not a checkpoint\n" * 4, "not a safetensors file (header length"),
    ((1000).to_bytes(8, "little") + b'{"a": 1', "truncated header: it declares 1000 bytes but only 7 follow"),
    ((12).to_bytes(8, "little") + b"not json at all", "not a safetensors file (the header is not JSON"),
    (_header([1, 2]), "the header is not a JSON object"),
    (_header({"t": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": [0, 16]}}) + b"\0" * 10,
     "truncated: tensor t ends at data byte 16 but the file has 10 bytes of data"),
    (_header({"t": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": [0, 15]}}) + b"\0" * 16,
     "tensor t: data_offsets hold 15 bytes but shape [4, 4] of F8_E4M3 needs 16"),
    (_header({"t": {"dtype": "F7", "shape": [4], "data_offsets": [0, 4]}}) + b"\0" * 4, "tensor t: unknown dtype 'F7'"),
    (_header({"t": {"dtype": "U8", "shape": [4], "data_offsets": [4, 0]}}) + b"\0" * 4,
     "tensor t: data_offsets [4, 0] are not [begin, end]"),
    (_header({"t": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
              "u": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}}) + b"\0" * 12, "tensors t and u overlap"),
])
def test_bad_files_name_the_file_and_the_problem(tmp_path: Path, data: bytes, expect: str) -> None:
    path = _write(tmp_path / "model-00047-of-00048.safetensors", data)
    with pytest.raises(EngramError) as exc:
        read_shard(path)
    assert str(exc.value).startswith(path + ": ")
    assert expect in str(exc.value)
    assert exc.value.code == 2
