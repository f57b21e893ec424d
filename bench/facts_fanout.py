"""Facts fan-out: `gather` over real sshd nodes against a serial loop of plain `ssh NODE <the same helper>`.

    .venv/bin/python bench/facts_fanout.py [--sizes 5,10,20] [--repeat 3]

Nodes are OpenSSH sshd processes from tests/sshlab.py (network namespaces as root, else 127.0.0.1
ports) with strict host-key checking. Both sides run the same node-side helper
(sparkfleet/fleet/nodeside/facts.py, shipped once before timing) with the same request on stdin:
the baseline is OpenSSH's client, one node after the other, over 5 nodes; sparkfleet is
`gather(SshTransport)` at 5, 10 and 20 nodes, timed cold (fresh transport: connect + one round
trip per node) and warm (connections reused). Medians over --repeat. Not a test: nothing here is
asserted; it prints a table and the ratios the fleet issue sets as targets
(parallel5 <= 0.5 x serial5, t20 <= 1.5 x t5).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for `tests.sshlab` when run as a script

from sparkfleet.fleet.gather import gather  # noqa: E402
from sparkfleet.fleet.nodefacts import FactsRequest, NodeFacts  # noqa: E402
from sparkfleet.fleet.ship import ensure_helper, remote_path  # noqa: E402
from sparkfleet.fleet.ssh import SshTransport  # noqa: E402
from tests.sshlab import SshLab  # noqa: E402


def requests(names: list[str]) -> dict[str, FactsRequest]:
    return {n: FactsRequest(node=n, paths=["/tmp", "/var/tmp"]) for n in names}


def serial(lab: SshLab, names: list[str]) -> tuple[float, int]:
    """OpenSSH client, one node after the other, each running the shipped helper."""
    failures = 0
    start = time.perf_counter()
    for n in names:
        r = subprocess.run(lab.ssh_argv(n, f"python3 {remote_path('facts.py')}"), capture_output=True,
                           input=requests([n])[n].model_dump_json().encode())
        failures += r.returncode != 0 or b'"helper_version"' not in r.stdout
    return time.perf_counter() - start, failures


def parallel(lab: SshLab) -> tuple[float, float, int]:
    nodes = list(lab.inventory().nodes.values())
    reqs = requests([n.name for n in nodes])
    transport = SshTransport(lab.known_hosts, connect_timeout_s=10)
    try:
        t0 = time.perf_counter()
        cold = gather(transport, nodes, reqs)
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        warm = gather(transport, nodes, reqs)
        warm_s = time.perf_counter() - t0
    finally:
        transport.close()
    bad = [n for n, f in [*cold.items(), *warm.items()] if not isinstance(f, NodeFacts)]
    return cold_s, warm_s, len(bad)


def ship(lab: SshLab) -> None:
    transport = SshTransport(lab.known_hosts, connect_timeout_s=10)
    try:
        res = ensure_helper(transport, list(lab.inventory().nodes.values()))
        if not all(r.ok for r in res.values()):
            raise SystemExit(f"could not ship the helper: {[r.message for r in res.values() if not r.ok]}")
    finally:
        transport.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="5,10,20")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    rows = []
    with SshLab(5, prefix="sff") as lab:
        ship(lab)
        print(f"sshlab mode: {lab.mode}", flush=True)
        runs = [serial(lab, list(lab.nodes)) for _ in range(args.repeat)]
        rows.append(("serial ssh + helper", 5, statistics.median(t for t, _ in runs), None, sum(f for _, f in runs)))
    for size in sizes:
        with SshLab(size, prefix="sff") as lab:
            ship(lab)
            runs = [parallel(lab) for _ in range(args.repeat)]
        rows.append(("sparkfleet gather", size, statistics.median(c for c, _, _ in runs),
                     statistics.median(w for _, w, _ in runs), sum(f for _, _, f in runs)))
    print(f"\n{'method':<22} {'nodes':>5} {'cold s':>8} {'warm s':>8} {'failures':>9}")
    for method, n, cold, warm, failed in rows:
        print(f"{method:<22} {n:>5} {cold:8.3f} {(f'{warm:8.3f}' if warm is not None else '       -')} {failed:>9}")
    base = rows[0][2]
    par = {n: (c, w) for _, n, c, w, _ in rows[1:]}
    if 5 in par:
        print(f"\nparallel5 / serial5: {par[5][0] / base:.2f} cold, {par[5][1] / base:.2f} warm  (target <= 0.5)")
    if 5 in par and 20 in par:
        print(f"t20 / t5: {par[20][0] / par[5][0]:.2f} cold, {par[20][1] / par[5][1]:.2f} warm  (target <= 1.5)")
    return 1 if any(r[4] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
