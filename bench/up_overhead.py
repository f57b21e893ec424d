"""Orchestration overhead of `up` on the simulated lab: wall time minus the sim engine's boot time.

    .venv/bin/python bench/up_overhead.py [--repeat 3] [--poll 0.2]

For 4 nodes (the lab's `dcp2`, on its own ports) and for 8 (a generated 8-node inventory and a TP8 lane on top of
dcp2), in one run: `sim up`, then `up --profile ... --inventory sim` with a playbook that is `up.yaml`
without the answer gates (the gates measure the engine, not the orchestrator), timed end to end, then
`down`. The sim engine's configured boot time (sparkfleet/sim/values.py ENGINE_BOOT_S) is subtracted;
what is left is stop-all, drop caches, facts, checks, patches, Engram, the launches, readiness polling
(at --poll), expectations and the record. THE LAB IS A SIMULATION; the engine boots in seconds.
Prints a table and the ratio t8/t4; asserts nothing. Targets (lifecycle issue): <= 3 s at 4 nodes,
8 nodes <= 1.5 x that.
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

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkfleet.sim import values  # noqa: E402

SF = [sys.executable, "-m", "sparkfleet.cli.main"]


def ops_root(tmp: Path) -> Path:
    """A copy of the repo's ops dir plus an 8-node inventory and a TP8 lane (bench inputs, not lab facts)."""
    ops = tmp / "ops"
    for d in ("inventories", "profiles", "templates", "playbooks", "patches"):
        shutil.copytree(REPO / d, ops / d)
    inv = yaml.safe_load((REPO / "inventories/lab.yaml").read_text())
    template = inv["nodes"]["spark4"]
    for i in range(5, 9):
        node = json.loads(json.dumps(template))
        node["ssh"]["host"] = f"10.10.0.{10 + i}"
        node["fabric_ip"] = f"192.168.192.{10 + i}"
        inv["nodes"][f"spark{i}"] = node
    inv["groups"]["sparks8"] = ["reddie", "asusi", "bluey", "spark4", "spark5", "spark6", "spark7", "spark8"]
    inv["name"] = "lab8"
    (ops / "inventories/lab8.yaml").write_text(yaml.safe_dump(inv, sort_keys=False))
    # own ports, so the bench never meets another lane (or a test run) on dcp2's 8410/29551
    (ops / "profiles/bench-tp4.yaml").write_text("extends: dcp2\ndescription: \"bench input: dcp2, own ports\"\n"
                                                 "port: 18410\nmaster_port: 39551\n"
                                                 "expect: {engram_node_local: false}  # no copies: NFS on purpose\n")
    (ops / "profiles/bench-tp8.yaml").write_text("extends: bench-tp4\ndescription: \"bench input: dcp2 on 8 nodes\"\n"
                                                 "group: sparks8\ntp: 8\n")
    pb = yaml.safe_load((REPO / "playbooks/up.yaml").read_text())
    pb["steps"] = [s for s in pb["steps"] if s != "gates"]
    pb["name"] = "up-no-gates"
    (ops / "playbooks/up-no-gates.yaml").write_text(yaml.safe_dump(pb, sort_keys=False))
    return ops


def sf(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SF, *args], env=env, capture_output=True, text=True)


def one(env: dict, ops: Path, profile: str, poll: float, inventory: str = "sim") -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = sf(env, "play", str(ops / "playbooks/up-no-gates.yaml"), "--profile", profile, "--inventory", inventory,
           "--root", str(ops), "--poll", str(poll), "--json")
    wall = time.perf_counter() - t0
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    result = next((e for e in events if e["event"] == "result"), {"outcome": "no result", "reason": r.stderr[-300:]})
    steps = {e["step"]: e.get("elapsed_s", 0.0) for e in events if e["event"] == "step" and e["status"] != "start"}
    sf(env, "down", "--profile", profile, "--inventory", inventory, "--root", str(ops), "--json")
    if result["outcome"] != "ok":
        raise SystemExit(f"{profile}: up failed: {result.get('reason')}")
    return wall, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--poll", type=float, default=0.2)
    args = parser.parse_args(argv)
    boot = values.ENGINE_BOOT_S
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ops = ops_root(Path(tmp))
        for nodes, inventory, profile in ((4, "lab", "bench-tp4"), (8, "lab8", "bench-tp8")):
            env = {**os.environ, "SPARKFLEET_STATE": str(Path(tmp) / f"state{nodes}")}
            r = sf(env, "sim", "up", "--inventory", str(ops / "inventories" / f"{inventory}.yaml"), "--root", str(ops))
            if r.returncode:
                raise SystemExit(r.stderr)
            try:
                runs = [one(env, ops, profile, args.poll) for _ in range(args.repeat)]
            finally:
                sf(env, "sim", "down")
            walls = [w for w, _ in runs]
            steps = runs[len(runs) // 2][1]
            rows.append((nodes, statistics.median(walls), statistics.median(walls) - boot, steps))
    print(f"sim engine boot time subtracted: {boot:g} s; readiness poll every {args.poll:g} s; "
          f"median of {args.repeat}\n")
    print(f"{'nodes':>5} {'up wall s':>10} {'overhead s':>11}   slowest steps (s)")
    for n, wall, over, steps in rows:
        top = sorted(steps.items(), key=lambda kv: -kv[1])[:4]
        print(f"{n:>5} {wall:10.2f} {over:11.2f}   " + ", ".join(f"{k} {v:.2f}" for k, v in top))
    print(f"\noverhead t8/t4: {rows[1][2] / rows[0][2]:.2f}  (targets: t4 <= 3 s, t8 <= 1.5 x t4)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
