"""Fan-out at fleet sizes (issue 42 §3): `sparkfleet facts` at 5, 16, 32 and 64 real sshd nodes, against
OpenSSH's own parallel floor running the same helper, and Ansible's `setup gather_subset=min`, in one run.

    .venv/bin/python bench/fleet_scale.py [--sizes 5,16,32,64] [--repeat 3] [--ansible VENV]

Per size, one SshLab (tests/sshlab.py: a network namespace, a real sshd and host key per node as root;
strict known_hosts), the facts helper shipped once, untimed. Each figure is the median over --repeat of a
whole process (bench/cli_start.py `timed`):
- sparkfleet: `sparkfleet facts --json --inventory <the lab>`, wall seconds, and its CPU (user+sys of the
  process: the controller's own cost; the nodes' sshd and helper run on this machine too, but not in it),
  divided by the nodes;
- floor: N OpenSSH clients started at once (`ssh NODE python3 <the shipped helper>`, the same request on
  stdin, strict host keys), until the last ends: what any SSH fan-out on this machine pays;
- Ansible (with --ansible VENV, a venv holding ansible-core, never a sparkfleet dependency):
  `ansible all -m setup -a gather_subset=min -f N` over the same nodes (bench/cli_start.py `ansible_setup`).
Goals (issue 42): sparkfleet within 1.25x of the floor at 64, controller CPU <= 20 ms a node, never slower
than Ansible. On a 2-core machine the nodes' sshd and Python share the controller's cores, so wall time at
64 measures the lab as much as sparkfleet: the CPU column is the one that carries to a real fleet.
Not a test: it prints a table and the ratios, and asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for `tests.sshlab` when run as a script
sys.path.insert(0, str(ROOT / "bench"))  # the benches this one reuses

import yaml  # noqa: E402
from cli_start import ansible_setup, timed  # noqa: E402
from facts_fanout import requests, ship  # noqa: E402

from sparkfleet.fleet.ship import remote_path  # noqa: E402
from tests.sshlab import SshLab  # noqa: E402

GOAL_FLOOR_RATIO, GOAL_CPU_MS = 1.25, 20.0


def floor(lab: SshLab) -> float:
    """N OpenSSH clients at once, each running the shipped helper with its request; seconds until the last ends."""
    reqs = requests(list(lab.nodes))
    t0 = time.perf_counter()
    procs = {n: subprocess.Popen(lab.ssh_argv(n, f"python3 {remote_path('facts.py')}"), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for n in lab.nodes}
    outs = {n: p.communicate(reqs[n].model_dump_json().encode()) for n, p in procs.items()}
    wall = time.perf_counter() - t0
    bad = [n for n, (out, _) in outs.items() if procs[n].returncode != 0 or b'"helper_version"' not in out]
    if bad:
        raise SystemExit(f"the floor's ssh failed on {', '.join(bad)}")
    return wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5,16,32,64")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ansible", metavar="VENV", help="a venv with ansible-core, for its column")
    args = ap.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    exe = shutil.which("sparkfleet", path=str(Path(sys.executable).parent)) or "sparkfleet"
    rows = []
    for size in sizes:
        state = Path(tempfile.mkdtemp(prefix="fleet-scale-"))
        env = {**os.environ, "SPARKFLEET_STATE": str(state), "SPARKFLEET_CONFIG": str(state / "none.yaml"),
               "SPARKFLEET_SSH_CONFIG": "/dev/null", "COLUMNS": "80"}  # the operator's ~/.ssh/config left out
        env.pop("SPARKFLEET_INVENTORY", None)
        try:
            with SshLab(size, prefix="sfb") as lab:
                ship(lab)
                shutil.copy(lab.known_hosts, state / "known_hosts")
                inv = state / "fleet.yaml"
                inv.write_text(yaml.safe_dump(lab.inventory_dict()))
                facts = [exe, "facts", "--inventory", str(inv), "--json"]
                timed(facts, env, 1)  # the first run after shipping, untimed, as cli_start does
                sf_wall, _, sf_cpu = timed(facts, env, args.repeat)
                fl = statistics.median(floor(lab) for _ in range(args.repeat))
                an = None
                if args.ansible:
                    a_argv, a_env = ansible_setup(Path(args.ansible), lab, state, env, forks=size)
                    timed(a_argv, a_env, 1)
                    an = timed(a_argv, a_env, args.repeat)[0]
                rows.append((size, sf_wall, fl, sf_cpu, an))
                print(f"{size} nodes done ({lab.mode})", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(state, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"facts fan-out, whole processes, median of {args.repeat} (load average {load:.1f} on {os.cpu_count()} "
          "cores at the end)")
    print(f"{'nodes':>5} {'sparkfleet s':>12} {'floor s':>8} {'x floor':>8} {'cpu ms/node':>11} {'ansible s':>10} "
          f"{'x ansible':>9}")
    for size, sf, fl, cpu, an in rows:
        print(f"{size:>5} {sf:>12.2f} {fl:>8.2f} {sf / fl:>8.2f} {1000 * cpu / size:>11.1f} "
              f"{(f'{an:.2f}' if an else '-'):>10} {(f'{sf / an:.2f}' if an else '-'):>9}")
    big = rows[-1]
    print(f"at {big[0]} nodes: sparkfleet / floor {big[1] / big[2]:.2f} (goal <= {GOAL_FLOOR_RATIO}); controller CPU "
          f"{1000 * big[3] / big[0]:.1f} ms a node (goal <= {GOAL_CPU_MS:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
