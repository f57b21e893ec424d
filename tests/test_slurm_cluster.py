"""Parsers of what the lab's real Slurm 22.05 printed (tests/fixtures/slurm/, captured from `sim up --launcher
slurm`), and the refusals made from them."""

from __future__ import annotations

from pathlib import Path

from sparkfleet.opsdir import Spec
from sparkfleet.schema.inventory import Slurm
from sparkfleet.slurm import cluster, ops

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
    # three jobs: two named as the lane (runs r1, r2), one of another name carrying a lane's run label
    jobs = ops.parse_jobs((FIX / "squeue-all.txt").read_text())
    assert ops.ours(jobs, "sparkfleet-dcp2", "sparkfleet.run=") == ["1", "2"]
    assert ops.ours(jobs, "sparkfleet-dcp2", "sparkfleet.run=r2") == ["2"]
    assert ops.ours(ops.parse_jobs("7+0|sparkfleet-x|sparkfleet.run=a|RUNNING|None\n"
                                   "7+1|sparkfleet-x|sparkfleet.run=a|RUNNING|None\n"), "sparkfleet-x",
                    "sparkfleet.run=a") == ["7"]  # a hetjob's components are one job
    assert [ops.parse_submitted(x) for x in (FIX / "sbatch.txt").read_text().splitlines()] == ["1", "2", "3"]
