"""Engram copy benchmark: sparkfleet's copy (verified, and --no-verify) against `dd` over the same bytes.

    .venv/bin/python bench/engram_copy.py [--dir /tmp/sparkfleet-engram-bench] [--rows 4194304] [--repeat 3]

One run generates a checkpoint (two Engram tables of --rows x 256 FP8 values + per-32 E8M0 scales,
in shards 47 and 48, as the real ones are laid out, CATALOG ENG-01/04) and takes one rank's rows,
the middle half of each table. On those same files it times, --repeat times each, interleaved:

  - sparkfleet verify:    engram_copy.py copy (read, hash, write, fdatasync, drop from the page
                          cache, read back from disk and compare), run as a node runs it
  - sparkfleet no-verify: the same with --no-verify (still durable and journaled for resume)
  - dd:                   one `dd` per byte span of the copy's plan (the shard headers and each
                          tensor's row range: skip/seek, conv=notrunc,fsync) into sparse files

The page cache is dropped before every run when this runs as root (sync; echo 3 >
/proc/sys/vm/drop_caches), so every run reads the source from the disk; the table says whether it
did. Throughput is bytes copied / wall time from spawn to exit, the copy's own Python start-up
included (MB = 10^6 bytes), medians over --repeat; peak RSS is the child's own (wait4 from a small
launcher, so about 9 MiB is the launcher's floor). Not a test:
it prints a table and the ratios against dd and asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from sparkfleet.engram.measure import Measured, run_measured  # noqa: E402
from sparkfleet.engram.safetensors import make_checkpoint  # noqa: E402
from sparkfleet.fleet.nodeside import engram_copy as ec  # noqa: E402

SEEDS_MB_S = 150.0  # engram_local.py in the seeds: "about 6 minutes per node at 150 MB/s" (CATALOG ENG-24)
PATTERN = "model.layers.{layer}.engram.*"


def drop_caches() -> bool:
    """Drop the page cache (root only); False when this machine does not let us."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def dd_script(plan: ec.Plan, src: Path, dest: Path) -> str:
    """Sparse files of the shards' sizes, then one dd per span of the plan: exactly the copy's bytes."""
    lines = ["set -euo pipefail"]
    for shard in plan.shards:
        lines.append(f"truncate -s {shard.size} {shlex.quote(str(dest / shard.name))}")
    for s in plan.spans:
        lines.append(f"dd if={shlex.quote(str(src / s.file))} of={shlex.quote(str(dest / s.file))} bs=8M "
                     f"skip={s.offset} seek={s.offset} count={s.length} iflag=skip_bytes,count_bytes "
                     "oflag=seek_bytes conv=notrunc,fsync status=none")
    return "\n".join(lines) + "\n"


