"""llama.cpp's RPC backend across the simulated lab's four Sparks: load time, tokens/s at C1/C4, and the
bytes that crossed each worker's fabric link against what llama.cpp says it offloaded there.

THE LAB IS A SIMULATION (nodes, docker, GPUs), BUT THE ENGINE IS REAL: the `llamacpp-lab` lane runs
llama.cpp's own ggml-rpc-server on asusi, bluey and spark4 and its llama-server on reddie (built once by
`make llama-rpc`), each node in its own network namespace. Needs root; it brings up the lab itself, so
run it under the lab lock:

    flock /tmp/sparkfleet-lab.lock .venv/bin/python bench/llamacpp_rpc.py [--slow-link 100mbit]

Load time = the record's `launch:head` + `wait_ready` (llama-server started until it logs that it serves,
the tensors' transfer included). Offloaded = llama.cpp's `load_tensors: RPCn[ip:port] model buffer size`
line per worker; fabric/management = the kernel's rx byte counters of the worker's interfaces over `up`.
`--slow-link RATE` repeats the run with the sim's slow-link fault on bluey (tc tbf on its fabric link);
`--vanish` then runs `up` with bluey's rpc-server container gone as soon as it starts (rank-vanish) and
says how long `up` took to fail and what it named. `--station` also runs `llamacpp-lab-station` (llama-server
on the Station, the four Sparks as rpc-servers) and adds the bytes the Station sent on its fabric port and
on management. `--watch-kill` runs `sparkfleet watch` on the healthy lane, kills bluey's rpc-server
(serve-crash) and says how long watch took to name the failure and to serve again (restart workers first).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sparkfleet.cli.main import main  # noqa: E402
from sparkfleet.sim import lab, llamabuild, netlab  # noqa: E402

LANE, WORKERS, MIB = "llamacpp-lab", ("asusi", "bluey", "spark4"), 1024 * 1024
STATION_LANE = "llamacpp-lab-station"
LANES = {LANE: ("reddie", WORKERS), STATION_LANE: ("station", ("reddie", *WORKERS))}  # head, workers
MODEL_BUFFER = re.compile(r"load_tensors: +(\S+) model buffer size = +([\d.]+) MiB")


def cli(*argv: str) -> tuple[int, list[dict]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--json"])
    lines = out.getvalue().splitlines()
    if argv[0] == "bench":  # its --json is one document (read from --out), not event lines
        return code, []
    return code, [json.loads(x) for x in lines if x.startswith("{")]


def head_log(sim, lane: str = LANE) -> str:
    head = LANES[lane][0]
    docker = json.loads((sim.state_dir(head) / "docker.json").read_text())
    (c,) = [c for c in docker["containers"] if c["Config"]["Labels"].get("sparkfleet.profile") == lane]
    return (sim.state_dir(head) / "logs" / f"{c['Id']}.log").read_text(errors="replace")


def one_run(sim, label: str, out_dir: Path, lane: str = LANE) -> dict:
    inv = sim.inventory()
    head, workers = LANES[lane]
    before, sent0 = {n: netlab.rx_bytes(n) for n in workers}, netlab.tx_bytes(head)
    code, events = cli("up", "--profile", lane, "--inventory", "sim", "--no-fabric-probe", "--poll", "0.2",
                       "--probe-seconds", "1")
    result = next(e for e in events if e["event"] == "result")
    if code != 0:
        raise SystemExit(f"{label}: up failed: {result}")
    after, sent1 = {n: netlab.rx_bytes(n) for n in workers}, netlab.tx_bytes(head)
    rec = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{result['run_id']}.json").read_text())
    load_s = sum(s["elapsed_s"] for s in rec["steps"] if s["step"] in ("launch:head", "wait_ready"))
    buffers = MODEL_BUFFER.findall(head_log(sim, lane))
    head_iface = netlab.fabric_iface(inv.nodes[head])
    sent = ((sent1[head_iface] - sent0[head_iface]) / MIB, (sent1["mgmt0"] - sent0["mgmt0"]) / MIB)
    rows = []
    for n in workers:
        ip, iface = inv.nodes[n].fabric_ip, netlab.fabric_iface(inv.nodes[n])
        mib = sum(float(m) for dev, m in buffers if f"{ip}:" in dev)
        fab, mgmt = after[n][iface] - before[n][iface], after[n]["mgmt0"] - before[n]["mgmt0"]
        rows.append((n, mib, fab / MIB, mgmt / MIB))
    bench_dir = out_dir / label
    code, _ = cli("bench", "--profile", lane, "--inventory", "sim", "--concurrency", "1,4", "--categories", "prose",
                  "--max-tokens", "32", "--out", str(bench_dir))
    doc = json.loads(next(bench_dir.glob("*.json")).read_text()) if code == 0 else {"cells": []}
    cells = [(c["concurrency"], c.get("aggregate_tps"), c.get("decode_tps")) for c in doc["cells"]]
    cli("down", "--profile", lane, "--inventory", "sim")
    return {"label": label, "load_s": load_s, "workers": rows, "cells": cells, "head": (head, head_iface, *sent),
            "local": [(d, float(m)) for d, m in buffers if "RPC" not in d]}


def watch_kill(sim) -> None:
    """watch on the healthy lane, bluey's rpc-server killed: seconds to the failure and to serving again."""
    from tests.watchproc import FAST, WatchProc

    code, events = cli("up", "--profile", LANE, "--inventory", "sim", "--no-fabric-probe", "--poll", "0.2",
                       "--probe-seconds", "1")
    if code != 0:
        raise SystemExit(f"watch-kill: up failed: {events[-1]}")
    w = WatchProc(["--profile", LANE, "--inventory", "sim", *FAST, "--failures", "1000", "--gates", "models",
                   "--no-fabric-probe"], {**os.environ, "PYTHONPATH": str(REPO)})
    try:
        w.event("watch.probe")
        t0 = time.time()
        sim.fault("bluey", "serve-crash")
        failure = w.event("watch.failure")
        served = w.event("watch.serving")
    finally:
        w.stop()
        sim.heal()
    rec = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{served['run_id']}.json").read_text())
    took = {s["step"]: s["elapsed_s"] for s in rec["steps"]}
    print(f"rpc-server on bluey killed: watch named it after {failure['t'] - t0:.2f} s ({failure['why']}), "
          f"served again after {served['t'] - t0:.2f} s; the restart's stop {took['stop']:.2f} s, "
          f"workers {took['launch:workers']:.2f} s, head {took['launch:head']:.2f} s, "
          f"wait_ready {took['wait_ready']:.2f} s")
    cli("down", "--profile", LANE, "--inventory", "sim")


