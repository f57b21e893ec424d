"""CLI start-up: whole `sparkfleet` processes against `python3 -c pass`, measured in the same run.

    .venv/bin/python bench/cli_start.py [--repeat 7] [--ansible /path/to/venv-with-ansible-core]

Every figure is a fresh process (fork + interpreter + imports + work), wall clock, median over
--repeat, with its CPU time (user+sys of the process; for facts the nodes' sshd/helper CPU is not
in it) as a figure less sensitive to a shared machine's load. Rows: the interpreter alone
(baseline), `--version`, `--help`, `profiles`, `plan --profile dcp2 --json`, and `facts --json`
over 5 real sshd nodes (tests/sshlab.py; network namespaces as root, host keys strict; the helper
is shipped by an untimed first run). With --ansible, Ansible's
`ansible all -m setup -a gather_subset=min -f 5` on the same nodes, from that venv (ansible-core is
never a sparkfleet dependency: `python3 -m venv V && V/bin/pip install ansible-core`).
Targets (issue 17): --version <= 0.25 s, plan <= 0.5 s, facts(5) <= 1.0 s and <= 0.25 x Ansible.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for `tests.sshlab` when run as a script

TARGETS = {"--version": 0.25, "plan --profile dcp2 --json": 0.5, "facts --json (5 nodes, sshd)": 1.0}


def timed(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, list[float], float]:
    """Median wall seconds, every run's wall seconds, median CPU seconds (user+sys of the process tree)."""
    runs, cpu = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        runs.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.decode()[-400:]}")
    return statistics.median(runs), runs, statistics.median(cpu)


def ansible_setup(venv: Path, lab, state: Path, env: dict[str, str], forks: int) -> tuple[list[str], dict[str, str]]:
    """Ansible's `setup gather_subset=min` over every node of an SshLab with `forks`, host keys checked as
    sparkfleet checks them (the lab's known_hosts, strict), no connection reuse: (argv, env)."""
    ini = state / "hosts.ini"
    ini.write_text("[all]\n" + "".join(
        f"{n} ansible_host={node.host} ansible_port={node.port} ansible_user={lab.user} "
        f"ansible_ssh_private_key_file={lab.client_key}\n" for n, node in lab.nodes.items()))
    aenv = {**env, "ANSIBLE_SSH_ARGS": f"-o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes "
            "-o ControlMaster=no", "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
            "ANSIBLE_LOCAL_TEMP": str(state / "ansible-tmp"), "ANSIBLE_HOME": str(state / "ansible")}
    return [str(venv / "bin" / "ansible"), "all", "-i", str(ini), "-m", "setup", "-a", "gather_subset=min",
            "-f", str(forks)], aenv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--ansible", metavar="VENV", help="a venv with ansible-core, for the side-by-side figure")
    args = ap.parse_args()

    from tests.sshlab import SshLab

    exe = shutil.which("sparkfleet", path=str(Path(sys.executable).parent)) or "sparkfleet"
    state = Path(tempfile.mkdtemp(prefix="cli-start-"))
    env = {**os.environ, "SPARKFLEET_STATE": str(state), "SPARKFLEET_CONFIG": str(state / "none.yaml"),
           "SPARKFLEET_SSH_CONFIG": "/dev/null", "COLUMNS": "80"}  # the operator's ~/.ssh/config left out
    env.pop("SPARKFLEET_INVENTORY", None)
    rows: list[tuple[str, float, list[float], float]] = []
    with SshLab(5) as lab:
        shutil.copy(lab.known_hosts, state / "known_hosts")
        inv = state / "sshlab.yaml"
        import yaml

        inv.write_text(yaml.safe_dump(lab.inventory_dict()))
        cases = [
            ("python3 -c pass (baseline)", [sys.executable, "-c", "pass"]),
            ("--version", [exe, "--version"]),
            ("--help", [exe, "--help"]),
            ("profiles", [exe, "profiles"]),
            ("plan --profile dcp2 --json", [exe, "plan", "--profile", "dcp2", "--json"]),
            ("facts --json (5 nodes, sshd)", [exe, "facts", "--inventory", str(inv), "--json"]),
        ]
        timed(cases[-1][1], env, 1)  # ships the facts helper to every node (untimed)
        for name, argv in cases:
            rows.append((name, *timed(argv, env, args.repeat)))
        if args.ansible:
            argv, aenv = ansible_setup(Path(args.ansible), lab, state, env, forks=5)
            timed(argv, aenv, 1)
            rows.append(("ansible setup gather_subset=min -f 5", *timed(argv, aenv, args.repeat)))
    shutil.rmtree(state, ignore_errors=True)

    base = rows[0][1]
    ansible = next((r[1] for r in rows if r[0].startswith("ansible")), None)
    load = os.getloadavg()[0]
    print(f"sparkfleet start-up, whole processes, median of {args.repeat} ({lab.mode} sshd nodes; "
          f"load average {load:.1f} on {os.cpu_count()} cores)")
    print(f"{'command':<38} {'median s':>9} {'min s':>7} {'cpu s':>7} {'x python':>9} {'target s':>9}")
    for name, med, runs, cpu in rows:
        target = TARGETS.get(name)
        verdict = "" if target is None else ("  ok" if med <= target else "  MISSED")
        print(f"{name:<38} {med:>9.3f} {min(runs):>7.3f} {cpu:>7.3f} {med / base:>9.1f} "
              f"{'' if target is None else f'{target:.2f}':>9}{verdict}")
    if ansible:
        facts = next(r[1] for r in rows if r[0].startswith("facts"))
        print(f"facts / ansible setup = {facts / ansible:.2f} (target <= 0.25)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
