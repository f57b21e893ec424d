"""The node-side Engram copy: sparse and exact, resumable after a kill, verified, and loud on bad input."""

from __future__ import annotations

import ast
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkfleet.engram.measure import run_measured
from sparkfleet.engram.safetensors import TensorSpec, allocated_bytes, make_checkpoint, read_shard, write_shard
from sparkfleet.fleet.nodeside import engram_copy as ec

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

HELPER = Path(ec.__file__)
PATTERN = "model.layers.{layer}.engram.*"
ROWS = 4096
RANGES = {1: (1024, 3072), 14: (2500, 4096)}
CHUNK = 32 * 1024
WINDOW = 64 * 1024
REV = "1bae0e1088993b9b82de08f59de5be5a34e42170"


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    fx = make_checkpoint(tmp_path / "hf" / "snapshots" / REV, rows=ROWS)
    return fx.root


def request(src: Path, dest: Path, **kw) -> ec.CopyRequest:
    base = {"source": str(src), "dest": str(dest), "ranges": dict(RANGES), "tensors": PATTERN,
            "chunk_bytes": CHUNK, "window_bytes": WINDOW, "tp": 4, "rank": 1}
    return ec.CopyRequest(**{**base, **kw})


def expected_spans(src: Path, ranges: dict[int, tuple[int, int]]) -> dict[str, list[tuple[int, int]]]:
    """Worked out here from the headers, independently of the copy's plan."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for path in sorted(src.glob("*.safetensors")):
        shard = read_shard(str(path))
        mine = []
        for layer, (start, end) in ranges.items():
            for t in shard.tensors.values():
                if not t.name.startswith(f"model.layers.{layer}.engram."):
                    continue
                base = shard.data_start + t.begin
                if t.shape and t.shape[0] == ROWS:
                    row = t.nbytes // ROWS
                    mine.append((base + start * row, (end - start) * row))
                else:
                    mine.append((base, t.nbytes))
        if mine:
            spans[path.name] = [(0, shard.data_start)] + mine
    return spans


def assert_exact(src: Path, dest: Path, ranges: dict[int, tuple[int, int]] = RANGES) -> None:
    """Same size; the source's bytes over the spans; zeros (holes) everywhere else."""
    for name, spans in expected_spans(src, ranges).items():
        s, d = (src / name).read_bytes(), (dest / name).read_bytes()
        assert len(s) == len(d), name
        edge = 0
        for off, n in sorted(spans):
            assert d[off:off + n] == s[off:off + n], f"{name} [{off}, {off + n})"
            assert d[edge:off].count(0) == off - edge, f"{name}: non-zero bytes in the hole [{edge}, {off})"
            edge = off + n
        assert d[edge:].count(0) == len(d) - edge, f"{name}: non-zero bytes after the last span"


def holes_supported(d: Path) -> bool:
    probe = d / ".probe"
    with open(probe, "wb") as f:
        f.seek(1 << 20)
        f.write(b"x")
        f.flush()
        os.fsync(f.fileno())
    try:
        return allocated_bytes(probe) < (1 << 19)
    finally:
        probe.unlink()


def run_helper(args: list[str], env_fault: str | None = None) -> subprocess.CompletedProcess:
    """Run the helper file the way a node does: `python3 engram_copy.py ...`, isolated from sparkfleet."""
    env = dict(os.environ)
    if env_fault:
        env["SPARKFLEET_ENGRAM_FAULT"] = env_fault
    return subprocess.run([sys.executable, "-I", str(HELPER), *args], capture_output=True, text=True, env=env,
                          timeout=60)


def cli_args(src: Path, dest: Path, ranges: dict[int, tuple[int, int]] = RANGES) -> list[str]:
    args = ["copy", "--source", str(src), "--dest", str(dest), "--tensors", PATTERN,
            "--chunk-mb", str(CHUNK / ec.MiB), "--window-mb", str(WINDOW / ec.MiB)]
    for layer, (s, e) in ranges.items():
        args += ["--range", f"{layer}:{s}:{e}"]
    return args


