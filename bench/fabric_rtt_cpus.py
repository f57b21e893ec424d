"""The fabric probe's round trip against where its two ends run: same CPU or not, sleeping or spinning ends.

    .venv/bin/python bench/fabric_rtt_cpus.py [--baseline-rev 6476cf5] [--runs 2]

Two network namespaces of the bench's own on one bridge (tests/netnslab.py), the probe's helper run in
each with `ip netns exec taskset -c CPU python3 HELPER`: the server pinned to one CPU, the driver to
the same one or the other, 20 echoes at 48 KB and 400 KB (the probe's RTT_COUNT and RTT_SIZES), the
least of them as the probe reports. Two helpers in the same run: this tree's (its ends spin, yielding
the CPU, while an echo is on its way) and the baseline's from git (its ends sleep in recv). On real
nodes the two ends are always on different machines; on the lab's shared CPUs a link's ends land on
the same CPU or not by chance, so the spread over placements is what a healthy lab link can read.
As root only; needs two CPUs. Not a test; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkfleet.fleet import fabric_measure as fp  # noqa: E402
from tests import netnslab  # noqa: E402

HELPER = "sparkfleet/fleet/nodeside/fabric_probe.py"
PLACEMENTS = [(0, 0), (1, 1), (0, 1), (1, 0)]  # (server CPU, driver CPU)


def once(lab: netnslab.NetnsLab, helper: Path, srv_cpu: int, drv_cpu: int) -> dict[str, float]:
    """One driver session against a fresh server, each pinned: size -> least round trip (s)."""
    a, b = lab.names[0], lab.names[1]
    allow = [lab.ips[a], lab.ips[b]]
    serve = {"mode": "serve", "bind": lab.ips[b], "port": fp.PORT, "allow": allow, "sessions": 1, "timeout_s": 60}
    drive = {"mode": "drive", "source": lab.ips[a], "peer": lab.ips[b], "port": fp.PORT, "allow": allow,
             "rtt_sizes": list(fp.RTT_SIZES), "rtt_count": fp.RTT_COUNT, "bulk_bytes": 0}

    def helper_in(name: str, cpu: int) -> list[str]:
        return ["ip", "netns", "exec", lab.ns[name], "taskset", "-c", str(cpu), "python3", str(helper)]

    server = subprocess.Popen(helper_in(b, srv_cpu), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None
    server.stdin.write(json.dumps(serve))
    server.stdin.close()
    try:
        got = subprocess.run(helper_in(a, drv_cpu), input=json.dumps(drive), capture_output=True, text=True,
                             timeout=120, check=True)
    finally:
        server.wait(timeout=60)
    doc = json.loads(got.stdout)
    if doc.get("error"):
        raise RuntimeError(doc["error"])
    return {k: float(v) for k, v in doc["rtt_s"].items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-rev", default="6476cf5", help="the commit whose helper is the baseline")
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    if not netnslab.available() or (os.cpu_count() or 1) < 2:
        print("bench/fabric_rtt_cpus.py needs root, ip, taskset and two CPUs", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as home:
        old = Path(home) / "baseline_fabric_probe.py"
        old.write_text(subprocess.run(["git", "-C", str(root), "show", f"{a.baseline_rev}:{HELPER}"],
                                      capture_output=True, text=True, check=True).stdout)
        helpers = {"spin (this tree)": root / HELPER, f"sleep ({a.baseline_rev})": old}
        lab = netnslab.NetnsLab(2, Path(home), tag="r")
        try:
            rows: dict[tuple[str, int, int], dict[str, list[float]]] = {}
            for _ in range(a.runs):
                for name, helper in helpers.items():
                    for srv, drv in PLACEMENTS:
                        for size, t in once(lab, helper, srv, drv).items():
                            rows.setdefault((name, srv, drv), {}).setdefault(size, []).append(t)
                        time.sleep(0.2)  # the server's port is free again
        finally:
            lab.destroy()
    sizes = [str(s) for s in fp.RTT_SIZES]
    print(f"# least RTT of {fp.RTT_COUNT} echoes (us), best of {a.runs} runs; server CPU / driver CPU")
    print(f"{'helper':22} {'srv':>3} {'drv':>3} " + " ".join(f"{int(s) // 1024:>6} KB" for s in sizes))
    for (name, srv, drv), by in rows.items():
        print(f"{name:22} {srv:>3} {drv:>3} " + " ".join(f"{min(by[s]) * 1e6:>9.0f}" for s in sizes))
    for name in helpers:
        for s in sizes:
            best = [min(by[s]) for (n, _, _), by in rows.items() if n == name]
            print(f"{name} {int(s) // 1024} KB: slowest placement / fastest {max(best) / min(best):.2f}x "
                  f"(the probe fails a link at 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
