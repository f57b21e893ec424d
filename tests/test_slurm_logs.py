"""`logs --job` of a Slurm lane without a lab: the lane's newest job (squeue, ended ones too, only its name
with a run label; else a run record), its output file read on the lane's node that has it, complete lines
only (a line still being written is read once it is), and what the flag refuses."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkfleet.cli.main import main
from sparkfleet.slurm import output as jo
from sparkfleet.slurm.ops import JOB_FORMAT
from tests.test_dry_run import recording_inventory

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

JOB = "987650"  # a job id no real job here has: its output is /tmp/sparkfleet-dcp2-987650.out


def _sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def test_a_read_keeps_complete_lines_and_where_they_end(tmp_path: Path) -> None:
    f = tmp_path / "job.out"
    f.write_text("0: a\n1: b\n0: c\n")
    assert jo.parse_read(_sh(jo.read_command(str(f), None)).stdout) == (["0: a", "1: b", "0: c"], 15)
    assert jo.parse_read(_sh(jo.read_command(str(f), 2)).stdout) == (["1: b", "0: c"], 15)
    f.write_text("0: a\n1: b\n0: pa")  # task 0 is writing its line: not shown, read again from its start
    lines, offset = jo.parse_read(_sh(jo.read_command(str(f), None)).stdout)
    assert (lines, offset) == (["0: a", "1: b"], 10)
    with f.open("a") as w:
        w.write("rtial\n1: d")
    assert jo.complete(_sh(jo.new_command(str(f), offset)).stdout) == (["0: partial"], 11)
    f.write_text("")
    assert jo.parse_read(_sh(jo.read_command(str(f), 5)).stdout) == ([], 0)
    assert _sh(jo.read_command(str(tmp_path / "none"), 5)).returncode == jo.NO_FILE


@pytest.fixture
def lane(ops_root: Path, tmp_path: Path, monkeypatch):
    """The lab's nodes answering here (recording wrapper), launcher: slurm, and a `squeue` of the test's own
    on PATH that prints $TMP/squeue.txt."""
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    recording_inventory(ops_root, tmp_path / "received.log", answer=True)
    path = ops_root / "inventories" / "rec.yaml"
    data = yaml.safe_load(path.read_text())
    data.update(launcher="slurm", slurm={"conf": "/etc/slurm/slurm.conf", "partition": "sparks"})
    path.write_text(yaml.safe_dump(data))
    bin_dir = tmp_path / "ctl-bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/squeue.argv\ncat {tmp_path}/squeue.txt\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    out = Path(jo.output_path("sparkfleet-dcp2", JOB))
    out.write_text("0: [sim] serving\n1: [sim] serving\nsparkfleet: rank 1's container sf-dcp2-r1 ended with code 3\n"
                   "srun: error: asusi: task 1: Exited with exit code 3\n")
    yield ops_root, tmp_path
    out.unlink()


def _logs(ops: Path, capsys, *argv: str) -> tuple[int, list[dict], str]:
    code = main(["logs", "--profile", "dcp2", "--root", str(ops), "-i", "rec", "--job", "--json", *argv])
    got = capsys.readouterr()
    return code, [json.loads(x) for x in got.out.splitlines()], got.err


def test_the_newest_job_slurm_lists_for_the_lane(lane, capsys) -> None:
    ops, tmp = lane
    (tmp / "squeue.txt").write_text("\n".join([
        f"{JOB}|sparkfleet-dcp2|FAILED|NonZeroExitCode|asusi,bluey,reddie,spark4|0:40|sparkfleet.run=R1",
        "987655|sparkfleet-dcp2|RUNNING|None|station|0:10|someone else's"]) + "\n")  # no run label: not ours
    code, lines, said = _logs(ops, capsys, "--tail", "2")
    assert code == 0, said
    assert (tmp / "squeue.argv").read_text().split() == ["-h", "--name=sparkfleet-dcp2", "--states=all", "-o",
                                                         JOB_FORMAT]
    assert [x["line"] for x in lines] == ["sparkfleet: rank 1's container sf-dcp2-r1 ended with code 3",
                                          "srun: error: asusi: task 1: Exited with exit code 3"]
    assert {(x["job"], x["node"]) for x in lines} == {(JOB, "reddie")}  # every node here has /tmp: the first
    assert f"Slurm job {JOB}" in said and f"/tmp/sparkfleet-dcp2-{JOB}.out" in said


def test_a_job_slurm_forgot_is_found_in_the_newest_run_record(lane, capsys) -> None:
    ops, tmp = lane
    (tmp / "squeue.txt").write_text("")
    runs = tmp / "state" / "runs"
    runs.mkdir(parents=True)
    for run_id, job in (("20261205-000100-aaaaaa", "5"), ("20261205-000200-bbbbbb", JOB)):
        (runs / f"{run_id}.json").write_text(json.dumps({
            "run_id": run_id, "profile": "dcp2", "inventory": "rec", "data": {"slurm_job": {
                "job_id": job, "name": "sparkfleet-dcp2"}}}))
    code, lines, said = _logs(ops, capsys, "--tail", "0")
    assert code == 0, said
    assert len(lines) == 4 and lines[0]["line"] == "0: [sim] serving"
    assert "record 20261205-000200-bbbbbb" in said
    runs.joinpath("20261205-000200-bbbbbb.json").unlink()  # the older job's output is nowhere
    code, _, said = _logs(ops, capsys)
    assert code == 2 and "Slurm job 5's output /tmp/sparkfleet-dcp2-5.out is on none of the lane's nodes" in said


def test_job_logs_refused_where_they_cannot_apply(ops_root: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    recording_inventory(ops_root, tmp_path / "received.log", answer=False)
    base = ["logs", "--profile", "dcp2", "--root", str(ops_root), "-i", "rec", "--job"]
    assert main(base) == 2
    assert "logs --job reads a Slurm job's output: inventory 'rec' has launcher: ssh" in capsys.readouterr().err
    assert main([*base, "--rank", "1"]) == 2
    assert "--rank select containers" in capsys.readouterr().err
    assert not (tmp_path / "received.log").exists()
