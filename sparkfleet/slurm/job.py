"""A lane as one Slurm job: the sbatch script, rendered from the same launches the SSH launcher runs. Pure.

One task per node (`--ntasks-per-node=1`, `--exclusive`), `--kill-on-bad-exit=1` so one rank's death
ends the group, and a heterogeneous job (head first, workers second) when the head's hardware class
differs from the workers'. Each task picks its rank by the Slurm node it runs on ($SLURMD_NODENAME: the
inventory's node names are the Slurm node names), runs the rank's own `docker run -d` script verbatim
(engines/container.py renders it from the ContainerSpec), then waits on the container with a trap that
removes it when Slurm signals the task: a container is not a child of the task, so Slurm's process
tracking alone would leave it running. Workers before the head: the head's task first waits until every
worker accepts on its ports (the SSH launcher's waves do the same with their ready checks).
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

from sparkfleet import naming
from sparkfleet.engines.base import Launch
from sparkfleet.schema.inventory import Inventory

# How long the head's task waits for a worker to accept: the SSH launcher gives a wave's `docker run` 300 s
# (runner/steps/launch.py), and in the job the workers' containers start while the head waits.
WORKER_WAIT_S = 300
TASK_END = "SPARKFLEET_TASK"  # the heredoc delimiter of the task script (must not occur in it)
# Where the job's output goes, on the node that runs the batch script: /tmp is on every node, the
# submitting directory need not be (%x the job name, %j its id; sbatch(1) "filename pattern").
OUTPUT = "/tmp/%x-%j.out"


@dataclass(frozen=True)
class Job:
    """The rendered job: what it is called and labelled (how this lane finds its own jobs), and the script."""

    name: str  # sbatch --job-name
    comment: str  # sbatch --comment: the run label, `sparkfleet.run=<run id>`
    nodes: list[str]  # every node of the job, head first
    het: bool  # a heterogeneous job (head's class differs from the workers')
    script: str


def output_path(name: str, job_id: str) -> str:
    """Where a job's output file is on its batch host: OUTPUT with sbatch's %x (job name) and %j (job id)."""
    return OUTPUT.replace("%x", name).replace("%j", job_id)


def run_comment(run_id: str) -> str:
    """The run label a job carries (squeue's %k), as the containers carry sparkfleet.run."""
    return f"{naming.RUN_LABEL}={run_id}"


def render_job(launches: list[Launch], inventory: Inventory, profile: str, run_id: str) -> Job:
    """The sbatch script for a lane's launches (every rank, head included)."""
    slurm = inventory.slurm
    if slurm is None:
        raise ValueError("render_job needs an inventory with a slurm: section")
    head = next(x for x in launches if x.role == "head")
    workers = [x for x in launches if x.role != "head"]
    klass = {x.node: inventory.nodes[x.node].hardware for x in launches}
    het = bool(workers) and any(klass[w.node] != klass[head.node] for w in workers)
    name, comment = naming.slurm_job_name(profile), run_comment(run_id)
    site = [("--partition", slurm.partition), ("--account", slurm.account), ("--qos", slurm.qos),
            ("--time", slurm.time), ("--reservation", slurm.reservation)]
    site_lines = [f"#SBATCH {flag}={value}" for flag, value in site if value is not None]

    def component(nodes: list[str]) -> list[str]:
        return [f"#SBATCH --nodes={len(nodes)}", f"#SBATCH --nodelist={','.join(nodes)}",
                "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive", *site_lines]

    lines = ["#!/bin/bash",
             f"# sparkfleet lane {profile}, run {run_id}: one task per node, its rank chosen by node name",
             f"#SBATCH --job-name={name}", f"#SBATCH --comment={comment}",
             "#SBATCH --chdir=/tmp", f"#SBATCH --output={OUTPUT}"]
    order = [head.node] + [w.node for w in workers]
    if het:
        lines += component([head.node]) + ["#SBATCH hetjob"] + component([w.node for w in workers])
        groups = "--het-group=0,1 "
    else:
        lines += component(order)
        groups = ""
    task = task_script(launches, inventory)
    if any(line == TASK_END for line in task.splitlines()):
        raise ValueError(f"a launch script contains the line {TASK_END}")
    lines += ["", f"read -r -d '' TASK <<'{TASK_END}' || true", task.rstrip("\n"), TASK_END,
              f'exec srun {groups}--kill-on-bad-exit=1 --label bash -c "$TASK"', ""]
    return Job(name, comment, order, het, "\n".join(lines))


def task_script(launches: list[Launch], inventory: Inventory) -> str:
    """The shell every task runs: its rank's block by node name, then wait on the container."""
    workers = [x for x in launches if x.role != "head"]
    out = ["# the rank this task runs, by the Slurm node it is on",
           "case \"$SLURMD_NODENAME\" in"]
    for x in sorted(launches, key=lambda x: x.rank):
        out.append(f"  {shlex.quote(x.node)}) RANK={x.rank} C={shlex.quote(x.container)} ;;")
    out += ["  *) echo \"sparkfleet: node $SLURMD_NODENAME has no rank in this job\" >&2; exit 2 ;;", "esac",
            "# the container is not a child of this task: remove it when the task ends or Slurm signals it",
            "trap 'docker rm -f \"$C\" >/dev/null 2>&1' EXIT",
            "trap 'ended signal; exit 143' TERM INT", ""]
    for x in sorted(launches, key=lambda x: x.rank):
        out.append(f"rank_{x.rank}() {{")
        if x.role == "head":
            for w in workers:
                for port in sorted(w.spec.ports if w.spec else {}):
                    node = inventory.nodes[w.node]
                    host = node.fabric_ip or node.ssh.host
                    out.append(f"  wait_for {shlex.quote(host)} {port} "
                               f"{shlex.quote(f'rank {w.rank} on {w.node}')} || exit 1")
        for path, content in x.files.items():
            out.append(f"  mkdir -p {shlex.quote(posixpath.dirname(path))} && "
                       f"printf %s {shlex.quote(content)} > {shlex.quote(path)} || exit 1")
        out.append(x.script.rstrip("\n") + " || exit 1")
        if x.ready_check:  # the rank's own check runs where it was written to run: on its node
            out.append(f"( {x.ready_check.rstrip()}\n ) || exit 1")
        out.append("}")
    out += ["",
            "wait_for() {  # HOST PORT WHAT: a bounded wait until HOST accepts on PORT",
            f"  for _ in $(seq {WORKER_WAIT_S}); do",
            "    (: </dev/tcp/\"$1\"/\"$2\") 2>/dev/null && return 0",
            "    sleep 1",
            "  done",
            f"  echo \"sparkfleet: $3 does not accept on $1:$2 after {WORKER_WAIT_S} s\" >&2",
            "  return 1",
            "}", "",
            "ended() {  # how the rank's container ended, once it has (also on Slurm's signal after it died)",
            "  [ -z \"${said:-}\" ] || return 0  # once: a signal can come after the task said it",
            "  st=$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' \"$C\" 2>/dev/null)",
            "  case \"$st\" in",
            "    exited*|dead*) code=${st#* } ;;",
            "    '') [ \"$1\" = signal ] && return 0; code= ;;  # gone: removed under the task (no code)",
            "    *) return 0 ;;  # still running: Slurm ended a serving rank, nothing ended on its own",
            "  esac",
            "  echo \"sparkfleet: rank $RANK's container $C ended with code ${code:-unknown}\" >&2; said=1",
            "}", "",
            "\"rank_$RANK\"",
            # written out, not fleet/ops LogTail: the container is the script's $C, known only in the task (an
            # op quotes a name it is given), and followed (-f) in the background for the task's whole life
            "docker logs -f \"$C\" &  # the rank's log is the task's output",
            "docker wait \"$C\" >/dev/null & wait $!  # in the background, so a signal reaches the trap at once",
            "ended",
            "# a serving rank never ends on its own: any end, code 0 too, fails the task and so ends the group",
            "[ \"${code:-1}\" != 0 ] || code=1",
            "exit \"${code:-1}\"  # no code: the container was removed under the task", ""]
    return "\n".join(out)
