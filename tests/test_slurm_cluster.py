"""Parsers of what the lab's real Slurm 22.05 printed (tests/fixtures/slurm/, captured from `sim up --launcher
slurm`), and the refusals made from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfleet.opsdir import Spec
from sparkfleet.schema.inventory import Slurm
from sparkfleet.slurm import cluster, ops

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

FIX = Path(__file__).parent / "fixtures" / "slurm"
LANE = ["reddie", "asusi", "bluey", "spark4"]


def _parts() -> dict:
    return cluster.parse_partitions((FIX / "partitions.txt").read_text())


def _nodes() -> dict:
    return cluster.parse_nodes((FIX / "nodes.txt").read_text())


def test_partitions_and_nodes_parsed() -> None:
    assert _parts() == {"lab": cluster.Partition("lab", True, "UP", None),
                        "restricted": cluster.Partition("restricted", False, "UP", ["sim"])}
    nodes = _nodes()
    assert sorted(nodes) == ["asusi", "bluey", "reddie", "spark4", "station"]
    assert nodes["asusi"] == cluster.SlurmNode("asusi", "IDLE", ["lab", "restricted"])


def test_a_value_with_spaces_stays_whole() -> None:
    f = cluster.fields((FIX / "nodes.txt").read_text().splitlines()[0])
    assert f["OS"] == "Linux 6.18.44-fc-v857 #1 SMP PREEMPT_DYNAMIC @0" and f["RealMemory"] == "1"


def _inv(repo_spec: Spec, **slurm):
    return repo_spec.inventory("lab").model_copy(update={"launcher": "slurm", "slurm": Slurm(**slurm)})


def test_refusals(repo_spec: Spec) -> None:
    parts, nodes = _parts(), _nodes()
    assert cluster.refusals(_inv(repo_spec), LANE, parts, nodes) == []  # the default partition takes it
    no_default = {k: v for k, v in parts.items() if k != "lab"}
    [f] = cluster.refusals(_inv(repo_spec), LANE, no_default, nodes)
    assert (f.check, f.message) == ("slurm-partition", "no partition: slurm.partition is not set and the cluster "
                                    "has no default partition (partitions: restricted)")
    [f] = cluster.refusals(_inv(repo_spec, partition="lab", account="x"), LANE,
                           {"lab": cluster.Partition("lab", True, "UP", None, ["x"])}, nodes)
    assert f.message == "account 'x' may not use partition 'lab' (it denies it)"
    del nodes["bluey"]
    nodes["spark4"] = cluster.SlurmNode("spark4", "IDLE", ["restricted"])
    assert [(f.node, f.message) for f in cluster.refusals(_inv(repo_spec), LANE, parts, nodes)] == [
        ("bluey", "node bluey is not a node of this Slurm cluster (scontrol knows: asusi, reddie, spark4, station)"),
        ("spark4", "node spark4 is not in partition 'lab' (it is in: restricted)")]


def test_squeue_keeps_only_this_lanes_jobs() -> None:
    # four jobs, as the lab's squeue printed them in sparkfleet's format (ops.JOB_FORMAT): two of the lane's name
    # with run labels (r1, r2), one of another name with a run label, and one of the lane's name whose comment is
    # someone else's (and holds the separator: the comment is the last field, kept whole)
    jobs = ops.parse_jobs((FIX / "squeue-all.txt").read_text())
    assert [(j["id"], j["name"], j["state"], j["comment"]) for j in jobs] == [
        ("4", "sparkfleet-dcp2", "RUNNING", "someone else's|job"), ("1", "sparkfleet-dcp2", "PENDING", "sparkfleet.run=r1"),
        ("2", "sparkfleet-dcp2", "PENDING", "sparkfleet.run=r2"), ("3", "other", "PENDING", "sparkfleet.run=r3")]
    assert jobs[1]["reason"] == "Job's account not known, so it can't use this partition (restricted allows sim)"
    assert jobs[0]["nodes"] == "station" and jobs[0]["time"] == "0:01"
    assert ops.ours(jobs, "sparkfleet-dcp2", "sparkfleet.run=") == ["1", "2"]
    assert ops.ours(jobs, "sparkfleet-dcp2", "sparkfleet.run=r2") == ["2"]
    assert ops.ours(jobs, None, "sparkfleet.run=") == ["1", "2"]  # every lane's: names sparkfleet-*, labelled
    assert ops.ours(ops.parse_jobs("7+0|sparkfleet-x|RUNNING|None|reddie|0:01|sparkfleet.run=a\n"
                                   "7+1|sparkfleet-x|RUNNING|None|asusi|0:01|sparkfleet.run=a\n"), "sparkfleet-x",
                    "sparkfleet.run=a") == ["7"]  # a hetjob's components are one job


def test_scontrol_show_job_read_as_fields() -> None:
    running, cancelled = [ops.parse_job(x) for x in (FIX / "show-job.txt").read_text().splitlines()]
    assert (running["JobState"], running["BatchHost"], running["StdOut"]) == ("RUNNING", "station", "/dev/null")
    assert (cancelled["JobState"], cancelled["ExitCode"], cancelled["Reason"]) == ("CANCELLED", "0:15", "None")
    assert cancelled["Comment"] == "someone else's|job"
    assert ops.parse_job("slurm_load_jobs error: Invalid job id specified\n") == {}


def test_sbatch_parsable_prints_the_job_id() -> None:
    assert [ops.parse_submitted(x) for x in (FIX / "sbatch.txt").read_text().splitlines()] == ["1", "2", "3"]
