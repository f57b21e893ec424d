"""A real Slurm in the simulated lab (`sim up --transport ssh --launcher slurm`, root): Debian's slurm-wlm
and munge, nothing stood in.

- one munge key for the lab (as a site distributes /etc/munge/munge.key); `munged --force` on this machine
  and one inside each node (the node's /etc is this machine's, read-only, so the key, socket, pid, log and
  seed file are named on the command line, in the node's own /var and /run);
- one slurm.conf, at the same absolute path on this machine and inside every node (the batch script's own
  `srun` runs on a node and reads the SLURM_CONF the job inherited from sbatch): each node under its
  hostname, `NodeAddr` its management address (a node's /etc/hosts cannot name its peers),
  `ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none` (no cgroup plugins in a bubblewrap root);
- `slurmctld` on this machine (the controller side), on the management bridge's address;
- one `slurmd -N NODE -f CONF` inside each node (its own pid and network namespace).

No slurmdbd, so no sacct and no accounting (squeue and scontrol answer instead); a second partition
names the accounts it allows, as a site's do.
`sim down` ends slurmctld and this machine's munged by their pids (the nodes' daemons end with the nodes)
and removes the socket directory; everything else lies under the sim dir.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from sparkfleet.schema.errors import UserError
from sparkfleet.schema.inventory import Inventory
from sparkfleet.sim import daemon, netlab, node, paths

MUNGE_SOCKET_DIR = "/run/sparkfleet-sim-munge"  # this machine's /run and each node's own /run
MUNGE_SOCKET = f"{MUNGE_SOCKET_DIR}/munge.socket.2"
PARTITION = "lab"
RESTRICTED = "restricted"
ACCOUNT = "sim"  # the account the restricted partition admits (AllowAccounts), as a site's partitions name theirs
# A node whose slurmd died reads IDLE until SlurmdTimeout (Slurm's default: 300 s); the lab kills slurmds on
# purpose, so it notices within seconds. A site keeps the default or sets what its network can bear.
SLURMD_TIMEOUT_S = 10
START_TIMEOUT_S = 30.0
# slurmd 22.05 always loads a cgroup plugin (there is no CgroupPlugin=disabled before 23.02; autodetect looks
# only at /sys/fs/cgroup, so cgroup.conf names cgroup/v1), and v1 stats the systemd hierarchy under its
# CgroupMountpoint. The node's /sys is
# the sim's own tree (its shims rewrite it), so the mount point is in the node's own /run (cgroup.conf, next
# to slurm.conf, names it), mounted in the node's mount namespace only. proctrack/linuxproc and task/none
# create no cgroups.
CGROUP_DIR = "/run/sparkfleet-sim-cgroup"
CGROUP_MOUNT = (f"mkdir -p {CGROUP_DIR} && mount -t tmpfs -o size=1m,mode=755 sfsim-cgroup {CGROUP_DIR} && "
                f"mkdir {CGROUP_DIR}/systemd && mount -t cgroup -o none,name=systemd sfsim-cgroup {CGROUP_DIR}/systemd")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel")


def slurm_dir() -> Path:
    return paths.sim_dir() / "slurm"


def conf_path() -> Path:
    return slurm_dir() / "slurm.conf"


def missing() -> list[str]:
    """What this machine lacks for the lab's Slurm (empty: nothing)."""
    out = [f"{d} (apt-get install slurm-wlm munge)" for d in DAEMONS if shutil.which(d) is None
           and not os.access(f"/usr/sbin/{d}", os.X_OK)]
    if os.geteuid() != 0:
        out.append("root (slurmd runs as root in each node's network namespace)")
    return out[:1] + out[-1:] if len(out) > 2 else out


def render_conf(inv: Inventory, names: list[str], controller: str, controller_ip: str, state: Path) -> str:
    """The lab's slurm.conf. Pure."""
    lines = [
        "# SIMULATION: the lab's real Slurm, written by `sparkfleet sim up --launcher slurm`",
        "ClusterName=sfsim",
        f"SlurmctldHost={controller}({controller_ip})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={MUNGE_SOCKET}",
        f"StateSaveLocation={state / 'ctld'}",
        f"SlurmctldPidFile={state / 'slurmctld.pid'}",
        f"SlurmctldLogFile={state / 'slurmctld.log'}",
        "SlurmdSpoolDir=/var/spool/slurmd",  # the node's own /var
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmdLogFile=/var/log/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/linear",  # whole nodes: one rank's task per node, as --exclusive asks
        "MpiDefault=none",
        "ReturnToService=2",
        f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
        "KillWait=10",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
    ]
    for i, name in enumerate(names):
        lines.append(f"NodeName={name} NodeHostname={name} NodeAddr={netlab.mgmt_ip(i)} CPUs=1 State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP")
    # a partition only some accounts may use, as sites have; without slurmdbd no account is "known" to Slurm,
    # so no job can run in it here: it is for refusing an account before submission
    lines.append(f"PartitionName={RESTRICTED} Nodes={','.join(names)} MaxTime=INFINITE State=UP "
                 f"AllowAccounts={ACCOUNT}")
    return "\n".join(lines) + "\n"


