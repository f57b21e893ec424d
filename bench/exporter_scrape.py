"""Exporter scrape latency with the poller running: 5 and 20 simulated nodes, in one run.

    .venv/bin/python bench/exporter_scrape.py [--scrapes 200] [--interval 1] [--sizes 5,20]

For each size: a simulated lab (THE SIMULATION: sparkfleet/sim, local transport) of that many nodes
(5 = the shipped lab inventory, 4 GB10 + the GB300; 20 = a generated inventory of 20 GB10 nodes
written to the scratch dir), then `sparkfleet exporter --inventory sim --interval 1s` in its own
process on a free loopback port, its poller polling back to back the whole time. After its first
poll, --scrapes GETs of /metrics from this process, one after the other, spread over about three
polls, each timed end to end over a fresh HTTP connection (perf_counter). The baseline, measured in
the same run: the exporter's own poll durations, i.e. what a scrape would cost if it gathered the
facts itself instead of reading the cache. The simulated nodes' work (the facts helper, the shims)
runs on this machine's CPUs too, unlike a real lab's. Not a test; nothing is asserted. Target
(issue 7): p99 < 20 ms at 20 nodes.
"""

from __future__ import annotations

import argparse
import http.client
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inventory_file(size: int, workdir: Path) -> str:
    """'lab' for 5 nodes; otherwise a YAML of `size` GB10 nodes shaped like the lab's workers."""
    if size == 5:
        return "lab"
    data = yaml.safe_load((REPO / "inventories" / "lab.yaml").read_text())
    worker = data["nodes"]["asusi"]
    data["name"] = f"bench{size}"
    data["nodes"] = {f"spark{i:02d}": worker for i in range(1, size + 1)}
    data["groups"] = {"sparks": list(data["nodes"])}
    path = workdir / f"bench{size}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def percentile(xs: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def metric(text: str, name: str) -> float | None:
    """The value of an unlabelled sample in an exposition."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def scrape(port: int) -> tuple[float, str]:
    """One GET /metrics over a fresh connection (as Prometheus does per scrape); (ms, body)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    ms = (time.perf_counter() - t0) * 1e3
    if resp.status != 200:
        raise RuntimeError(f"scrape answered {resp.status}")
    return ms, body.decode()


def measure(size: int, scrapes: int, interval: float, workdir: Path) -> dict:
    from sparkfleet.sim import lab

    state = workdir / f"state{size}"
    os.environ["SPARKFLEET_STATE"] = str(state)
    sim = lab.up(inventory_file(size, workdir))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = (workdir / f"exporter{size}.log").open("wb")
    # the exporter as users run it, in its own process: the scraper's work is not the exporter's
    proc = subprocess.Popen([sys.executable, "-m", "sparkfleet.cli.main", "exporter", "--inventory", "sim",
                             "--listen", f"127.0.0.1:{port}", "--interval", f"{interval:g}s"],
                            env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        assert len(sim.nodes) == size, (size, len(sim.nodes))
        deadline = time.monotonic() + 180
        first = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                _, text = scrape(port)
            except OSError:
                text = ""
            if (metric(text, "sparkfleet_exporter_polls_total") or 0) >= 1:
                first = metric(text, "sparkfleet_exporter_last_poll_duration_seconds")
                break
            time.sleep(0.2)
        if first is None:
            raise RuntimeError(f"the exporter's first poll did not finish; see {log.name}")
        up = sum(1 for line in text.splitlines() if line.startswith("sparkfleet_node_up{") and line.endswith(" 1.0"))
        polls0 = metric(text, "sparkfleet_exporter_polls_total") or 0
        # spread the scrapes over about three polls, so they meet the poller at every stage of its work
        pause = max(0.02, 3 * first / scrapes)
        lat: list[float] = []
        durations = [first]
        last_poll = polls0
        for _ in range(scrapes):
            ms, text = scrape(port)
            lat.append(ms)
            polls = metric(text, "sparkfleet_exporter_polls_total") or 0
            if polls > last_poll:
                last_poll = polls
                durations.append(metric(text, "sparkfleet_exporter_last_poll_duration_seconds") or float("nan"))
            time.sleep(pause)
        samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        return {"size": size, "up": up, "scrapes": len(lat), "p50": statistics.median(lat),
                "p99": percentile(lat, 99), "max": max(lat), "bytes": len(text.encode()), "samples": samples,
                "polls": int(last_poll - polls0), "poll_s": statistics.median(durations), "pause": pause}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        lab.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--interval", type=float, default=1.0, help="poll interval in seconds (default 1)")
    ap.add_argument("--sizes", default="5,20")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="sf-bench-exporter-") as tmp:
        rows = [measure(size, args.scrapes, args.interval, Path(tmp)) for size in sizes]
    load = os.getloadavg()[0]
    print(f"exporter scrape latency over HTTP, {args.scrapes} scrapes per size, poller every {args.interval:g} s "
          f"(simulated nodes, local transport; {os.cpu_count()} CPUs, load average {load:.1f} at the end)")
    print(f"{'nodes':>5} {'up':>3} {'samples':>7} {'bytes':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
          f"{'polls':>5} {'poll s':>7} {'poll/p50':>9}")
    for r in rows:
        ratio = r["poll_s"] * 1e3 / r["p50"]
        print(f"{r['size']:>5} {r['up']:>3} {r['samples']:>7} {r['bytes']:>7} {r['p50']:>7.2f} {r['p99']:>7.2f} "
              f"{r['max']:>7.2f} {r['polls']:>5} {r['poll_s']:>7.2f} {ratio:>8.0f}x")
    big = rows[-1]
    print(f"target: p99 < 20 ms at {big['size']} nodes: {'met' if big['p99'] < 20 else 'NOT met'} "
          f"(p99 {big['p99']:.2f} ms); baseline: a scrape that gathered facts itself would take the poll time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
