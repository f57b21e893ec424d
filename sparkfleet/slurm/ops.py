"""The controller-side Slurm commands as operations of the one executor (fleet/op.py): they run on the
controller (SLURM_CONF = the inventory's slurm.conf) or, with `slurm.login`, on the login node over SSH.

The executor runs commands on Nodes, so the place the Slurm commands run is one: `controller(inv)`, named
CONTROLLER, local or reached over SSH. Nothing here touches a job this lane did not submit: jobs are found
by the lane's job name and kept only when their comment is the run label (slurm/job.py)."""

from __future__ import annotations

import shlex

from sparkfleet.findings import Finding
from sparkfleet.fleet.op import Executor, NodeCommands, OpGen, query
from sparkfleet.schema.inventory import Inventory, Node, Ssh, Storage
from sparkfleet.slurm import cluster
from sparkfleet.slurm.job import Job

CONTROLLER = "slurm-controller"  # where sbatch/squeue/scancel run (not a node of the inventory)
SEPARATOR = "--sparkfleet--"


def controller(inv: Inventory) -> Node:
    """The place the Slurm commands run, as the executor addresses it: this machine, or the login node."""
    s = inv.slurm
    assert s is not None
    login = s.login
    return Node(name=CONTROLLER, ssh=login or Ssh(host="localhost"), hardware="gb10",
                storage=Storage(model_root="/", cache_dir="/"), transport="ssh" if login else "local")


def _env(inv: Inventory) -> dict[str, str] | None:
    conf = inv.slurm.conf if inv.slurm else None
    return {"SLURM_CONF": conf} if conf else None


def read_cluster(inv: Inventory) -> OpGen[tuple[dict, dict] | str | None]:
    """Partitions and nodes as scontrol says; a string when the commands failed (why); None under dry-run."""
    op = query("read the Slurm cluster's partitions and nodes",
               {CONTROLLER: f"scontrol -o show partition && echo {SEPARATOR} && scontrol -o show node"}, timeout_s=30)
    op.env = _env(inv)
    res = (yield op)
    if res is None:
        return None
    r = res[CONTROLLER]
    if not r.ok:
        return (r.message or r.stderr.strip() or f"exit {r.exit_code}")[-300:]
    parts, _, nodes = r.stdout.partition(SEPARATOR + "\n")
    return cluster.parse_partitions(parts), cluster.parse_nodes(nodes)


def check(inv: Inventory, lane_nodes: list[str]) -> OpGen[list[Finding]]:
    """The refusals before submission (cluster.refusals), or why the cluster could not be read."""
    got = yield from read_cluster(inv)
    if got is None:
        return []
    if isinstance(got, str):
        return [Finding("slurm-cluster", "fail", f"cannot read the Slurm cluster (scontrol): {got}",
                        "check slurm.conf (inventory slurm.conf) and that slurmctld answers")]
    return cluster.refusals(inv, lane_nodes, *got)


def submit(inv: Inventory, job: Job) -> NodeCommands:
    """sbatch the job's script (on stdin: the script never lands in a file of ours); prints the job id."""
    op = NodeCommands(f"submit Slurm job {job.name}", {CONTROLLER: "sbatch --parsable"}, timeout_s=60,
                      stdin={CONTROLLER: job.script})
    op.env = _env(inv)
    return op


def parse_submitted(stdout: str) -> str:
    """`sbatch --parsable` prints `jobid[;cluster]`."""
    return stdout.strip().splitlines()[-1].split(";")[0]


def lane_jobs(inv: Inventory, job_name: str) -> NodeCommands:
    """The lane's jobs as squeue lists them: id, name, comment (the run label), state, reason."""
    op = query(f"list Slurm jobs named {job_name}",
               {CONTROLLER: f"squeue -h --name={shlex.quote(job_name)} -o '%i|%j|%k|%T|%r'"}, timeout_s=30)
    op.env = _env(inv)
    return op


def parse_jobs(stdout: str) -> list[dict[str, str]]:
    """squeue lines from lane_jobs; a heterogeneous job is listed once per component (`7+0`, `7+1`)."""
    out = []
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 5:
            out.append(dict(zip(("id", "name", "comment", "state", "reason"), parts, strict=True)))
    return out


def ours(jobs: list[dict[str, str]], job_name: str, comment_prefix: str) -> list[str]:
    """Ids of the jobs this lane submitted (its name, and a run label as comment), each once."""
    ids: list[str] = []
    for j in jobs:
        jid = j["id"].split("+")[0]
        if j["name"] == job_name and j["comment"].startswith(comment_prefix) and jid not in ids:
            ids.append(jid)
    return ids


def cancel(inv: Inventory, ids: list[str]) -> NodeCommands:
    op = NodeCommands(f"cancel Slurm job(s) {', '.join(ids)}",
                      {CONTROLLER: "scancel " + " ".join(shlex.quote(i) for i in ids)}, timeout_s=60)
    op.env = _env(inv)
    return op


def refusals_now(inv: Inventory, lane_nodes: list[str], *, dry_run: bool = False) -> list[Finding]:
    """Read the cluster now (a read: it runs under --dry-run=facts, not under --dry-run) and say what refuses
    the lane; for `plan` and `up` before anything is submitted."""
    if inv.launcher != "slurm" or dry_run:
        return []
    from sparkfleet.fleet.connect import transport_for

    ctl = controller(inv)
    transport = transport_for([ctl])
    try:
        return Executor(transport, {CONTROLLER: ctl}).drive(check(inv, lane_nodes))
    finally:
        transport.close()
