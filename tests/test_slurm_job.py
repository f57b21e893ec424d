"""The lane as one sbatch script, rendered from the same launches the SSH launcher runs: golden bytes,
and the script's shell run for real (bash parses it; each task picks its own rank, runs its own `docker run`)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sparkfleet.opsdir import Spec
from sparkfleet.plan import make_plan
from sparkfleet.schema.inventory import Inventory, Slurm
from sparkfleet.slurm.job import TASK_END, render_job, task_script

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

GOLDEN = Path(__file__).parent / "golden" / "slurm"


def _lane(spec: Spec, profile: str, head_class: str | None = None) -> tuple[list, Inventory]:
    inv = spec.inventory("lab").model_copy(update={
        "launcher": "slurm", "slurm": Slurm(partition="sparks", account="lab-a", time="02:00:00")})
    loaded = spec.profile(profile)
    plan = make_plan(loaded, inv, spec.playbook("up"), spec.root, run_id="20261202-0130-abcd")
    if head_class:  # the head on another class of machine (a GB300 Station heading GB10 workers)
        head = next(x.node for x in plan.launches if x.role == "head")
        nodes = dict(inv.nodes)
        nodes[head] = nodes[head].model_copy(update={"hardware": head_class})
        inv = inv.model_copy(update={"nodes": nodes})
    return plan.launches, inv


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("profile", ["dcp2", "llamacpp-lab", "tf1017"])
def test_job_script_golden(repo_spec: Spec, profile: str) -> None:
    """The exact bytes sbatch is given; regenerate with UPDATE_GOLDEN=1 and review the diff like code."""
    launches, inv = _lane(repo_spec, profile)
    job = render_job(launches, inv, profile, "20261202-0130-abcd")
    assert not job.het
    assert job.name == f"sparkfleet-{profile}" and job.comment == "sparkfleet.run=20261202-0130-abcd"
    _golden(f"{profile}.sbatch", job.script)


def test_hetjob_when_the_head_is_another_class(repo_spec: Spec) -> None:
    launches, inv = _lane(repo_spec, "dcp2", head_class="gb300")
    job = render_job(launches, inv, "dcp2", "20261202-0130-abcd")
    assert job.het and job.nodes == ["reddie", "asusi", "bluey", "spark4"]
    header = [line for line in job.script.splitlines() if line.startswith("#SBATCH")]
    assert header == [
        "#SBATCH --job-name=sparkfleet-dcp2", "#SBATCH --comment=sparkfleet.run=20261202-0130-abcd",
        "#SBATCH --chdir=/tmp", "#SBATCH --output=/tmp/%x-%j.out",
        "#SBATCH --nodes=1", "#SBATCH --nodelist=reddie", "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive",
        "#SBATCH --partition=sparks", "#SBATCH --account=lab-a", "#SBATCH --time=02:00:00",
        "#SBATCH hetjob",
        "#SBATCH --nodes=3", "#SBATCH --nodelist=asusi,bluey,spark4", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive", "#SBATCH --partition=sparks", "#SBATCH --account=lab-a", "#SBATCH --time=02:00:00"]
    assert 'exec srun --het-group=0,1 --kill-on-bad-exit=1 --label bash -c "$TASK"' in job.script.splitlines()


def _docker_recorder(tmp_path: Path, state: str = "exited 7", wait: str = "") -> Path:
    """A `docker` that records each call's argv in tmp_path/calls: `run` prints an id, `inspect` the
    container's `state` (its .State.Status and .State.ExitCode), `wait` runs `wait` first. Its bin folder."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(exist_ok=True)
    log.write_text("")
    (bin_dir / "docker").write_text(
        "#!/bin/bash\n"
        # one write per call (O_APPEND: whole), so the task's two background calls never interleave
        f"line=\"\"; for a in \"$@\"; do line+=\"$a\"$'\\x1f'; done; printf '%s\\n' \"$line\" >> {shlex.quote(str(log))}\n"
        f"case \"$1\" in run) echo cid-$RANDOM ;; inspect) echo {shlex.quote(state)} ;; wait) {wait or ':'} ;; esac\n")
    (bin_dir / "docker").chmod(0o755)
    return bin_dir


