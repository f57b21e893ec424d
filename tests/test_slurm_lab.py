"""The lab's real Slurm (sim up --launcher slurm): srun reaches two lab nodes, `plan` refuses a lane Slurm
cannot take before anything is submitted, and `sim down` leaves no process, file or namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkfleet.cli.main import main

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("slurmctld") is None,
                                reason="the lab's Slurm needs root and slurm-wlm")


@pytest.fixture(scope="module")
def slurm_lab(tmp_path_factory):
    from sparkfleet.sim import lab

    state = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        s = lab.up("lab", transport="ssh", launcher="slurm")
        try:
            yield s
        finally:
            lab.down()


def _slurm(sim, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_CONF": sim.manifest["slurm"]["conf"]}
    return subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=60)


def test_srun_runs_on_two_lab_nodes(slurm_lab) -> None:
    r = _slurm(slurm_lab, "srun", "-N2", "-w", "reddie,asusi", "bash", "-c",
               "echo $(hostname) $SLURMD_NODENAME $SLURM_NODEID")
    assert r.returncode == 0, r.stderr
    # each task ran inside its node (its own hostname), node ids in Slurm's order of the node list
    assert sorted(r.stdout.split("\n")[:-1]) == ["asusi asusi 0", "reddie reddie 1"]


def test_status_names_the_slurm_conf(slurm_lab, capsys) -> None:
    assert main(["sim", "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    conf = Path(status["slurm"]["conf"])
    text = conf.read_text()
    assert "NodeName=reddie NodeHostname=reddie NodeAddr=10.78.0.11 CPUs=1 State=UNKNOWN" in text.splitlines()
    assert "ProctrackType=proctrack/linuxproc" in text and "TaskPlugin=task/none" in text
    inv = yaml.safe_load(Path(status["inventory"]).read_text())
    assert inv["launcher"] == "slurm" and inv["slurm"] == {"conf": str(conf), "partition": "lab"}


def _inventory(sim, tmp_path: Path, name: str, edit) -> str:
    data = yaml.safe_load(sim.inventory_path.read_text())
    edit(data)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _plan(inventory: str, capsys) -> tuple[int, dict]:
    code = main(["plan", "--profile", "dcp2", "--inventory", inventory, "--json"])
    got = capsys.readouterr()
    assert got.out, got.err
    return code, json.loads(got.out)


def _fails(plan: dict) -> list[tuple[str, str | None, str]]:
    return [(f["check"], f.get("node"), f["message"]) for f in plan["findings"] if f["status"] == "fail"]


def test_plan_takes_the_lane_slurm_can_run(slurm_lab, capsys) -> None:
    code, plan = _plan("sim", capsys)
    assert code == 0 and _fails(plan) == []


def test_plan_refuses_a_partition_slurm_does_not_have(slurm_lab, tmp_path, capsys) -> None:
    inv = _inventory(slurm_lab, tmp_path, "nopart", lambda d: d["slurm"].update(partition="gpu"))
    code, plan = _plan(inv, capsys)
    assert code == 2 and _fails(plan) == [("slurm-partition", None, "partition 'gpu' is not a partition of this "
                                          "cluster (partitions: lab, restricted)")]


def test_plan_refuses_an_account_the_partition_does_not_allow(slurm_lab, tmp_path, capsys) -> None:
    inv = _inventory(slurm_lab, tmp_path, "noacct",
                     lambda d: d["slurm"].update(partition="restricted", account="lab-b"))
    code, plan = _plan(inv, capsys)
    assert code == 2 and _fails(plan) == [("slurm-account", None, "account 'lab-b' may not use partition "
                                          "'restricted' (it allows sim)")]


def test_plan_refuses_a_node_slurm_does_not_know(slurm_lab, tmp_path, capsys) -> None:
    def rename(d: dict) -> None:  # the inventory calls spark4 by another name than Slurm's NodeName
        d["nodes"]["spark5"] = {**d["nodes"].pop("spark4"), "name": "spark5"}
        d["groups"] = {g: ["spark5" if n == "spark4" else n for n in ns] for g, ns in d["groups"].items()}

    code, plan = _plan(_inventory(slurm_lab, tmp_path, "nonode", rename), capsys)
    assert code == 2 and _fails(plan) == [("slurm-node", "spark5", "node spark5 is not a node of this Slurm "
                                          "cluster (scontrol knows: asusi, bluey, reddie, spark4, station)")]


def test_down_leaves_no_process_file_or_namespace(slurm_lab) -> None:
    from sparkfleet.sim import lab, netlab, paths
    from sparkfleet.sim import slurm as sim_slurm

    pids = slurm_lab.manifest["slurm"]["pids"]
    assert lab.down() is True
    for name, pid in pids.items():
        assert not sim_slurm._is(pid, name), f"{name} ({pid}) still runs"
    alive = subprocess.run(["pgrep", "-x", "slurmd|slurmctld|munged|slurmstepd"], capture_output=True, text=True)
    assert alive.stdout == ""
    assert not Path(sim_slurm.MUNGE_SOCKET_DIR).exists() and not paths.sim_dir().exists()
    assert netlab.ours() == []
