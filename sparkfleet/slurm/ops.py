"""The controller-side Slurm commands as operations of the one executor (fleet/op.py): they run on the
controller (SLURM_CONF = the inventory's slurm.conf) or, with `slurm.login`, on the login node over SSH.

The executor runs commands on Nodes, so the place the Slurm commands run is one: `controller(inv)`, named
CONTROLLER, local or reached over SSH. Nothing here touches a job this lane did not submit: jobs are found
by the lane's job name and kept only when their comment is the run label (slurm/job.py)."""

from __future__ import annotations

import shlex
from typing import TypeVar

from sparkfleet import naming
from sparkfleet.findings import Finding
from sparkfleet.fleet.op import NodeCommands, OpGen, executor_for, query
from sparkfleet.fleet.transport import Result
from sparkfleet.schema.inventory import Inventory, Node, Ssh, Storage
from sparkfleet.slurm import cluster
from sparkfleet.slurm.job import Job

T = TypeVar("T")

CONTROLLER = "slurm-controller"  # where sbatch/squeue/scancel run (not a node of the inventory)
SEPARATOR = "--sparkfleet--"


def controller(inv: Inventory) -> Node:
    """The place the Slurm commands run, as the executor addresses it: this machine, or the login node."""
    s = inv.slurm
    assert s is not None
    login = s.login
    return Node(name=CONTROLLER, ssh=login or Ssh(host="localhost"), hardware="gb10",
                storage=Storage(model_root="/", cache_dir="/"), transport="ssh" if login else "local")


def said(r: Result | None) -> str:
    """What a Slurm command that failed said: its message, its stderr's end, else its exit code."""
    if r is None:
        return "not run"
    return r.message or r.stderr.strip()[-300:] or f"exit {r.exit_code}"


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
        return said(r)
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


# squeue's fields for a job (squeue(1) "-o <output_format>"); the comment last, since a foreign job's
# comment is free text and may hold the separator
JOB_FIELDS = (("id", "%i"), ("name", "%j"), ("state", "%T"), ("reason", "%r"), ("nodes", "%N"),
              ("time", "%M"), ("comment", "%k"))
JOB_FORMAT = "|".join(code for _, code in JOB_FIELDS)
ENDED = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "TIMEOUT")  # squeue(1) "JOB STATE CODES" a job does not leave again
# scancel sends SIGTERM, then SIGKILL after KillWait (Slurm's default 30 s); the tasks' traps remove the
# containers in between. A job still not ended past this is reported as it stands (`down`, watch).
END_BOUND_S = 90.0


def lane_jobs(inv: Inventory, job_name: str | None, ended_too: bool = False) -> NodeCommands:
    """Jobs as squeue lists them (JOB_FIELDS): those named `job_name`, or every job (None; status of all lanes).
    `ended_too`: also the jobs that ended but that slurmctld still keeps (`--states=all`; for MinJobAge,
    300 s by default: without slurmdbd, the only place a job's end can be read)."""
    name = f" --name={shlex.quote(job_name)}" if job_name else ""
    states = " --states=all" if ended_too else ""
    op = query(f"list Slurm jobs{' named ' + job_name if job_name else ''}{', ended ones too' if ended_too else ''}",
               {CONTROLLER: f"squeue -h{name}{states} -o {shlex.quote(JOB_FORMAT)}"}, timeout_s=30)
    op.env = _env(inv)
    return op


def parse_jobs(stdout: str) -> list[dict[str, str]]:
    """squeue lines from lane_jobs; a heterogeneous job is listed once per component (`7+0`, `7+1`)."""
    out = []
    for line in stdout.splitlines():
        parts = line.split("|", len(JOB_FIELDS) - 1)
        if len(parts) == len(JOB_FIELDS):
            out.append(dict(zip((k for k, _ in JOB_FIELDS), parts, strict=True)))
    return out