def journal_entries(dest: Path) -> list[dict]:
    lines = (dest / ec.JOURNAL).read_text().splitlines()
    assert json.loads(lines[0])["schema"] == ec.JOURNAL_SCHEMA
    return [json.loads(x) for x in lines[1:]]


# -- the copy itself -----------------------------------------------------------------------------------
def test_copy_is_sparse_exact_and_has_a_manifest(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "local"
    events: list[dict] = []
    summary = ec.copy(request(ckpt, dest), progress=events.append)
    assert summary["verified"] and summary["format"] == "fp8" and not summary["already_complete"]
    assert_exact(ckpt, dest)
    assert sorted(p.name for p in dest.glob("*.safetensors")) == ["model-00047-of-00048.safetensors",
                                                                   "model-00048-of-00048.safetensors"]
    if holes_supported(tmp_path):
        for p in dest.glob("*.safetensors"):
            assert allocated_bytes(p) < 0.8 * p.stat().st_size, f"{p.name} is not sparse"
    m = json.loads((dest / ec.MANIFEST).read_text())
    assert m["schema"] == ec.MANIFEST_SCHEMA and m["complete"] and m["verified"]
    assert m["source"]["revision"] == REV  # from the .../snapshots/<rev> path
    assert m["format"] == "fp8" and m["tp"] == {"size": 4, "rank": 1} and m["mode"] == "rows"
    if _fs_type(tmp_path) in ("ext4", "xfs", "btrfs"):
        assert m["readback"] == "O_DIRECT"  # verified from the disk itself
    assert m["layers"]["1"]["start"] == 1024 and m["layers"]["1"]["end"] == 3072 and m["layers"]["1"]["rows"] == ROWS
    assert {t["name"] for t in m["tensors"]} == {f"model.layers.{n}.engram.embed.{k}" for n in (1, 14)
                                                 for k in ("weight", "scale")}
    scale = next(t for t in m["tensors"] if t["name"] == "model.layers.14.engram.embed.scale")
    assert scale["row_bytes"] == 8 and scale["rows"] == [2500, 4096] and scale["length"] == (4096 - 2500) * 8
    for s in m["source"]["shards"]:
        assert s["size"] == (ckpt / s["file"]).stat().st_size
    # every recorded chunk hash is the hash of the bytes now on disk
    import hashlib
    for name, chunks in m["chunks"]["files"].items():
        data = (dest / name).read_bytes()
        for off, n, h in chunks:
            assert hashlib.sha256(data[off:off + n]).hexdigest() == h
    assert sum(n for c in m["chunks"]["files"].values() for _, n, _ in c) == m["bytes"]
    assert events[0]["event"] == "plan" and events[-1]["event"] == "done"
    assert not (dest / ec.JOURNAL).exists()
    again = ec.copy(request(ckpt, dest))
    assert again["already_complete"] and again["chunks_copied"] == 0


@pytest.mark.parametrize("fmt,scale", [("fp8", "U8"), ("nvfp4", "F8_E4M3")])
def test_other_dtypes_and_the_nvfp4_global_scale(tmp_path: Path, fmt: str, scale: str) -> None:
    fx = make_checkpoint(tmp_path / "ck", rows=ROWS, fmt=fmt, scale_dtype=scale)
    dest = tmp_path / "d"
    summary = ec.copy(request(fx.root, dest))
    assert summary["format"] == fmt
    assert_exact(fx.root, dest)
    m = json.loads((dest / ec.MANIFEST).read_text())
    kinds = {t["name"].rsplit(".", 1)[1]: t["kind"] for t in m["tensors"] if t["layer"] == 1}
    assert kinds["weight"] == "rows" and kinds["scale"] == "rows"
    if fmt == "nvfp4":
        assert kinds["global_scale"] == "whole"  # the reader needs it: copied whole


def test_whole_shards_are_copied_whole_and_verified(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "tf"
    summary = ec.copy(ec.CopyRequest(source=str(ckpt), dest=str(dest), whole_shards=True, shards=[47, 48],
                                     tensors=PATTERN, layers=[1, 14], chunk_bytes=CHUNK, window_bytes=WINDOW))
    assert summary["format"] == "fp8"
    for name in ("model-00047-of-00048.safetensors", "model-00048-of-00048.safetensors"):
        assert (dest / name).read_bytes() == (ckpt / name).read_bytes()
    assert not (dest / "model-00001-of-00048.safetensors").exists()
    m = json.loads((dest / ec.MANIFEST).read_text())
    assert m["mode"] == "whole-shards" and m["verified"]
    # a flipped byte deep in a tensor is named with its row
    shard = read_shard(str(dest / "model-00048-of-00048.safetensors"))
    t = shard.tensors["model.layers.14.engram.embed.weight"]
    at = shard.data_start + t.begin + 1234 * 256 + 7
    flip(dest / "model-00048-of-00048.safetensors", at)
    result = ec.verify(str(dest), str(ckpt))
    assert [(p["tensor"], p["row"]) for p in result["problems"]] == [("model.layers.14.engram.embed.weight", 1234)]


def test_the_helper_is_stdlib_only() -> None:
    tree = ast.parse(HELPER.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    assert names - set(sys.stdlib_module_names) == {"__future__"} - set(sys.stdlib_module_names)


def test_progress_is_json_lines_from_the_helper_file(ckpt: Path, tmp_path: Path) -> None:
    p = run_helper(cli_args(ckpt, tmp_path / "d"))
    assert p.returncode == 0, p.stderr
    events = [json.loads(line) for line in p.stdout.splitlines()]
    assert events[0]["event"] == "plan" and events[-1]["event"] == "done"
    assert {"bytes_done", "bytes_total"} <= set(events[0])
    assert events[-1]["bytes_copied"] == events[0]["bytes_total"]
    assert_exact(ckpt, tmp_path / "d")


# -- resume ----------------------------------------------------------------------------------------------
def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_crash_then_resume_copies_only_the_remaining_chunks(ckpt: Path, tmp_path: Path, seed: int) -> None:
    dest = tmp_path / "d"
    total = len(ec.build_plan(request(ckpt, dest), str(ckpt)).chunks())
    k = random.Random(seed).randint(1, total - 2)
    p = run_helper(cli_args(ckpt, dest), env_fault=f"crash_after_chunks={k}")
    assert p.returncode == -signal.SIGKILL
    assert not (dest / ec.MANIFEST).exists()
    done = journal_entries(dest)
    assert len(done) == k and all(e["v"] for e in done)
    # Mark a verified chunk on disk: if the resume copied it again, the mark would be gone.
    mark = done[-1]
    flip(dest / mark["f"], mark["o"] + mark["n"] // 2)
    summary = ec.copy(request(ckpt, dest))
    assert summary["chunks_skipped"] == k and summary["chunks_copied"] == total - k
    assert summary["bytes_copied"] == summary["bytes_total"] - sum(e["n"] for e in done)
    result = ec.verify(str(dest), str(ckpt))
    assert not result["ok"] and result["problems"][0]["offset"] == mark["o"] + mark["n"] // 2
    flip(dest / mark["f"], mark["o"] + mark["n"] // 2)
    assert ec.verify(str(dest), str(ckpt))["ok"]
    assert_exact(ckpt, dest)


def test_written_but_unjournaled_chunks_are_copied_again(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    total = len(ec.build_plan(request(ckpt, dest), str(ckpt)).chunks())
    p = run_helper(cli_args(ckpt, dest), env_fault="crash_before_journal=5")
    assert p.returncode == -signal.SIGKILL
    done = journal_entries(dest)
    assert len(done) < 5  # the 5th chunk was written, never journaled (nor, maybe, the ones before it)
    fifth = ec.build_plan(request(ckpt, dest), str(ckpt)).chunks()[4]
    assert (fifth.file, fifth.offset) not in {(e["f"], e["o"]) for e in done}
    summary = ec.copy(request(ckpt, dest))
    assert summary["chunks_copied"] == total - len(done)
    assert_exact(ckpt, dest)


def test_sigkill_at_a_random_moment_then_resume(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    env = dict(os.environ)
    env["SPARKFLEET_ENGRAM_FAULT"] = "sleep_per_chunk=0.01"
    proc = subprocess.Popen([sys.executable, "-I", str(HELPER), *cli_args(ckpt, dest)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert json.loads(proc.stdout.readline())["event"] == "plan"  # started: the journal exists
    time.sleep(random.Random(7).uniform(0.05, 0.3))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert not (dest / ec.MANIFEST).exists()
    done = journal_entries(dest)
    summary = ec.copy(request(ckpt, dest))
    assert summary["chunks_skipped"] == len(done)
    assert_exact(ckpt, dest)
    assert ec.verify(str(dest), str(ckpt))["ok"]


def test_unverified_copy_is_rechecked_not_recopied(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    first = ec.copy(request(ckpt, dest, verify=False))
    assert not first["verified"] and not json.loads((dest / ec.MANIFEST).read_text())["verified"]
    second = ec.copy(request(ckpt, dest))
    assert second["chunks_copied"] == 0 and second["chunks_reverified"] == first["chunks_copied"]
    assert json.loads((dest / ec.MANIFEST).read_text())["verified"]


def test_a_new_plan_starts_over_and_drops_the_old_manifest(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    ec.copy(request(ckpt, dest))
    other = {1: (0, 1024), 14: (0, 1024)}
    p = run_helper(cli_args(ckpt, dest, other), env_fault="crash_after_chunks=1")
    assert p.returncode == -signal.SIGKILL
    assert not (dest / ec.MANIFEST).exists()  # the old copy is no longer what this dir holds
    ec.copy(request(ckpt, dest, ranges=other))
    assert_exact(ckpt, dest, other)  # and nothing of the old ranges is left in the holes


# -- verify --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer,tensor,row", [(1, "weight", 1024), (1, "weight", 2000), (14, "scale", 4095)])
def test_verify_names_the_tensor_and_row_of_a_flipped_byte(ckpt: Path, tmp_path: Path, layer: int, tensor: str,
                                                           row: int) -> None:
    dest = tmp_path / "d"
    ec.copy(request(ckpt, dest))
    name = f"model.layers.{layer}.engram.embed.{tensor}"
    file = f"model-000{47 if layer == 1 else 48}-of-00048.safetensors"
    shard = read_shard(str(dest / file))
    t = shard.tensors[name]
    rb = t.nbytes // ROWS
    at = shard.data_start + t.begin + row * rb + rb - 1
    flip(dest / file, at)
    exact = ec.verify(str(dest), str(ckpt))
    assert not exact["ok"]
    assert [(p["tensor"], p["row"], p["offset"]) for p in exact["problems"]] == [(name, row, at)]
    rough = ec.verify(str(dest))  # no source: the bad chunk's rows
    (p,) = rough["problems"]
    assert p["tensor"] == name and p["rows"][0] <= row < p["rows"][1] and "give --source" in p["problem"]


def test_verify_reports_the_header_and_a_changed_source(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    ec.copy(request(ckpt, dest))
    flip(dest / "model-00047-of-00048.safetensors", 20)
    assert ec.verify(str(dest), str(ckpt))["problems"][0]["tensor"] == "(header)"
    flip(dest / "model-00047-of-00048.safetensors", 20)
    shard = read_shard(str(ckpt / "model-00048-of-00048.safetensors"))
    t = shard.tensors["model.layers.14.engram.embed.weight"]
    flip(ckpt / "model-00048-of-00048.safetensors", shard.data_start + t.begin + 3000 * 256)
    problems = ec.verify(str(dest), str(ckpt))["problems"]
    assert [(p["tensor"], "checkpoint changed" in p["problem"]) for p in problems] == [
        ("model.layers.14.engram.embed.weight", True)]


def test_verify_without_a_manifest_says_why(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    run_helper(cli_args(ckpt, dest), env_fault="crash_after_chunks=2")
    with pytest.raises(ec.EngramError, match="no manifest: the copy is incomplete.*run the copy again to resume"):
        ec.verify(str(dest))


# -- bad input and faults: one error naming the file, no manifest ---------------------------------------
def _shard(path: Path, scale_rows: int = ROWS, values_shape: list[int] | None = None) -> None:
    write_shard(path, [TensorSpec("model.layers.1.engram.embed.weight", "F8_E4M3", values_shape or [ROWS, 256]),
                       TensorSpec("model.layers.1.engram.embed.scale", "F8_E8M0", [scale_rows, 8])])


@pytest.mark.parametrize("case,expect", [
    ("wrong-shape", "model-00047-of-00048.safetensors: tensor model.layers.1.engram.embed.scale matches the Engram "
                    "pattern but has shape [4095, 8]; the layer-1 table has 4096 rows"),
    ("past-end", "layer 1: rows [4000, 5000) run past the table end: model.layers.1.engram.embed.weight in "),
    ("empty", "layer 1: rows [10, 10) is not a range"),
    ("no-match", "no tensor matches 'model.layers.2.engram.*' for layer 2 in model-00047-of-00048.safetensors"),
    ("not-safetensors", "model-00047-of-00048.safetensors: not a safetensors file"),
    ("truncated", "model-00047-of-00048.safetensors: truncated: tensor model.layers.1.engram.embed.scale ends"),
    ("one-d-table", "tensor model.layers.1.engram.embed.weight has shape [1048576]; an Engram table is [rows, values]"),
])
def test_bad_input_is_one_clear_error_and_no_manifest(tmp_path: Path, case: str, expect: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shard = src / "model-00047-of-00048.safetensors"
    ranges = {1: (0, 100)}
    if case == "wrong-shape":
        _shard(shard, scale_rows=ROWS - 1)
    elif case == "one-d-table":
        _shard(shard, values_shape=[ROWS * 256])
    else:
        _shard(shard)
    if case == "past-end":
        ranges = {1: (4000, 5000)}
    elif case == "empty":
        ranges = {1: (10, 10)}
    elif case == "no-match":
        ranges = {2: (0, 10)}
    elif case == "not-safetensors":
        shard.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    elif case == "truncated":
        os.truncate(shard, shard.stat().st_size - 100)
    dest = tmp_path / "d"
    with pytest.raises(ec.EngramError) as exc:
        ec.copy(request(src, dest, ranges=ranges))
    assert expect in str(exc.value)
    assert exc.value.code == 2
    assert not (dest / ec.MANIFEST).exists()
    # the helper file says the same on stdout (JSON) and stderr, and exits 2
    p = run_helper(cli_args(src, dest, ranges))
    assert p.returncode == 2 and expect in p.stderr
    assert json.loads(p.stdout.splitlines()[-1])["event"] == "error"


def test_disk_full_mid_copy_then_resume(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    with pytest.raises(ec.EngramError, match=r"no space left on device after \d+ of \d+ bytes.*resumes") as exc:
        ec.copy(request(ckpt, dest), faults=ec.Faults("enospc_after_bytes=400000"))
    assert exc.value.code == 1 and "model-000" in str(exc.value)
    assert not (dest / ec.MANIFEST).exists()
    done = journal_entries(dest)
    assert done
    summary = ec.copy(request(ckpt, dest))
    assert summary["chunks_skipped"] == len(done)
    assert_exact(ckpt, dest)


def test_not_enough_space_is_refused_before_copying(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    with pytest.raises(ec.EngramError, match="not enough space: the copy needs .* MiB more and 0.0 MiB are free"):
        ec.copy(request(ckpt, dest), faults=ec.Faults("free_bytes=1000"))
    assert not (dest / ec.MANIFEST).exists()


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root and CAP_SYS_ADMIN)")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_a_real_full_disk(ckpt: Path, small_tmpfs: Path) -> None:
    dest = small_tmpfs / "d"
    with pytest.raises(ec.EngramError, match="not enough space"):
        ec.copy(request(ckpt, dest))
    # past the free-space check (as when something else fills the disk meanwhile): the write fails
    with pytest.raises(ec.EngramError, match="no space left on device") as exc:
        ec.copy(request(ckpt, dest), faults=ec.Faults("free_bytes=1e12"))
    assert exc.value.code == 1
    assert not (dest / ec.MANIFEST).exists()


def test_source_changing_during_the_copy_is_caught(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    target = ckpt / "model-00048-of-00048.safetensors"

    def grow(chunk: ec.Chunk, calls: list[int] = []) -> None:  # noqa: B006 - a call counter
        calls.append(1)
        if len(calls) == 3:
            with open(target, "ab") as f:
                f.write(b"\0" * 10)
    with pytest.raises(ec.EngramError, match=r"model-00048-of-00048.safetensors: changed during the copy \(size") as exc:
        ec.copy(request(ckpt, dest), on_chunk=grow)
    assert exc.value.code == 1
    assert not (dest / ec.MANIFEST).exists() and not (dest / ec.JOURNAL).exists()


def test_a_rewritten_header_with_the_same_size_and_mtime_is_caught(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    target = ckpt / "model-00047-of-00048.safetensors"
    st = target.stat()

    def rewrite(chunk: ec.Chunk, calls: list[int] = []) -> None:  # noqa: B006 - a call counter
        calls.append(1)
        if len(calls) == 2:
            i = target.read_bytes().index(b'"pt"')
            with open(target, "r+b") as f:  # in place: the size never changes, not even for a moment
                f.seek(i + 1)
                f.write(b"PT")  # the metadata value: same length, different header
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ec.EngramError, match=r"changed during the copy \(header_sha256 differ\)"):
        ec.copy(request(ckpt, dest), on_chunk=rewrite)
    assert not (dest / ec.MANIFEST).exists()


def test_the_checkpoint_is_never_the_destination(ckpt: Path, tmp_path: Path) -> None:
    before = {p.name: p.read_bytes() for p in ckpt.glob("*.safetensors")}
    with pytest.raises(ec.EngramError, match="the destination is the checkpoint directory itself"):
        ec.copy(request(ckpt, ckpt))
    links = tmp_path / "links"
    links.mkdir()
    for name in before:  # a dir of links to the shards, as an HF snapshot is
        (links / name).symlink_to(ckpt / name)
    with pytest.raises(ec.EngramError, match="is the source shard itself"):
        ec.copy(request(ckpt, links))
    assert {p.name: p.read_bytes() for p in ckpt.glob("*.safetensors")} == before


def test_two_copies_into_one_directory_are_refused(ckpt: Path, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    env = dict(os.environ)
    env["SPARKFLEET_ENGRAM_FAULT"] = "sleep_per_chunk=0.05"
    proc = subprocess.Popen([sys.executable, "-I", str(HELPER), *cli_args(ckpt, dest)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        proc.stdout.readline()  # the plan line: it holds the lock now
        with pytest.raises(ec.EngramError, match="another engram copy is running into this directory"):
            ec.copy(request(ckpt, dest))
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


# -- resources -------------------------------------------------------------------------------------------------
def _fs_type(path: Path) -> str:
    best, kind = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if str(path).startswith(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind


def test_memory_stays_bounded_and_verification_reads_the_disk(tmp_path: Path) -> None:
    rows = 128 * 1024  # a 32 MiB table, copied whole by one rank
    fx = make_checkpoint(tmp_path / "ck", rows=rows, layers=(1,))
    dest = tmp_path / "d"
    env = dict(os.environ)
    run = run_measured([sys.executable, "-I", str(HELPER), "copy", "--source", str(fx.root), "--dest", str(dest),
                        "--tensors", PATTERN, "--range", f"1:0:{rows}", "--chunk-mb", "0.5", "--window-mb", "1"],
                       env=env, stdout_path=str(tmp_path / "out.jsonl"))
    assert run.exit == 0
    stdout = run.stdout
    copied = json.loads(stdout.splitlines()[-1])["bytes_copied"]
    assert copied > 32 * ec.MiB
    assert run.maxrss_kib * 1024 < 40 * ec.MiB, f"peak RSS {run.maxrss_kib / 1024:.1f} MiB"  # python ~19 + ~7 buffers
    if _fs_type(tmp_path) not in ("tmpfs", "ramfs", "overlay", ""):
        # read back past the page cache: the child read at least the copy's bytes from the block device
        assert run.inblock * 512 >= copied
