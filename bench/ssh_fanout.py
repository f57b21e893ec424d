"""Fan-out benchmark: SshTransport.run on 5, 10 and 20 sshd nodes against a serial loop of plain `ssh`.

    .venv/bin/python bench/ssh_fanout.py [--command CMD] [--sizes 5,10,20] [--repeat 3]

Each size gets its own SshLab (tests/sshlab.py: network namespaces as root, else 127.0.0.1 ports).
The baseline is measured in the same run: OpenSSH's client, one node after the other, strict host
keys, over the first 5 nodes. SshTransport is timed cold (a fresh transport: connect + run) and
warm (the same transport again, connections reused). Times are medians over --repeat runs.
Not a test: it prints a table and ratios and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for `tests.sshlab` when run as a script

from sparkfleet.fleet.ssh import SshTransport  # noqa: E402
from tests.sshlab import SshLab  # noqa: E402

DEFAULT_COMMAND = "python3 -c 'print(1)'"  # later: the facts helper


def serial_ssh(lab: SshLab, names: list[str], command: str) -> tuple[float, int]:
    """Plain OpenSSH, one node after the other; returns (seconds, failures)."""
    start = time.perf_counter()
    failures = sum(subprocess.run(lab.ssh_argv(n, command), capture_output=True).returncode != 0 for n in names)
    return time.perf_counter() - start, failures


def fanout(lab: SshLab, command: str) -> tuple[float, float, int]:
    """SshTransport over every node of the lab: (cold seconds incl. connect, warm seconds, failures)."""
    nodes = list(lab.inventory().nodes.values())
    transport = SshTransport(lab.known_hosts, connect_timeout_s=10)
    try:
        start = time.perf_counter()
        cold = transport.run(nodes, command, timeout_s=60)
        cold_s = time.perf_counter() - start
        start = time.perf_counter()
        warm = transport.run(nodes, command, timeout_s=60)
        warm_s = time.perf_counter() - start
    finally:
        transport.close()
    failures = [r for r in [*cold.values(), *warm.values()] if not r.ok]
    for r in failures[:3]:
        print(f"  failure: {r.message}", file=sys.stderr)
    return cold_s, warm_s, len(failures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--command", default=DEFAULT_COMMAND, help=f"remote command (default: {DEFAULT_COMMAND})")
    parser.add_argument("--sizes", default="5,10,20", help="node counts (default: 5,10,20)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is shown")
    args = parser.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})

    rows: list[tuple[str, int, float, float | None, int]] = []
    base_size = min(5, sizes[0])
    with SshLab(base_size, prefix="sfb") as lab:
        print(f"sshlab mode: {lab.mode}, command: {args.command}", flush=True)
        runs = [serial_ssh(lab, list(lab.nodes), args.command) for _ in range(args.repeat)]
        rows.append(("serial ssh (OpenSSH client)", base_size, statistics.median(t for t, _ in runs), None,
                     sum(f for _, f in runs)))
    for size in sizes:
        with SshLab(size, prefix="sfb") as lab:
            runs = [fanout(lab, args.command) for _ in range(args.repeat)]
        rows.append(("SshTransport.run (parallel)", size, statistics.median(c for c, _, _ in runs),
                     statistics.median(w for _, w, _ in runs), sum(f for _, _, f in runs)))

    print(f"\n{'method':<30} {'nodes':>5} {'cold s':>8} {'warm s':>8} {'per node ms':>12} {'failures':>9}")
    for method, n, cold, warm, failed in rows:
        warm_txt = f"{warm:8.3f}" if warm is not None else f"{'-':>8}"
        print(f"{method:<30} {n:>5} {cold:8.3f} {warm_txt} {cold / n * 1000:12.1f} {failed:>9}")
    serial = rows[0][2]
    par = {n: cold for method, n, cold, _, _ in rows[1:]}
    print()
    if base_size in par:
        print(f"parallel{base_size}/serial{base_size}: {par[base_size] / serial:.2f}  "
              f"(SshTransport cold, connect included, vs OpenSSH one after the other)")
    if len(par) > 1:
        lo, hi = min(par), max(par)
        print(f"t{hi}/t{lo}: {par[hi] / par[lo]:.2f}  (nodes x{hi / lo:g})")
    return 1 if any(r[4] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