def show(r: dict) -> None:
    print(f"{r['label']}: load {r['load_s']:.2f} s (launch:head + wait_ready)")
    print("  worker  offloaded MiB  fabric rx MiB  mgmt rx MiB")
    for n, mib, fab, mgmt in r["workers"]:
        print(f"  {n:<7} {mib:13.2f} {fab:14.2f} {mgmt:12.3f}")
    head, iface, fab, mgmt = r["head"]
    print(f"  head {head} sent: {fab:.2f} MiB on its fabric port {iface}, {mgmt:.3f} MiB on management")
    for dev, mib in r["local"]:
        print(f"  (kept on the head: {dev} {mib:.2f} MiB)")
    for c, agg, dec in r["cells"]:
        print(f"  C{c}: aggregate {agg:.1f} tok/s, per-stream decode {dec:.1f} tok/s" if agg and dec else f"  C{c}: -")


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("needs root: the lab's own network namespaces (ssh mode)", file=sys.stderr)
        return 2
    if llamabuild.bin_dir() is None:
        print(f"llama.cpp is not built ({llamabuild.cache_dir()}): make llama-rpc", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SPARKFLEET_STATE"] = str(Path(tmp) / "state")
        sim = lab.up("lab", transport="ssh")
        try:
            show(one_run(sim, "healthy", Path(tmp)))
            if args.slow_link:
                sim.fault("bluey", "slow-link", rate=args.slow_link)
                try:
                    show(one_run(sim, f"slow-link {args.slow_link} on bluey", Path(tmp)))
                finally:
                    sim.heal()
            if args.station:
                show(one_run(sim, "the Station heading the four Sparks", Path(tmp), STATION_LANE))
            if args.watch_kill:
                watch_kill(sim)
            if args.vanish:
                sim.fault("bluey", "rank-vanish")  # bluey's rpc-server container is gone as soon as it starts
                t0 = time.monotonic()
                code, events = cli("up", "--profile", LANE, "--inventory", "sim", "--no-fabric-probe", "--poll",
                                   "0.2", "--probe-seconds", "1")
                wall = time.monotonic() - t0
                failed = next((e for e in events if e["event"] == "step" and e["status"] == "fail"), {})
                print(f"rank-vanish on bluey: up exit {code} after {wall:.2f} s; {failed.get('step')} failed after "
                      f"{failed.get('elapsed_s')} s: {failed.get('summary')}")
                sim.heal()
        finally:
            cli("down", "--profile", LANE, "--inventory", "sim")
            lab.down()
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slow-link", metavar="RATE", help="repeat with bluey's fabric link at RATE (tc, e.g. 100mbit)")
    ap.add_argument("--vanish", action="store_true", help="then `up` with bluey's rpc-server gone at its start")
    ap.add_argument("--station", action="store_true", help="also the Station lane (llamacpp-lab-station)")
    ap.add_argument("--watch-kill", action="store_true", help="then watch the lane while bluey's rpc-server is killed")
    sys.exit(run(ap.parse_args()))
