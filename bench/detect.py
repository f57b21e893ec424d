"""How fast `up` notices a rank that fails during boot, and how fast every rank is stopped after it.

    flock /tmp/sparkfleet-lab.lock .venv/bin/python bench/detect.py [--repeat 3] [--poll 1.0]

On the simulated lab (its own state dir, `dcp2` on its own ports), per fault, `repeat` times: start
`up --json` as its own process and inject the fault into rank 2 (bluey) while the lane boots (the
head boots slowly, so the lane is never ready first):
- worker-crash / engine-fatal: the sim engine's own faults (the rank logs its fatal lines and exits);
  the fault's moment is when the rank's engine process exited (its container's FinishedAt, by docker);
- rank-vanish: the rank's container disappears (the sim's fault when the lab has it, else `docker rm -f`
  on the node, as an operator would); the moment is when that returned.
Detection = the `up` event announcing the failed rank minus the fault's moment; all-stopped = the
wait_ready step's end (after every rank of the launch was stopped) minus the fault's moment. The poll
interval measured in the same run (mean gap between poll starts in the run record) is the baseline:
the target is detection <= 5 s at the default poll, i.e. within one poll. THE LAB IS A SIMULATION.
Prints a table and the ratio detection / poll; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkfleet.fleet.connect import transport_for  # noqa: E402
from sparkfleet.fleet.ops.docker import Stopped  # noqa: E402
from sparkfleet.sim import faults as sim_faults  # noqa: E402
from sparkfleet.sim import lab  # noqa: E402
from tests.cli_run import rank_has_lines, up_acting_once  # noqa: E402
from tests.conftest import copy_ops  # noqa: E402

SF = [sys.executable, "-c", "from sparkfleet.cli.main import main; raise SystemExit(main())"]
NODE, RANK, HEAD = "bluey", 2, "reddie"
FAULTS = ("worker-crash", "rank-vanish", "engine-fatal")


def ops_root(tmp: Path) -> Path:
    ops = copy_ops(tmp / "ops")
    # own ports, so the bench never meets another lane (or a test run) on dcp2's 8410/29551
    (ops / "profiles/bench-detect.yaml").write_text("extends: dcp2\ndescription: \"bench input: dcp2, own ports\"\n"
                                                    "port: 18411\nmaster_port: 39552\n"
                                                    "expect: {engram_node_local: false}  # no copies: NFS on purpose\n")
    return ops


def one(sim: lab.Sim, ops: Path, env: dict, fault: str, poll: float) -> dict:
    sim.heal()
    sim.fault(HEAD, "slow-boot")
    if fault != "rank-vanish":
        sim.fault(NODE, fault)
    node = sim.inventory().nodes[NODE]
    transport = transport_for([node])

    def vanish(_) -> None:
        if "rank-vanish" in sim_faults.KINDS:
            sim.fault(NODE, "rank-vanish")
        else:
            transport.run([node], f"docker rm -f sf-bench-detect-r{RANK}")

    try:
        _, events, injected = up_acting_once(
            ["--profile", "bench-detect", "--inventory", "sim", "--root", str(ops), "--gates", "models", "--poll",
             str(poll)], env=env, timeout_s=120,
            when=rank_has_lines(RANK) if fault == "rank-vanish" else (lambda _: False), act=vanish)
        if fault != "rank-vanish":  # the moment the rank's engine exited: its container's FinishedAt, by docker
            op = Stopped("bench-detect")
            stopped = op.parse(transport.run([node], op.command())[NODE])
            injected = next(x["finished_s"] for x in stopped if x["rank"] == str(RANK))
    finally:
        transport.close()
    result = next(e for e in events if e["event"] == "result")
    record = json.loads((Path(env["SPARKFLEET_STATE"]) / "runs" / f"{result['run_id']}.json").read_text())
    said = next(e["t"] for e in events if e["event"] == "message" and "stopping every rank" in e.get("text", ""))
    stopped = next(e["t"] for e in events if e["event"] == "step" and e["step"] == "wait_ready"
                   and e["status"] == "fail")
    starts = record["data"]["wait_ready"]["poll_started"]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    subprocess.run([*SF, "down", "--profile", "bench-detect", "--inventory", "sim", "--root", str(ops), "--json"],
                   env=env, capture_output=True)
    return {"named": (record["data"]["wait_ready"].get("failed_rank"), record["data"]["wait_ready"].get("failed_node")),
            "reason": result["reason"], "detect": said - injected, "stopped": stopped - injected,
            "gaps": gaps}


def control(sim: lab.Sim, ops: Path, env: dict, poll: float) -> list[float]:
    """A healthy boot in the same run: the gaps between its poll starts are the poll baseline."""
    sim.heal()
    r = subprocess.run([*SF, "up", "--profile", "bench-detect", "--inventory", "sim", "--root", str(ops),
                        "--gates", "models", "--poll", str(poll), "--json"], env=env, capture_output=True, text=True)
    result = next(json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"event": "result"'))
    record = json.loads((Path(env["SPARKFLEET_STATE"]) / "runs" / f"{result['run_id']}.json").read_text())
    subprocess.run([*SF, "down", "--profile", "bench-detect", "--inventory", "sim", "--root", str(ops), "--json"],
                   env=env, capture_output=True)
    starts = record["data"]["wait_ready"]["poll_started"]
    return [b - a for a, b in zip(starts, starts[1:], strict=False)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--poll", type=float, default=1.0, help="up's --poll (default 1.0, up's own default)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ops = ops_root(Path(tmp))
        env = {**os.environ, "SPARKFLEET_STATE": str(Path(tmp) / "state")}
        os.environ["SPARKFLEET_STATE"] = env["SPARKFLEET_STATE"]
        sim = lab.up("lab", ops_root=str(ops))
        try:
            baseline = control(sim, ops, env, args.poll)
            for fault in FAULTS:
                runs = [one(sim, ops, env, fault, args.poll) for _ in range(args.repeat)]
                rows.append((fault, runs))
        finally:
            lab.down()
    print(f"rank {RANK} on {NODE} fails during boot; up --poll {args.poll:g}; median of {args.repeat}; "
          "THE LAB IS A SIMULATION\n")
    print(f"{'fault':<13} {'named':<10} {'detect s':>9} {'max s':>7} {'stopped s':>10} {'poll s':>7} "
          f"{'detect/poll':>11}")
    for fault, runs in rows:
        named = {f"{r}@{n}" for r, n in (x["named"] for x in runs)}
        detect = statistics.median(x["detect"] for x in runs)
        poll = statistics.mean(baseline + [g for x in runs for g in x["gaps"]])
        print(f"{fault:<13} {','.join(sorted(named)):<10} {detect:9.2f} {max(x['detect'] for x in runs):7.2f} "
              f"{statistics.median(x['stopped'] for x in runs):10.2f} {poll:7.2f} {detect / poll:11.2f}")
    print(f"\npoll s: mean gap between poll starts, healthy boot ({len(baseline)} gaps) and the faulted runs")
    print("target: detect <= 5 s (within one poll at the default poll)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
