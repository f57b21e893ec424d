"""The fabric probe's own cost (4 ranks, all pairs) and its accuracy against tc tbf rates set in the same run.

    .venv/bin/python bench/fabric_probe.py [--bulk-mib 64] [--runs 3]

Four network namespaces of the bench's own on one bridge (tests/netnslab.py: unique names, removed
at the end), each with a fabric IP, reached with `ip netns exec` the way the SSH transport reaches a
node: the probe ships and runs its stdlib helper exactly as on a lab. As root only.

1. Cost: `fabric_probe.probe` over the 4 ranks (6 links: RTT at 48 KB and 400 KB, --bulk-mib each
   way in 4 timed pieces), unshaped links, --runs times: wall time, and the part of it spent
   measuring (per round, its slowest pair's time on the wire); against a baseline measured in the
   same run, just before each probe: one helper round trip on all four nodes (the sha256-checked
   no-op every helper run pays), times the helper runs a probe makes (ship check, servers, 3 rounds).
2. Accuracy: n1 shaped to 100 Mbit/s and n2 to 1 Gbit/s (tbf on their fabric interface, egress),
   n0 and n3 left alone, then one probe: every direction a shaped node sends in is compared with its
   configured rate. tbf counts Ethernet frames; the probe measures TCP payload, so the expected
   figure is the rate times 1448/1514 (MSS over frame at MTU 1500) -- shown, and the error is given
   against both. Target (issue 15): within 15% of the configured rate.
Not a test; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkfleet.fleet import fabric_measure as fp  # noqa: E402
from sparkfleet.fleet.ship import ensure_helper  # noqa: E402
from tests import netnslab  # noqa: E402

PAYLOAD = 1448 / 1514  # TCP payload per Ethernet frame at MTU 1500 (timestamps on)
# tbf's burst must hold at least rate/HZ (HZ 250 here): 1mbit for 100 Mbit/s, 4mbit for 1 Gbit/s
RATES = {"n1": ("100mbit", 100e6, "1mbit"), "n2": ("1gbit", 1e9, "4mbit")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bulk-mib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if not netnslab.available():
        print("bench/fabric_probe.py needs root, ip and tc (network namespaces)", file=sys.stderr)
        return 2
    bulk = a.bulk_mib * 2**20
    with tempfile.TemporaryDirectory() as home:
        lab = netnslab.NetnsLab(4, Path(home), tag="b")
        try:
            ensure_helper(lab, lab.nodes, fp.HELPER)
            rounds = len(fp.rounds(4))
            helper_runs = 2 + rounds  # ship check, servers, one per round
            walls, base, wire = [], [], []
            for _ in range(a.runs):
                t = time.perf_counter()
                ensure_helper(lab, lab.nodes, fp.HELPER)
                base.append((time.perf_counter() - t) * helper_runs)
                t = time.perf_counter()
                run = fp.probe(lab, lab.ranks, bulk_bytes=bulk)
                walls.append(time.perf_counter() - t)
                assert all(x.error is None for x in run.links), [x.error for x in run.links]
                by_round = [[x for x in run.links if (x.a, x.b) in {(f"n{i}", f"n{j}") for i, j in rnd}]
                            for rnd in fp.rounds(4)]
                wire.append(sum(max(x.elapsed_s or 0 for x in rnd) for rnd in by_round))
            print(f"# fabric probe cost: 4 ranks, {len(run.links)} links, {a.bulk_mib} MiB each way, "
                  f"RTT at 48 KB and 400 KB, unshaped veth ({os.cpu_count()} CPUs, shared), {a.runs} runs")
            print(f"{'':34} {'median s':>9} {'min s':>7} {'max s':>7}")
            for label, xs in (("probe wall time", walls), ("  of which measuring (per round)", wire),
                              (f"baseline: {helper_runs} helper round trips", base)):
                print(f"{label:34} {statistics.median(xs):9.2f} {min(xs):7.2f} {max(xs):7.2f}")
            print(f"ratio probe wall / baseline: {statistics.median(walls) / statistics.median(base):.2f}; "
                  f"overhead beyond measuring: {statistics.median(walls) - statistics.median(wire):.2f} s")
            slowest = max(run.links, key=lambda x: x.elapsed_s or 0)
            print(f"slowest link's measurement: {slowest.name} {slowest.elapsed_s:.2f} s; link figures (last run):")
            for x in run.links:
                print(f"  {x.name:12} {x.a_to_b_bps / 1e9:6.2f} / {x.b_to_a_bps / 1e9:6.2f} Gb/s, RTT 48 KB "
                      f"{x.rtt_s['49152'] * 1e3:.3f} ms, 400 KB {x.rtt_s['409600'] * 1e3:.3f} ms")

            for node, (rate, _, burst) in RATES.items():
                lab.shape(node, rate, burst)
            t = time.perf_counter()
            run = fp.probe(lab, lab.ranks, bulk_bytes=bulk)
            shaped_wall = time.perf_counter() - t
            print(f"\n# accuracy: tbf on n1 100mbit (burst 1mbit), n2 1gbit (burst 4mbit), one probe "
                  f"({shaped_wall:.1f} s), {a.bulk_mib} MiB each way")
            print(f"{'direction':10} {'configured':>10} {'x payload':>10} {'measured':>10} {'err/rate':>9} "
                  f"{'err/payload':>11}")
            worst = 0.0
            for x in run.links:
                for src, dst, bps in ((x.a, x.b, x.a_to_b_bps), (x.b, x.a, x.b_to_a_bps)):
                    if src not in RATES or bps is None:
                        continue
                    rate = RATES[src][1]
                    err = bps / rate - 1
                    worst = max(worst, abs(err))
                    print(f"{src + '->' + dst:10} {rate / 1e6:8.0f} M {rate * PAYLOAD / 1e6:8.1f} M "
                          f"{bps / 1e6:8.1f} M {err * 100:8.1f}% {(bps / (rate * PAYLOAD) - 1) * 100:10.1f}%")
            print(f"worst error against the configured rate: {worst * 100:.1f}% (target: within 15%)")
        finally:
            lab.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