def timed(argv: list[str], out: Path) -> tuple[float, Measured]:
    """Wall time from spawn to exit (the child's own start-up included, the launcher's not)."""
    m = run_measured(argv, stdout_path=str(out))
    if m.exit != 0:
        raise SystemExit(f"{argv[:3]} failed (exit {m.exit}):\n{m.stdout[-2000:]}")
    return m.wall_s, m


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/tmp/sparkfleet-engram-bench", help="scratch dir (removed at the end)")
    parser.add_argument("--rows", type=int, default=4 * 1024 * 1024, help="rows per table (default 4Mi: 1.06 GiB)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method; the median is shown")
    parser.add_argument("--chunk-mb", type=float, default=ec.DEFAULT_CHUNK / ec.MiB)
    parser.add_argument("--window-mb", type=float, default=ec.DEFAULT_WINDOW / ec.MiB)
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args(argv)
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    src = root / "ckpt"
    print(f"generating two {args.rows:,}-row tables in {src} ...", file=sys.stderr)
    make_checkpoint(src, rows=args.rows)
    quarter = args.rows // 4
    ranges = {1: (quarter, 3 * quarter), 14: (quarter, 3 * quarter)}
    req = ec.CopyRequest(source=str(src), dest=str(root / "x"), ranges=ranges, tensors=PATTERN,
                         chunk_bytes=int(args.chunk_mb * ec.MiB))
    plan = ec.build_plan(req, str(src))
    total = plan.total_bytes
    shard_bytes = sum(s.size for s in plan.shards)
    helper = [sys.executable, "-I", ec.__file__, "copy", "--source", str(src), "--tensors", PATTERN,
              "--chunk-mb", str(args.chunk_mb), "--window-mb", str(args.window_mb)]
    for layer, (s, e) in ranges.items():
        helper += ["--range", f"{layer}:{s}:{e}"]
    methods = {
        "sparkfleet verify": lambda d: helper + ["--dest", str(d)],
        "sparkfleet no-verify": lambda d: helper + ["--dest", str(d), "--no-verify"],
        "dd (same spans)": lambda d: ["bash", str(root / "dd.sh")],
    }
    (root / "dd.sh").write_text(dd_script(plan, src, root / "dd"))
    results: dict[str, list[tuple[float, Measured]]] = {m: [] for m in methods}
    dropped = []
    for i in range(args.repeat):
        for name, make in methods.items():
            dest = root / ("dd" if name.startswith("dd") else "copy")
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            dropped.append(drop_caches())
            wall, m = timed(make(dest), root / "out.txt")
            results[name].append((wall, m))
            print(f"  run {i + 1} {name}: {total / wall / 1e6:.0f} MB/s", file=sys.stderr)
            if name.startswith("sparkfleet verify") and i == 0:  # the copies must be the same bytes
                check = ec.verify(str(dest), str(src))
                assert check["ok"], check["problems"][:3]
    floor = statistics.median(total / w / 1e6 for w, _ in results["dd (same spans)"])
    print()
    print(f"engram copy: {total / 1e6:,.0f} MB of one rank's rows ({len(plan.spans)} spans in {len(plan.shards)} "
          f"shards of {shard_bytes / 1e6:,.0f} MB), chunk {args.chunk_mb:g} MiB, window {args.window_mb:g} MiB, "
          f"{args.repeat} runs each")
    print(f"page cache dropped before every run: {'yes' if all(dropped) else 'NO (not root?)'}; "
          f"source and copy on {src.parent} ({_fs(src)})")
    print()
    print(f"| {'method':<22} | {'MB/s':>7} | {'min-max MB/s':>13} | {'peak RSS MiB':>12} | {'CPU s':>6} | "
          f"{'vs dd':>6} | target |")
    print(f"|{'-' * 24}|{'-' * 9}|{'-' * 15}|{'-' * 14}|{'-' * 8}|{'-' * 8}|--------|")
    targets = {"sparkfleet verify": 0.9, "sparkfleet no-verify": 0.9}  # issue 42 §6 (verify was 0.6 before it)
    for name, runs in results.items():
        rates = [total / w / 1e6 for w, _ in runs]
        med = statistics.median(rates)
        rss = max(m.maxrss_kib for _, m in runs) / 1024
        cpu = statistics.median(m.utime + m.stime for _, m in runs)
        ratio = med / floor
        target = targets.get(name)
        mark = "" if target is None else (f">= {target}: {'ok' if ratio >= target else 'MISSED'}")
        print(f"| {name:<22} | {med:>7.0f} | {min(rates):>6.0f}-{max(rates):<6.0f} | {rss:>12.1f} | {cpu:>6.2f} | "
              f"{ratio:>5.2f}x | {mark} |")
    print(f"| {'seeds engram_local.py':<22} | {SEEDS_MB_S:>7.0f} | {'':>13} | {'':>12} | {'':>6} | "
          f"{SEEDS_MB_S / floor:>5.2f}x | reference: GB10 NVMe from NFS, not this machine |")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _fs(path: Path) -> str:
    best, kind, dev = "", "?", "?"
    real = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if real.startswith(parts[1]) and len(parts[1]) >= len(best):
            best, dev, kind = parts[1], parts[0], parts[2]
    return f"{kind} on {dev}"


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
