"""`up` overhead on the lab's 4 Sparks with each node's real Docker daemon against the docker shim, in one run.

    sudo .venv/bin/python bench/up_docker.py [--repeat 3] [--poll 0.2] [--transport local|ssh]

The same measurement as bench/up_overhead.py (its ops dir, its `up` without the answer gates, the sim
engine's boot time subtracted), once on a lab built with `sim up --docker shim` and once with `--docker
daemon` (root and Debian's docker.io). Also times `sim up` and `sim down` themselves. THE LAB IS A
SIMULATION; the engine boots in seconds. Prints a table and the ratio daemon/shim; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from up_overhead import one, ops_root, sf  # noqa: E402

from sparkfleet.sim import values  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--poll", type=float, default=0.2)
    parser.add_argument("--transport", choices=("local", "ssh"), default="local")
    args = parser.parse_args(argv)
    boot = values.ENGINE_BOOT_S
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ops = ops_root(Path(tmp))
        for docker in ("shim", "daemon"):
            env = {**os.environ, "SPARKFLEET_STATE": str(Path(tmp) / f"state-{docker}")}
            t0 = time.perf_counter()
            r = sf(env, "sim", "up", "--inventory", str(ops / "inventories/lab.yaml"), "--root", str(ops),
                   "--transport", args.transport, "--docker", docker)
            sim_up = time.perf_counter() - t0
            if r.returncode:
                raise SystemExit(r.stderr)
            try:
                walls = [one(env, ops, "bench-tp4", args.poll)[0] for _ in range(args.repeat)]
            finally:
                t0 = time.perf_counter()
                sf(env, "sim", "down")
                sim_down = time.perf_counter() - t0
            rows.append((docker, statistics.median(walls), statistics.median(walls) - boot, sim_up, sim_down))
    print(f"4 nodes, transport {args.transport}; sim engine boot subtracted: {boot:g} s; poll {args.poll:g} s; "
          f"median of {args.repeat}\n")
    print(f"{'docker':>7} {'up wall s':>10} {'overhead s':>11} {'sim up s':>9} {'sim down s':>11}")
    for docker, wall, over, up, down in rows:
        print(f"{docker:>7} {wall:10.2f} {over:11.2f} {up:9.2f} {down:11.2f}")
    print(f"\noverhead daemon/shim: {rows[1][2] / rows[0][2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
