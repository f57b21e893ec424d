"""`down` with one node unreachable against a healthy `down`, on the simulated lab, in the same run.

    .venv/bin/python bench/down_unreachable.py [--repeat 3] [--transport local|ssh]

For each repeat: `up` dcp2 (models gate only, no probes), then `down` timed end to end (healthy); `up`
again, `sim fault bluey unreachable`, `down` timed end to end: it returns only once every rank on the
nodes that answer is gone (then fails naming bluey), so its wall time is the time to "every reachable rank
gone" plus the record. In local mode the fault makes the node's wrapper answer as ssh does for a host with
no route (at once); in ssh mode (root, OpenSSH's sshd) it stops the node's sshd: connection refused. A
blackhole that only times out is not in the lab: with one, add the SSH connect timeout to the budget.
THE LAB IS A SIMULATION. Prints a table and the ratio; asserts nothing. Goal (issue 26): within 1.5 x the
healthy down, plus the SSH connect timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SF = [sys.executable, "-m", "sparkfleet.cli.main"]
LANE = ["--profile", "dcp2", "--inventory", "sim"]
UP = ["up", *LANE, "--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe",
      "-o", "expect.engram_node_local=false", "--json"]  # no Engram copies in a fresh lab: NFS on purpose


def sf(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SF, *args], env=env, capture_output=True, text=True, cwd=REPO)


def timed_down(env: dict) -> tuple[float, float, int]:
    """(wall s, the stop step's own s, exit code) of one `down`."""
    t0 = time.perf_counter()
    r = sf(env, "down", *LANE, "--json")
    wall = time.perf_counter() - t0
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    stop = next(e for e in events if e["event"] == "step" and e["step"] == "stop" and e["status"] != "start")
    return wall, stop.get("elapsed_s", 0.0), r.returncode


def up(env: dict) -> None:
    r = sf(env, *UP)
    if r.returncode:
        raise SystemExit(f"up failed: {r.stdout[-1500:]}{r.stderr[-500:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--transport", choices=("local", "ssh"), default="local")
    args = parser.parse_args(argv)
    healthy, sick = [], []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SPARKFLEET_STATE": str(Path(tmp) / "state"), "PYTHONPATH": str(REPO)}
        r = sf(env, "sim", "up", "--transport", args.transport, *(["--force"] if args.transport == "ssh" else []))
        if r.returncode:
            raise SystemExit(r.stderr)
        try:
            for _ in range(args.repeat):
                up(env)
                healthy.append(timed_down(env))
                up(env)
                sf(env, "sim", "fault", "bluey", "unreachable")
                sick.append(timed_down(env))
                sf(env, "sim", "heal", "bluey")
                sf(env, "down", *LANE, "--json")  # bluey's rank, now that it answers
        finally:
            sf(env, "sim", "down")
    print(f"transport {args.transport}; median of {args.repeat}; load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs\n")
    print(f"{'down':<26} {'wall s':>8} {'stop step s':>12} {'exit':>5}")
    for name, runs in (("healthy", healthy), ("bluey unreachable", sick)):
        print(f"{name:<26} {statistics.median(w for w, _, _ in runs):8.2f} "
              f"{statistics.median(s for _, s, _ in runs):12.2f} {runs[0][2]:>5}")
    ratio = statistics.median(w for w, _, _ in sick) / statistics.median(w for w, _, _ in healthy)
    print(f"\nwall ratio unreachable/healthy: {ratio:.2f}  (goal: <= 1.5, plus the SSH connect timeout for a "
          "blackhole)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
