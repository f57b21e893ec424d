"""`up` through Slurm (nodes over SSH, and without SSH: srun) against `up` over SSH, same lab, in one run.

    flock /tmp/sparkfleet-lab.lock .venv/bin/python bench/up_slurm.py [--repeat 3] [--poll 0.2]

One `sim up --transport ssh --launcher slurm --docker daemon` (root: a real slurmctld, a slurmd and a real
dockerd in every node), then, alternating, the same 4-node lane (dcp2 on its own ports, reading Engram from
NFS) brought up with `launcher: slurm` (the generated inventory: one sbatch job whose tasks `docker run` the
ranks) and with `launcher: ssh` (the same inventory without its slurm keys: one `docker run` per rank over
SSH), and with `launcher: slurm` and `slurm.ssh: false` (every node command a Slurm step or job through
srun, fleet/srun.py), each with up.yaml minus the answer gates and the fabric probe, timed end to end, then
`down`. Prints a table (median wall, the launch steps and wait_ready) and the ratios to ssh. THE LAB IS A
SIMULATION; the engine boots in seconds, so what differs is the orchestration: sbatch, the scheduler's
start, squeue polls, scancel.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.up_overhead import one, ops_root, sf  # noqa: E402

LAUNCH = ("launch:workers", "launch:head")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--poll", type=float, default=0.2)
    args = parser.parse_args(argv)
    runs: dict[str, list[tuple[float, dict]]] = {"ssh": [], "slurm": [], "srun": []}
    with tempfile.TemporaryDirectory() as tmp:
        ops = ops_root(Path(tmp))
        # the fabric probe measures the links, alike for both launchers (and on a loaded 2-core machine a link can
        # fail it): left out, with the answer gates, so what is compared is the launch
        pb = ops / "playbooks/up-no-gates.yaml"
        data = yaml.safe_load(pb.read_text())
        data["steps"] = [s for s in data["steps"] if s != "fabric_probe"]
        pb.write_text(yaml.safe_dump(data, sort_keys=False))
        env = {**os.environ, "SPARKFLEET_STATE": str(Path(tmp) / "state")}
        r = sf(env, "sim", "up", "--transport", "ssh", "--launcher", "slurm", "--docker", "daemon", "--root", str(ops))
        if r.returncode:
            raise SystemExit(r.stderr)
        try:
            sim_inv = Path(env["SPARKFLEET_STATE"]) / "sim" / "inventory.yaml"
            data = yaml.safe_load(sim_inv.read_text())
            data.pop("launcher"), data.pop("slurm")
            ssh_inv = Path(tmp) / "ssh.yaml"
            ssh_inv.write_text(yaml.safe_dump(data, sort_keys=False))
            data = yaml.safe_load(sim_inv.read_text())
            data["slurm"]["ssh"] = False
            srun_inv = Path(tmp) / "srun.yaml"
            srun_inv.write_text(yaml.safe_dump(data, sort_keys=False))
            for _ in range(args.repeat):  # alternating, so load on the machine falls on all alike
                runs["slurm"].append(one(env, ops, "bench-tp4", args.poll, str(sim_inv)))
                runs["ssh"].append(one(env, ops, "bench-tp4", args.poll, str(ssh_inv)))
                runs["srun"].append(one(env, ops, "bench-tp4", args.poll, str(srun_inv)))
        finally:
            sf(env, "sim", "down")
    print(f"4 nodes, same lab (real sshd, slurmd and dockerd per node); readiness poll every {args.poll:g} s; "
          f"median of {args.repeat}\n")
    print(f"{'launcher':>8} {'up wall s':>10} {'launch s':>9} {'wait_ready s':>13}   slowest steps (s)")
    med = {}
    for name, rs in runs.items():
        wall = statistics.median(w for w, _ in rs)
        launch = statistics.median(sum(s.get(k, 0.0) for k in LAUNCH) for _, s in rs)
        ready = statistics.median(s.get("wait_ready", 0.0) for _, s in rs)
        top = sorted(rs[len(rs) // 2][1].items(), key=lambda kv: -kv[1])[:4]
        med[name] = wall
        print(f"{name:>8} {wall:10.2f} {launch:9.2f} {ready:13.2f}   " + ", ".join(f"{k} {v:.2f}" for k, v in top))
    for name in ("slurm", "srun"):
        print(f"up wall {name}/ssh: {med[name] / med['ssh']:.2f}  ({name} - ssh: {med[name] - med['ssh']:+.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
