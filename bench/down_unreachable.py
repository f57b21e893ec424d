"""`down` with one node unreachable against a healthy `down`, on the simulated lab, in the same run.

    .venv/bin/python bench/down_unreachable.py [--repeat 3] [--transport local|ssh]

For each repeat: `up` dcp2 (models gate only, no probes), then `down` timed end to end (healthy); then for
each kind of unreachable: `up` again, the fault on bluey, `down` timed end to end: it returns only once
every rank on the nodes that answer is gone (then fails naming bluey), so its wall time is the time to
"every reachable rank gone" plus the record. The kinds: `unreachable` (local mode: the node's wrapper
answers as ssh does for a host with no route, at once; ssh mode: its sshd is stopped, connection refused)
and, in ssh mode (root), `blackhole` (every packet on its management link dropped: a connect only times out,
after the SSH connect timeout, 10 s).
THE LAB IS A SIMULATION. Prints a table and the ratios; asserts nothing. Goal (issue 26): within 1.5 x the
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
CONNECT_TIMEOUT_S = 10.0  # fleet/connect.py transport_for's default: what every CLI command waits for a connect


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
    kinds = ["unreachable", *(["blackhole"] if args.transport == "ssh" else [])]
    runs: dict[str, list[tuple[float, float, int]]] = {"healthy": [], **{k: [] for k in kinds}}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SPARKFLEET_STATE": str(Path(tmp) / "state"), "PYTHONPATH": str(REPO)}
        r = sf(env, "sim", "up", "--transport", args.transport, *(["--force"] if args.transport == "ssh" else []))
        if r.returncode:
            raise SystemExit(r.stderr)
        try:
            for _ in range(args.repeat):
                up(env)
                runs["healthy"].append(timed_down(env))
                for kind in kinds:
                    up(env)
                    f = sf(env, "sim", "fault", "bluey", kind)
                    if f.returncode:
                        raise SystemExit(f"sim fault bluey {kind}: {f.stderr}")
                    runs[kind].append(timed_down(env))
                    sf(env, "sim", "heal", "bluey")
                    sf(env, "down", *LANE, "--json")  # bluey's rank, now that it answers
        finally:
            sf(env, "sim", "down")
    print(f"transport {args.transport}; median of {args.repeat}; load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs\n")
    print(f"{'down':<26} {'wall s':>8} {'stop step s':>12} {'exit':>5} {'/ healthy':>10}")
    base = statistics.median(w for w, _, _ in runs["healthy"])
    for name, got in runs.items():
        label = "healthy" if name == "healthy" else f"bluey {name}"
        wall = statistics.median(w for w, _, _ in got)
        print(f"{label:<26} {wall:8.2f} {statistics.median(s for _, s, _ in got):12.2f} {got[0][2]:>5} "
              f"{wall / base:10.2f}")
    print(f"\ngoal: <= 1.5 x healthy = {1.5 * base:.2f} s; for the blackhole plus the SSH connect timeout "
          f"({CONNECT_TIMEOUT_S:g} s): {1.5 * base + CONNECT_TIMEOUT_S:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
