"""A Slurm lane's job output (`logs --job`): which job, where its file is, and reading it, new lines too.

The job writes one file on its batch host (slurm/job.py OUTPUT, `/tmp/<job name>-<job id>.out`): every
task's lines labelled by srun (`--label`: `N: ` for task N), that is each rank's container log as the task
forwards it (`docker logs -f`), and the task's own lines, which are nowhere else: the head's wait for its
workers, `sparkfleet: rank R's container C ended with code X`, srun's `task N: Exited with exit code C`.
After the job ended its traps have removed the containers, so the file is then the only log of the lane.

Which job: the newest of the lane's jobs Slurm still keeps (its name and a run label; ended ones for
MinJobAge), else the newest one a run record of this state dir names. Where: the node of the lane that has
the file (Slurm's batch host is the allocation's first node in Slurm's own order, which the inventory does
not give; one `tail` per node, those without the file say so). Pure parts here; the reads go through the
one executor (`run_commands`), as the other reads of `logs`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from sparkfleet import naming
from sparkfleet.slurm.job import output_path

NO_FILE = 3  # the exit code of a read on a node without the file
SIZE = "--sparkfleet-size--"  # the line before the file's size in bytes at the time of the read


@dataclass(frozen=True)
class JobRef:
    job_id: str
    name: str
    source: str  # "slurm" (squeue) or "record RUN_ID"

    @property
    def path(self) -> str:
        return output_path(self.name, self.job_id)


def newest(jobs: list[dict[str, str]]) -> str | None:
    """The newest job id among squeue's lines (a heterogeneous job's components are one job)."""
    ids = {j["id"].split("+")[0] for j in jobs}
    return max(ids, key=lambda i: int(i) if i.isdigit() else -1) if ids else None


def from_records(runs_dir: Path, profile: str, inventory: str) -> JobRef | None:
    """The job the newest run record of this lane (and inventory) submitted, if any."""
    for path in sorted(runs_dir.glob("*.json"), reverse=True):  # run ids begin with their time
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        job = (d.get("data") or {}).get("slurm_job") or {}
        if d.get("profile") == profile and d.get("inventory") == inventory and job.get("job_id"):
            return JobRef(str(job["job_id"]), job.get("name") or naming.slurm_job_name(profile),
                          f"record {d.get('run_id')}")
    return None


def read_command(path: str, tail: int | None) -> str:
    """The file's last `tail` lines (all with None) as of one size, then SIZE and that size; exit NO_FILE
    when the node does not have it."""
    f = shlex.quote(path)
    lines = f" | tail -n {int(tail)}" if tail else ""
    return (f'[ -f {f} ] || exit {NO_FILE}; s=$(stat -c %s {f}); head -c "$s" {f}{lines}; '
            f'echo; echo {SIZE}; echo "$s"')


def parse_read(stdout: str) -> tuple[list[str], int]:
    """(the complete lines read, the byte offset just after them): a last line still being written is left
    for the next read (follow)."""
    text, _, size = stdout.rpartition("\n" + SIZE + "\n")
    end = int(size.strip() or 0)
    if text.endswith("\n"):  # the file ended with a newline (and the echo added one after it)
        text = text[:-1]
    else:  # the last line is not complete yet: not shown, read again from where it starts
        text, _, partial = text.rpartition("\n") if "\n" in text else ("", "", text)
        end -= len(partial.encode())
    return (text.split("\n") if text else []), end


def new_command(path: str, offset: int) -> str:
    """The bytes after `offset` (follow)."""
    return f"tail -c +{int(offset) + 1} {shlex.quote(path)}"


def complete(text: str) -> tuple[list[str], int]:
    """The complete lines of what was appended, and how many bytes they take (a line still being written
    is read again next time)."""
    done, _, _ = text.rpartition("\n")
    if not done and not text.startswith("\n"):
        return [], 0
    return done.split("\n"), len((done + "\n").encode())