def prepare(inv: Inventory, names: list[str]) -> dict[str, Any]:
    """Before the nodes start: the key, slurm.conf, and in every node's tree the same conf path and the dirs
    its munged and slurmd write (a node binds its tree's top-level dirs when it starts)."""
    problems = missing()
    if problems:
        raise UserError("--launcher slurm needs " + "; ".join(problems) + " (nothing was created)")
    d = slurm_dir()
    d.mkdir(parents=True)
    (d / "ctld").mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))  # munge's own create-munge-key writes 1024 random bytes
    key.chmod(0o400)
    conf = render_conf(inv, names, socket.gethostname().split(".")[0], str(netlab.MGMT_NET.network_address + 1), d)
    conf_path().write_text(conf)
    cgroup = f"# SIMULATION: see sparkfleet/sim/slurm.py\nCgroupPlugin=cgroup/v1\nCgroupMountpoint={CGROUP_DIR}\n"
    (d / "cgroup.conf").write_text(cgroup)
    for name in names:
        fs = paths.node_root(name)
        inside = paths.inside(fs, str(conf_path()))
        inside.parent.mkdir(parents=True, exist_ok=True)
        inside.write_text(conf)
        inside.with_name("cgroup.conf").write_text(cgroup)
        for sub in ("var/spool/slurmd", "var/log/munge", "var/lib/munge", MUNGE_SOCKET_DIR.lstrip("/")):
            (fs / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy(key, fs / "var/lib/munge/munge.key")
        (fs / "var/lib/munge/munge.key").chmod(0o400)
    return {"conf": str(conf_path()), "partition": PARTITION}


def _munged(key: str, log: str, seed: str, pid: str) -> list[str]:
    return ["munged", "--force", "-F", f"--key-file={key}", f"--socket={MUNGE_SOCKET}", f"--log-file={log}",
            f"--seed-file={seed}", f"--pid-file={pid}"]


def start(names: list[str]) -> dict[str, Any]:
    """After the nodes are up: munged and slurmctld here, munged and slurmd in each node; wait until every
    node is idle in the partition. Returns what the manifest keeps (pids to end at `sim down`)."""
    d = slurm_dir()
    Path(MUNGE_SOCKET_DIR).mkdir(mode=0o755, exist_ok=True)
    pids = {}
    pids["munged"] = _spawn(_munged(str(d / "munge.key"), str(d / "munged.log"), str(d / "munged.seed"),
                                    str(d / "munged.pid")), d / "munged.out")
    _wait(lambda: os.path.exists(MUNGE_SOCKET), "munged on this machine did not open its socket", d / "munged.log")
    pids["slurmctld"] = _spawn(["slurmctld", "-D", "-c", "-f", str(conf_path())], d / "slurmctld.out")
    for name in names:
        nd = paths.node_dir(name)
        node.run_in(nd, _munged("/var/lib/munge/munge.key", "/var/log/munge/munged.log", "/var/lib/munge/munged.seed",
                                "/run/munged.pid"), detach=True)
    for name in names:
        fs = paths.node_root(name)
        _wait(lambda fs=fs: (fs / MUNGE_SOCKET.lstrip("/")).exists(), f"munged in node {name} did not start",
              fs / "var/log/munge/munged.log")
        node.run_in(paths.node_dir(name), ["/bin/sh", "-c", CGROUP_MOUNT])
        node.run_in(paths.node_dir(name), ["slurmd", "-D", "-N", name, "-f", str(conf_path())], detach=True)
    _wait(lambda: _idle(names), "the lab's slurmds did not all register idle with slurmctld", d / "slurmctld.log")
    return {"conf": str(conf_path()), "pids": pids, "partition": PARTITION}


def env() -> dict[str, str]:
    """The environment this machine's Slurm commands need for the lab (as the inventory's slurm.conf gives)."""
    return {**os.environ, "SLURM_CONF": str(conf_path())}


def _idle(names: list[str]) -> bool:
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=env(),
                          timeout=10)
    states = dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)
    return proc.returncode == 0 and all(states.get(n) == "idle" for n in names)


def _spawn(argv: list[str], out: Path) -> int:
    with open(out, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    return proc.pid


def _wait(ok, what: str, log: Path) -> None:  # noqa: ANN001 - a predicate
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.is_file() else ["no log"]
    raise UserError(f"sim slurm: {what} within {START_TIMEOUT_S:g} s: {' | '.join(tail)}")


def stop(info: dict[str, Any] | None) -> None:
    """End this machine's slurmctld and munged (by their pids; the nodes' daemons end with the nodes) and
    remove the socket directory. Safe to call twice and after a half-finished start."""
    for name in ("slurmctld", "munged"):
        daemon.stop((info or {}).get("pids", {}).get(name) or _pidfile(name), name, grace_s=10)
    shutil.rmtree(MUNGE_SOCKET_DIR, ignore_errors=True)


def _pidfile(name: str) -> int | None:
    try:
        return int((slurm_dir() / f"{name}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def inventory_keys(info: dict[str, Any] | None) -> dict[str, Any]:
    """What the generated inventory says about the lab's Slurm (nothing without it)."""
    if not info:
        return {}
    return {"launcher": "slurm", "slurm": {"conf": info["conf"], "partition": info["partition"]}}
