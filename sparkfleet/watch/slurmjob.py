"""watch and a lane that runs as one Slurm job (inventory `launcher: slurm`): how the job ended.

On a Slurm lane one rank's death ends the whole job (`--kill-on-bad-exit=1`) and every task's trap removes
its container, so a crash leaves no container at all: the very picture a `down` leaves. Slurm tells the
two apart: a job that `scancel` ended (a `down` here or elsewhere, an admin) reads CANCELLED; one whose
task failed reads FAILED (or NODE_FAIL, TIMEOUT, ... for the scheduler's own ends). watch asks for the
job of the run it looks after, found as `down` finds jobs: the lane's job name AND that run's label as
comment, never by id alone (slurm/ops.py `ours`), among the jobs slurmctld still keeps (squeue
`--states=all`: without slurmdbd an ended job is known for MinJobAge, 300 s by default).

`classify` is pure; `read_end` is the read, as operations of the one executor (driven by slurm/ops.py
`drive_here`, as `status` drives its squeue). A squeue or scontrol that fails raises SlurmUnanswered: Slurm
could not be asked, which is never the same as "Slurm lists no such job" (issue 39).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sparkfleet import naming
from sparkfleet.fleet.op import OpGen
from sparkfleet.schema.inventory import Inventory
from sparkfleet.slurm import ops as slurm
from sparkfleet.slurm.job import run_comment

POLL_S = 0.5


class SlurmUnanswered(Exception):
    """squeue or scontrol failed (the message says which, and what it said): how the job ended is not known."""


@dataclass(frozen=True)
class JobEnd:
    """The job of a run watch looks after, as Slurm last said (`state` is the job's own, scontrol's JobState)."""

    job_id: str
    state: str
    run_id: str  # the run whose label the job carries
    exit_code: str | None = None  # scontrol's ExitCode (`code:signal`)
    reason: str | None = None
    batch_host: str | None = None  # where the job's output file is (StdOut)
    output: str | None = None

    @property
    def ended(self) -> bool:
        return self.state in slurm.ENDED

    @property
    def cancelled(self) -> bool:
        """scancel ended it: someone took the lane down (watch's own restarts cancel only after deciding)."""
        return self.state == "CANCELLED"

    def as_record(self, profile: str) -> dict:
        """The run record's `slurm_job` (runner/record.py SlurmJobRecord) of a watch incident: this job's end."""
        return {"job_id": self.job_id, "name": naming.slurm_job_name(profile), "comment": run_comment(self.run_id),
                "state": self.state, "exit_code": self.exit_code, "reason": self.reason,
                "batch_host": self.batch_host, "output": self.output}

    def said(self) -> str:
        """`Slurm job 12 FAILED, exit code 1:0`: the job's end in Slurm's words."""
        text = f"Slurm job {self.job_id} {self.state}"
        if self.exit_code:
            text += f", exit code {self.exit_code}"
        if self.reason not in (None, "", "None"):
            text += f", reason {self.reason}"
        return text


def classify(end: JobEnd | None, own_runs: set[str] | frozenset[str] = frozenset(),
             own_jobs: set[str] | frozenset[str] = frozenset()) -> str:
    """What the end of the lane's job means once a rank vanished or exited:
    `failed` (the job ended by itself: a rank's end ended the group; watch restarts it within the budget),
    `cancelled` (scancel: the operator has the lane), `unknown` (Slurm no longer knows the job, or it has not
    ended within the bound: watch cannot tell). A job watch's own runs cancelled is not the operator's: that
    of a restart of its own that failed (`own_runs`: its `up` cancels its job itself), or one the stop step of
    a playbook watch ran cancelled (`own_jobs`, job ids)."""
    if end is None or not end.ended:
        return "unknown"
    ours = end.run_id in own_runs or end.job_id in own_jobs
    return "cancelled" if end.cancelled and not ours else "failed"


def _ids(jobs: list[dict[str, str]], name: str, labels: set[str]) -> list[str]:
    """The lane's jobs carrying one of `labels` (a heterogeneous job once), newest first."""
    ids = {j["id"].split("+")[0] for j in jobs if j["name"] == name and j["comment"] in labels}
    return sorted(ids, key=lambda i: int(i) if i.isdigit() else -1, reverse=True)


def _run_of(jobs: list[dict[str, str]], jid: str) -> str:
    comment = next(j["comment"] for j in jobs if j["id"].split("+")[0] == jid)
    return comment.partition("=")[2]


def read_end(inv: Inventory, profile: str, run_ids: set[str], bound_s: float = slurm.END_BOUND_S,
             poll_s: float = POLL_S) -> OpGen[JobEnd | None]:
    """The newest job of this lane carrying one of `run_ids`' labels, waited for (bounded) until Slurm says it
    ended, with scontrol's final state; None when Slurm lists no such job; SlurmUnanswered when squeue or
    scontrol failed."""
    name, labels = naming.slurm_job_name(profile), {run_comment(r) for r in run_ids}
    deadline = time.monotonic() + bound_s
    while True:
        res = yield slurm.lane_jobs(inv, name, ended_too=True)
        r = (res or {}).get(slurm.CONTROLLER)
        if r is None or not r.ok:
            raise SlurmUnanswered(f"squeue: {slurm.said(r)}")
        jobs = slurm.parse_jobs(r.stdout)
        ids = _ids(jobs, name, labels)
        if not ids:
            return None
        jid = ids[0]
        states = [j["state"] for j in jobs if j["id"].split("+")[0] == jid]
        if all(s in slurm.ENDED for s in states) or time.monotonic() > deadline:
            break
        time.sleep(poll_s)
    res = yield slurm.show_job(inv, jid)
    r = (res or {}).get(slurm.CONTROLLER)
    if r is None or not r.ok:  # the job's final state and exit code are scontrol's: not known without it
        raise SlurmUnanswered(f"scontrol -o show job {jid}: {slurm.said(r)}")
    f = slurm.parse_job(r.stdout)
    return JobEnd(jid, f.get("JobState") or states[0], _run_of(jobs, jid), f.get("ExitCode"), f.get("Reason"),
                  f.get("BatchHost"), f.get("StdOut"))