def _run_task(tmp_path: Path, launches: list, inv: Inventory, node: str) -> tuple[int, list[list[str]]]:
    """The job's task script as Slurm runs it on `node` ($SLURMD_NODENAME), with `docker` a recorder: the
    argv each docker call got, and the task's exit status."""
    bin_dir, log = _docker_recorder(tmp_path), tmp_path / "calls"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURMD_NODENAME": node}
    proc = subprocess.run(["bash", "-c", task_script(launches, inv)], env=env, capture_output=True, text=True,
                          timeout=60)
    calls = [line.split("\x1f")[:-1] for line in log.read_text().splitlines()]
    return proc.returncode, calls


def test_each_task_runs_its_own_ranks_docker_run(repo_spec: Spec, tmp_path: Path) -> None:
    launches, inv = _lane(repo_spec, "dcp2")
    by_node = {x.node: x for x in launches}
    code, calls = _run_task(tmp_path, launches, inv, "bluey")
    assert ["docker", *calls[0]] == by_node["bluey"].argv  # the SSH launcher's argv, token for token
    wait, inspect = ["wait", "sf-dcp2-r2"], ["inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", "sf-dcp2-r2"]
    rm = ["rm", "-f", "sf-dcp2-r2"]  # the trap, on the task's exit
    # `docker logs -f` runs in the background and nothing waits for it: on a loaded machine it may be recorded
    # after any of the others; `docker wait` is waited for, so the exit code is asked after it and the trap last
    assert sorted(calls[1:]) == sorted([["logs", "-f", "sf-dcp2-r2"], wait, inspect, rm])
    assert calls.index(wait) < calls.index(inspect) < calls.index(rm)
    assert code == 7  # the container's exit code is the task's


@pytest.mark.parametrize(("state", "said"), [
    ("exited 3", "sparkfleet: rank 2's container sf-dcp2-r2 ended with code 3\n"),  # died, then Slurm signalled
    ("running 0", ""),  # serving when Slurm ended the job (down, scancel): nothing ended on its own
])
def test_a_task_signalled_after_its_container_ended_still_says_how(repo_spec: Spec, tmp_path: Path, state: str,
                                                                   said: str) -> None:
    """up may cancel the job (a rank it saw die) before the task's `docker wait` returns: the TERM trap says
    how the container ended, so the job's log names the rank's code whichever side saw it first."""
    launches, inv = _lane(repo_spec, "dcp2")
    bin_dir = _docker_recorder(tmp_path, state, wait="sleep 30")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURMD_NODENAME": "bluey"}
    err_path = tmp_path / "stderr"  # a file, not a pipe: the fake `docker wait` left sleeping holds its copy
    with err_path.open("w") as err:
        proc = subprocess.Popen(["bash", "-c", task_script(launches, inv)], env=env, stderr=err,
                                start_new_session=True)  # its group: the fake `docker wait` goes with it
    try:
        deadline = time.monotonic() + 10
        while "wait\x1f" not in (tmp_path / "calls").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert (proc.returncode, err_path.read_text()) == (143, said)


def test_a_node_without_a_rank_runs_nothing(repo_spec: Spec, tmp_path: Path) -> None:
    launches, inv = _lane(repo_spec, "dcp2")
    code, calls = _run_task(tmp_path, launches, inv, "station")
    assert (code, calls) == (2, [])  # refused before the trap and before any docker call


def test_the_task_delimiter_cannot_end_the_task_early(repo_spec: Spec) -> None:
    import dataclasses

    launches, inv = _lane(repo_spec, "dcp2")
    bad = [dataclasses.replace(launches[0], script=f"echo\n{TASK_END}\nrm -rf /")] + launches[1:]
    with pytest.raises(ValueError, match=TASK_END):
        render_job(bad, inv, "dcp2", "r")
