"""One command on one compute node through Slurm: the srun transport's wrapper (slurm.ssh: false).

    python -m sparkfleet.slurm.step REQUEST_JSON COMMAND...

REQUEST_JSON: {"node", "timeout_s", and the inventory's slurm: partition, account, qos, reservation}.
The srun transport (fleet/srun.py) runs every node command as this module followed by `bash -c
COMMAND`, the way the local transport runs a node's wrapper; SLURM_CONF comes in the environment.

Where it runs: a job sparkfleet submitted that holds the node now (squeue: running on the node, its
comment the run label `sparkfleet.run=...`) gets the command as an overlapping step of one task
(`srun --jobid J --overlap`): a serving lane's nodes are whole-node allocations no other job gets.
Otherwise the command is a job of its own (`sparkfleet-step`, one task on the node, a time limit of
the command's timeout, `--immediate` for half of it, so a node another job holds fails the command
with Slurm's reason instead of queueing behind that job).
A job of anyone else is never joined.

Could the command be started? The task first prints a marker line, which this wrapper takes off its
stdout; if srun ends before the marker came, the command never ran there, and srun's last error line
goes to the local transport's status pipe ($SPARKFLEET_NOT_RUN_FD): the node's Result is "not-run",
not a failed command.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading

from sparkfleet import naming

MARKER = b"sparkfleet-step-started\n"
STEP_JOB = "sparkfleet-step"
NOT_RUN_FD = "SPARKFLEET_NOT_RUN_FD"  # fleet/local.py's status pipe (the same name)
# the task's first act: the marker, then the command; HOME as the node's passwd says (srun carries this
# machine's environment, not the node user's home), as over SSH
PRELUDE = ('printf "%s\\n" sparkfleet-step-started; '
           'HOME=$(getent passwd "$(id -u)" | cut -d: -f6); export HOME; cd "$HOME" 2>/dev/null; exec "$@"')


def holding_job(node: str) -> str | None:
    """The id of a running job sparkfleet submitted that holds `node` (squeue %A: a heterogeneous job's
    component, which srun --jobid takes), or None."""
    got = subprocess.run(["squeue", "-h", "-t", "R", "-w", node, "-o", "%A|%k"], capture_output=True, text=True,
                         timeout=30)
    if got.returncode != 0:
        raise RuntimeError(f"squeue -w {node} failed: " + (got.stderr.strip().splitlines() or ["no output"])[-1])
    for line in got.stdout.splitlines():
        job_id, _, comment = line.partition("|")
        if comment.startswith(naming.RUN_LABEL + "="):
            return job_id.strip()
    return None


def srun_argv(req: dict, job_id: str | None, command: list[str]) -> list[str]:
    """The srun line for `command` on the request's node: a step of `job_id`, or a one-task job of its own."""
    head = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={req['node']}", "--quiet"]
    if job_id is not None:
        head += [f"--jobid={job_id}", "--overlap"]
    else:
        timeout_s = float(req.get("timeout_s", 60))
        # the node waited for half the command's bound at most (a step job of ours still completing there), so
        # Slurm's reason for a node another job holds reaches the result before the transport's timeout
        head += [f"--job-name={STEP_JOB}", f"--time={max(1, math.ceil(timeout_s / 60))}",
                 f"--immediate={max(1, math.ceil(timeout_s / 2))}"]
        head += [f"--{k}={req[k]}" for k in ("partition", "account", "qos", "reservation") if req.get(k)]
    return [*head, "bash", "-c", PRELUDE, "sparkfleet-step", *command]


def _not_run(why: str) -> None:
    fd = os.environ.get(NOT_RUN_FD)
    if fd and fd.isdigit():
        try:
            os.write(int(fd), (why.strip()[-400:] + "\n").encode())
        except OSError:
            pass


def _close_status() -> None:
    fd = os.environ.get(NOT_RUN_FD)
    if fd and fd.isdigit():
        try:
            os.close(int(fd))
        except OSError:
            pass


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: python -m sparkfleet.slurm.step REQUEST_JSON COMMAND...\n")
        return 2
    req, command = json.loads(argv[0]), argv[1:]
    try:
        job_id = holding_job(str(req["node"]))
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        _not_run(f"cannot ask Slurm which job holds {req['node']}: {exc}")
        return 255
    env = {k: v for k, v in os.environ.items() if k != NOT_RUN_FD}
    proc = subprocess.Popen(srun_argv(req, job_id, command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, close_fds=True)
    assert proc.stdout is not None and proc.stderr is not None
    errors: list[bytes] = []

    def relay_stderr() -> None:  # srun's own lines and the command's, as they come; srun's kept for _not_run
        for line in iter(proc.stderr.readline, b""):
            errors.append(line)
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()

    relay = threading.Thread(target=relay_stderr, daemon=True)
    relay.start()
    first = proc.stdout.readline()
    started = first == MARKER
    if started:
        _close_status()
    elif first:
        sys.stdout.buffer.write(first)
    out = sys.stdout.buffer
    while chunk := proc.stdout.read1(65536):
        out.write(chunk)
        out.flush()
    code = proc.wait()
    relay.join(5)
    if not started:
        said = [x.decode(errors="replace").strip() for x in errors if x.strip()]
        _not_run(said[-1] if said else f"srun ended with status {code} before the command started on {req['node']}")
        return code or 255
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
