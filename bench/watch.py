"""How fast `sparkfleet watch` notices a serving lane's fault, and how long its group restart adds to a boot.

    flock /tmp/sparkfleet-lab.lock .venv/bin/python bench/watch.py [--repeat 2] [--interval 2] [--failures 2]

On the simulated lab (its own state dir, a `dcp2` copy on its own ports), one `sparkfleet watch --json`
process watches the serving lane while each fault is injected `repeat` times, once the previous restart
serves and a probe answered:
- rank-hang, on rank 1 (asusi): `sparkfleet sim fault asusi rank-hang` (/health stays 200, no token is
  ever produced) -> K failed probes;
- serve-crash, on rank 2 (bluey): `sim fault bluey serve-crash` (the rank exits after serving a few
  seconds: the sim's own delay, so detection includes it) -> the rank exited;
- rank-vanish, on rank 2 (bluey): `sim fault bluey rank-vanish` (its container is removed) -> vanished.
The fault's moment is taken just before the injection starts (the least favourable to watch).
Detection = watch's `watch.failure` event minus that moment. Relaunch overhead = watch's `watch.serving`
event minus detection minus the engine's boot, where the boot is the restart's own `wait_ready` step
(head started -> /health and /v1/models answer: the boot as the runner saw it, its poll lag included).
Where the relaunch time goes: each step of the restart's own run record (elapsed_s), median over
every restart, and watch's own part (failure -> the restart's run start: evidence, a second look).
Baselines from the same run: a plain `sparkfleet up` of the serving lane after watch ended (its own
record's duration minus its wait_ready: what the same playbook costs without watch), the probe
interval (mean gap between probe starts) and the bound
K x interval + probe timeout. Targets: detection <= K x interval + one probe timeout; relaunch
overhead <= 5 s on 4 nodes. THE LAB IS A SIMULATION. Prints a table and the ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkfleet.sim import lab  # noqa: E402
from sparkfleet.simengine.config import Config as SimEngineConfig  # noqa: E402

# serve-crash ends the rank this long after the fault (the sim's own "a few seconds" of serving): the
# moment watch can first see it is injection + this, so detection is also shown from that moment
CRASH_AFTER_S = SimEngineConfig.serve_crash_after
from tests.watchproc import WatchProc  # noqa: E402

WHERE = {"rank-hang": ("asusi", 1), "serve-crash": ("bluey", 2), "rank-vanish": ("bluey", 2)}
FAULTS = ("rank-hang", "serve-crash", "rank-vanish")
LANE = "bench-watch"


def ops_root(tmp: Path) -> Path:
    ops = tmp / "ops"
    for d in ("inventories", "profiles", "templates", "playbooks", "patches"):
        shutil.copytree(REPO / d, ops / d)
    (ops / f"profiles/{LANE}.yaml").write_text("extends: dcp2\ndescription: \"bench input: dcp2, own ports\"\n"
                                               "port: 18412\nmaster_port: 39553\n"
                                               "expect: {engram_node_local: false}  # no copies: NFS on purpose\n")
    return ops


def inject(sim: lab.Sim, fault: str) -> float:
    """The moment just before the sim's fault is injected on the fault's node."""
    t = time.time()
    sim.fault(WHERE[fault][0], fault)
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--interval", type=float, default=2.0, help="watch --interval (default 2)")
    parser.add_argument("--failures", type=int, default=2, help="watch --failures K (default 2)")
    parser.add_argument("--probe-timeout", type=float, default=1.5, help="watch --probe-timeout (default 1.5)")
    args = parser.parse_args(argv)
    rows: dict[str, list[dict]] = {f: [] for f in FAULTS}
    steps: dict[str, list[float]] = {}
    load_before = os.getloadavg()
    gaps: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        ops = ops_root(Path(tmp))
        env = {**os.environ, "SPARKFLEET_STATE": str(Path(tmp) / "state"), "PYTHONPATH": str(REPO)}
        os.environ["SPARKFLEET_STATE"] = env["SPARKFLEET_STATE"]
        sim = lab.up("lab", ops_root=str(ops))
        w = None
        try:
            budget = len(FAULTS) * args.repeat
            w = WatchProc(["--profile", LANE, "--inventory", "sim", "--root", str(ops), "--interval",
                           str(args.interval), "--failures", str(args.failures), "--probe-timeout",
                           str(args.probe_timeout), "--backoff", "0", "--poll", "0.2", "--max-restarts",
                           str(budget + 1), "--gates", "models"], env)
            w.wait_for(lambda e: e["event"] == "watch.serving", "the lane serving (watch starts it)", 300)
            for _ in range(args.repeat):
                for fault in FAULTS:
                    w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe", 120)
                    t0 = inject(sim, fault)
                    failure = w.event("watch.failure")
                    began = w.wait_for(lambda e: e["event"] == "run", "the restart's run")
                    served = w.event("watch.serving")
                    sim.heal(WHERE[fault][0], fault)  # it acted once (not sticky); cleared for the next round
                    rec = json.loads((Path(env["SPARKFLEET_STATE"]) / "runs" / f"{served['run_id']}.json").read_text())
                    boot = next(s["elapsed_s"] for s in rec["steps"] if s["step"] == "wait_ready")
                    for s in rec["steps"]:
                        steps.setdefault(s["step"], []).append(s["elapsed_s"])
                    steps.setdefault("(watch: failure -> run)", []).append(began["t"] - failure["t"])
                    steps.setdefault("(run end -> watch.serving)", []).append(
                        served["t"] - rec["finished"])
                    rows[fault].append({"reason": failure["reason"], "detect": failure["t"] - t0,
                                        "restart": served["t"] - failure["t"], "boot": boot,
                                        "watch": began["t"] - failure["t"],
                                        "overhead": served["t"] - failure["t"] - boot,
                                        "clock": next((s["elapsed_s"] for s in rec["steps"] if s["step"] == "probe"),
                                                      0.0)})
            probes = [e["t"] for e in w.events if e["event"] == "watch.probe"]
            gaps = [b - a for a, b in zip(probes, probes[1:], strict=False) if b - a < 2 * args.interval]
            w.stop()
            w = None
            up = subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", "up", "--profile", LANE, "--inventory",
                                 "sim", "--root", str(ops), "--gates", "models", "--poll", "0.2", "--json"],
                                env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
            run_id = next(json.loads(x) for x in up.stdout.splitlines() if x.startswith('{"event": "result"'))["run_id"]
            base = json.loads((Path(env["SPARKFLEET_STATE"]) / "runs" / f"{run_id}.json").read_text())
            up_overhead = base["duration_s"] - next(s["elapsed_s"] for s in base["steps"] if s["step"] == "wait_ready")
            up_clock = next((s["elapsed_s"] for s in base["steps"] if s["step"] == "probe"), 0.0)
        finally:
            if w is not None:
                w.stop()
            lab.down()
    load_after = os.getloadavg()
    interval = statistics.mean(gaps) if gaps else args.interval
    bound = args.failures * args.interval + args.probe_timeout
    bound_measured = args.failures * interval + args.probe_timeout
    where = ", ".join(f"{f}: rank {r}@{n}" for f, (n, r) in WHERE.items())
    print(f"faults on {where}\nwatch --interval {args.interval:g} --failures {args.failures} --probe-timeout "
          f"{args.probe_timeout:g}; median of {args.repeat}; THE LAB IS A SIMULATION\n")
    print(f"{'fault':<12} {'reason':<14} {'detect':>6} {'d-sim':>5} {'bound':>5} {'d/b':>4} {'d/bm':>4} "
          f"{'boot':>5} {'overh':>5} {'clock':>5} {'o-clk':>5} {'watch':>5}")
    for fault, runs in rows.items():
        if not runs:
            continue
        d = statistics.median(x["detect"] for x in runs)
        med = {k: statistics.median(x[k] for x in runs) for k in ("boot", "overhead", "watch", "clock")}
        no_clock = statistics.median(x["overhead"] - x["clock"] for x in runs)
        de = d - (CRASH_AFTER_S if fault == "serve-crash" else 0.0)  # from the moment the fault takes effect
        print(f"{fault:<12} {','.join(sorted({x['reason'] for x in runs})):<14} {d:6.2f} {de:5.2f} {bound:5.2f} "
              f"{de / bound:4.2f} {de / bound_measured:4.2f} {med['boot']:5.2f} {med['overhead']:5.2f} "
              f"{med['clock']:5.2f} {no_clock:5.2f} {med['watch']:5.2f}")
    print(f"\nseconds. probe interval measured: {interval:.2f} s (mean gap between probe starts while serving, "
          f"{len(gaps)} gaps)")
    print(f"bound = K x interval + probe timeout = {bound:.2f} s (d/b); with the measured interval "
          f"{bound_measured:.2f} s (d/bm); both ratios on d-sim")
    print("detect: watch.failure - fault; overh: watch.serving - watch.failure - the restart's wait_ready (boot);")
    print(f"d-sim: detect from the moment the rank died (serve-crash: the sim ends it {CRASH_AFTER_S:g} s after "
          "the fault; the others act at once)")
    print("clock: the restart's clock probe step (a fixed GPU load window, fleet/nodeside/clock_probe.py "
          "LOAD_SECONDS, plus its start); o-clk: overh - clock")
    print("watch: watch.failure - the restart's run start (evidence, look again), the rest is the up playbook")
    all_over = statistics.median(x["overhead"] for r in rows.values() for x in r)
    print(f"baseline: `up` of the serving lane alone, same run: {up_overhead:.2f} s without its wait_ready "
          f"({up_clock:.2f} s of it the clock probe); watch's relaunch overhead (median, all faults) "
          f"{all_over:.2f} s: ratio {all_over / up_overhead:.2f}")
    print("targets: detect <= bound (d/b <= 1); overhead <= 5 s on 4 nodes")
    print(f"machine load average (1, 5, 15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)} on {os.cpu_count()} cores")
    print(f"\nwhere the relaunch goes (median s over {sum(len(r) for r in rows.values())} restarts; wait_ready is "
          "the boot):")
    for name, xs in steps.items():
        print(f"  {name:<28} {statistics.median(xs):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