def ours(jobs: list[dict[str, str]], job_name: str | None, comment_prefix: str) -> list[str]:
    """Ids of the jobs this lane submitted (its name, or any lane's with None, and a run label as comment),
    each once."""
    ids: list[str] = []
    for j in jobs:
        jid = j["id"].split("+")[0]
        named = j["name"] == job_name if job_name else j["name"].startswith(naming.slurm_job_name(""))
        if named and j["comment"].startswith(comment_prefix) and jid not in ids:
            ids.append(jid)
    return ids


def show_job(inv: Inventory, job_id: str) -> NodeCommands:
    """`scontrol -o show job ID`: state, reason, exit code, batch host and output file of one job (Slurm keeps
    an ended job for MinJobAge, 300 s by default; then it answers `Invalid job id specified`)."""
    op = query(f"read Slurm job {job_id}", {CONTROLLER: f"scontrol -o show job {shlex.quote(job_id)}"},
               timeout_s=30)
    op.env = _env(inv)
    return op


def parse_job(stdout: str) -> dict[str, str]:
    """The first record of `scontrol -o show job` (a heterogeneous job prints one per component, the first
    being the job's own), as its Key=value fields."""
    lines = [x for x in stdout.splitlines() if x.startswith("JobId=")]
    return cluster.fields(lines[0].strip()) if lines else {}


def cancel(inv: Inventory, ids: list[str]) -> NodeCommands:
    op = NodeCommands(f"cancel Slurm job(s) {', '.join(ids)}",
                      {CONTROLLER: "scancel " + " ".join(shlex.quote(i) for i in ids)}, timeout_s=60)
    op.env = _env(inv)
    return op


def drain(inv: Inventory, reasons: dict[str, str]) -> NodeCommands:
    """Drain nodes with a reason each (scontrol(1) `update NodeName=... State=DRAIN Reason=...`; Slurm needs a
    reason to drain): the scheduler gives them to no job until an admin sets State=RESUME."""
    cmd = " && ".join(f"scontrol update NodeName={shlex.quote(n)} State=DRAIN Reason={shlex.quote(r)}"
                      for n, r in reasons.items())
    op = NodeCommands(f"drain {', '.join(reasons)} in Slurm", {CONTROLLER: cmd}, timeout_s=60)
    op.env = _env(inv)
    return op


def places(inv: Inventory) -> dict[str, Node]:
    """The places besides the inventory's nodes a run's executor must reach: the Slurm controller (or login
    node) for launcher: slurm, nothing otherwise. runner/run.py adds them to the run's transport and executor."""
    return {CONTROLLER: controller(inv)} if inv.launcher == "slurm" else {}


def drive_here(inv: Inventory, gen: OpGen[T]) -> T:
    """Drive controller-side operations now, outside a run (plan's refusals, status): no dry-run."""
    ex = executor_for([controller(inv)])  # the controller's name is CONTROLLER, as the operations address it
    try:
        return ex.drive(gen)
    finally:
        ex.transport.close()


def refusals_now(inv: Inventory, lane_nodes: list[str], *, dry_run: bool = False) -> list[Finding]:
    """Read the cluster now (a read: it runs under --dry-run=facts, not under --dry-run) and say what refuses
    the lane; for `plan` and `up` before anything is submitted."""
    if inv.launcher != "slurm" or dry_run:
        return []
    return drive_here(inv, check(inv, lane_nodes))


def jobs_now(inv: Inventory, job_name: str | None, ended_too: bool = False) -> list[dict[str, str]] | str:
    """sparkfleet's jobs (this lane's with `job_name`, every lane's with None) as squeue lists them now, each
    carrying a run label (`ended_too`: the ended ones slurmctld still keeps as well); a string when squeue
    failed (why). For `status` and `logs --job`."""
    def read() -> OpGen[list[dict[str, str]] | str]:
        res = (yield lane_jobs(inv, job_name, ended_too))
        r = (res or {}).get(CONTROLLER)
        if r is None or not r.ok:
            return said(r)
        jobs = parse_jobs(r.stdout)
        keep = set(ours(jobs, job_name, naming.RUN_LABEL + "="))
        return [j for j in jobs if j["id"].split("+")[0] in keep]

    return drive_here(inv, read())
