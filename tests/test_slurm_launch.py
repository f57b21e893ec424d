"""The Slurm launcher without a lab: `up --dry-run` shows the sbatch command and the job's script (the one
slurm/job.py renders for this run) and submits nothing, `down --dry-run` shows the scancel of what squeue
would list, and the job's output is read for the task that failed first (srun's own lines)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sparkfleet.cli.main import main
from sparkfleet.opsdir import Spec
from sparkfleet.plan import make_plan
from sparkfleet.runner.slurm_launch import _culprit
from sparkfleet.slurm.job import render_job
from tests.test_dry_run import recording_inventory

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


@pytest.fixture
def rec(ops_root: Path, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """The recording lab inventory (every node command would be logged) with launcher: slurm."""
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    log = tmp_path / "received.log"
    recording_inventory(ops_root, log, answer=False)
    path = ops_root / "inventories" / "rec.yaml"
    data = yaml.safe_load(path.read_text())
    data.update(launcher="slurm", slurm={"conf": "/etc/slurm/slurm.conf", "partition": "sparks", "time": "02:00:00"})
    path.write_text(yaml.safe_dump(data))
    return ops_root, log


def _events(capsys) -> list[dict]:
    return [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]


def test_up_dry_run_shows_the_sbatch_and_the_job_script_and_submits_nothing(rec, capsys) -> None:
    ops, log = rec
    code = main(["up", "--profile", "dcp2", "--root", str(ops), "-i", "rec", "--dry-run", "--json"])
    seen = _events(capsys)
    assert code == 0, seen[-3:]
    assert not log.exists(), log.read_text()  # no node command ran, and no Slurm command either (no log there)
    sbatch = [e for e in seen if e["event"] == "would" and e["node"] == "slurm-controller"]
    assert [(e["what"], e["command"], e["env"]) for e in sbatch] == [
        ("list Slurm jobs named sparkfleet-dcp2", "squeue -h --name=sparkfleet-dcp2 -o '%i|%j|%T|%r|%N|%M|%k'",
         ["SLURM_CONF"]),
        ("cancel Slurm job(s) <ids of the Slurm jobs named sparkfleet-dcp2 with a run label>",
         "scancel '<ids of the Slurm jobs named sparkfleet-dcp2 with a run label>'", ["SLURM_CONF"]),
        ("submit Slurm job sparkfleet-dcp2", "sbatch --parsable", ["SLURM_CONF"])]
    run_id = next(e["run_id"] for e in seen if e["event"] == "run")
    spec = Spec(ops)
    inv = spec.inventory("rec")
    plan = make_plan(spec.profile("dcp2"), inv, spec.playbook("up"), ops, run_id=run_id)
    assert sbatch[-1]["stdin"] == render_job(plan.launches, inv, "dcp2", run_id).script
    launch = {e["step"]: e["summary"] for e in seen if e["event"] == "step" and e["status"] != "start"}
    assert launch["launch:workers"] == (
        "would submit Slurm job sparkfleet-dcp2 (sparkfleet.run=" + run_id + "): one task per node on reddie, "
        "asusi, bluey, spark4, starting rank 1 on asusi, rank 2 on bluey, rank 3 on spark4")
    assert launch["launch:head"] == "would wait for the Slurm job to start rank 0 on reddie"


def test_up_dry_run_prints_the_script_for_people(rec, capsys) -> None:
    ops, _ = rec
    assert main(["up", "--profile", "dcp2", "--root", str(ops), "-i", "rec", "--dry-run"]) == 0
    text = capsys.readouterr().out
    at = text.index("would run on slurm-controller:\n         sbatch --parsable\n       reading on stdin:\n")
    assert "         #SBATCH --job-name=sparkfleet-dcp2\n" in text[at:]


def test_down_dry_run_shows_the_scancel_and_the_container_proof(rec, capsys) -> None:
    ops, log = rec
    code = main(["down", "--profile", "dcp2", "--root", str(ops), "-i", "rec", "--dry-run", "--json"])
    seen = _events(capsys)
    assert code == 0, seen[-3:]
    assert not log.exists()
    what = [e["what"] for e in seen if e["event"] == "would"]
    assert what.index("cancel Slurm job(s) <ids of the Slurm jobs named sparkfleet-dcp2 with a run label>") < \
        what.index("list the lane's containers") < what.index("stop the lane's containers")


def test_down_keep_is_refused_for_a_slurm_lane(rec, capsys) -> None:
    ops, log = rec
    code = main(["down", "--profile", "dcp2", "--root", str(ops), "-i", "rec", "--keep", "--dry-run", "--json"])
    seen = _events(capsys)
    assert code == 1
    assert next(e for e in seen if e["event"] == "result")["reason"] == (
        "stop: down --keep cannot keep a Slurm lane's containers: cancelling its job makes each task's trap remove "
        "them (launcher: slurm); nothing was done")


# srun 22.05's lines when rank 1's task (on asusi, task 0 of the allocation) exits 3 and --kill-on-bad-exit
# ends the rest: the format the lab's srun printed (`srun: error: reddie: task 2: Exited with exit code 143`
# and the _step_signal line, seen for a scancel'd lane job), the exit code 3 chosen here
SRUN_LINES = ["0: some log line", "srun: error: asusi: task 0: Exited with exit code 3",
              "srun: launch/slurm: _step_signal: Terminating StepId=9.0",
              "srun: error: reddie: task 2: Exited with exit code 143",
              "srun: error: bluey: task 1: Exited with exit code 143"]


def test_the_task_that_failed_first_is_the_one_not_ended_by_a_signal() -> None:
    assert _culprit(SRUN_LINES)[:3] == ("asusi", "0", "3")
    # listed after a peer that Slurm ended: still the one that exited on its own
    assert _culprit([SRUN_LINES[3], SRUN_LINES[1]])[:3] == ("asusi", "0", "3")
    assert _culprit(SRUN_LINES[3:])[:3] == ("reddie", "2", "143")  # only signalled tasks: the first
    assert _culprit(["0: nothing from srun"]) is None


def test_drain_on_fail_is_refused_without_slurm(ops_root: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    code = main(["up", "--profile", "dcp2", "--root", str(ops_root), "-i", "lab", "--drain-on-fail", "--dry-run"])
    assert code == 2
    assert "--drain-on-fail drains nodes in Slurm: inventory 'lab' has launcher: ssh (nothing was done)" in \
        capsys.readouterr().err
