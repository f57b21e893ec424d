"""The lab's real Slurm (sim up --transport ssh --launcher slurm --docker daemon: Debian's slurm-wlm and munge,
and a real dockerd in every node, since a task waits on its container): srun reaches two lab nodes, `plan`
refuses a lane Slurm cannot take before anything is submitted, `up` runs the lane as one job and serves,
`status` shows it, `down` cancels only that job and proves no container remains, a pending job is cancelled
naming Slurm's reason, a rank killed while serving ends the job and its containers (and `watch` resubmits
it, standing down when scancel ends it), a rank dying at boot
fails `up` naming it, a container whose task died before its trap is removed by `up`, `restore` runs the
saved lane as a new job, `--drain-on-fail` drains the node that fails preflight (and nothing without it),
the four-Spark llama.cpp lane and the TensorFold lane each run as one job, and `sim down` leaves no process,
file or namespace.

SIMULATION: the sim engine stands in for vLLM inside the real containers. Needs root, slurm-wlm, docker.io."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from sparkfleet.cli.main import main
from sparkfleet.sim import dockerd
from sparkfleet.sim.daemon import alive_as
from tests.cli_run import LAB_NODES, container_log, lane_containers, record_of, result, run, step, steps
from tests.conftest import REPO, engram_copies

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("slurmctld") is None or bool(dockerd.missing()),
                                reason="the lab's Slurm needs root, slurm-wlm and docker.io")


@pytest.fixture(scope="module")
def slurm_lab(tmp_path_factory):
    from sparkfleet.sim import lab

    state = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        s = lab.up("lab", transport="ssh", launcher="slurm", docker="daemon")
        try:
            engram_copies(s)
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


# no fabric probe: it does not involve the launcher, and on a loaded 2-core machine a link can fail it
UP = ("up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models,count100", "--poll", "0.2",
      "--probe-seconds", "1", "--no-fabric-probe")
JOB = "sparkfleet-dcp2"


def _jobs(sim) -> list[dict[str, str]]:
    """Every job squeue lists (pending, running, completing), in sparkfleet's own squeue fields."""
    from sparkfleet.slurm.ops import JOB_FORMAT, parse_jobs

    r = _slurm(sim, "squeue", "-h", "-o", JOB_FORMAT)
    assert r.returncode == 0, r.stderr
    return parse_jobs(r.stdout)


def _bounded(what: str, ok, timeout_s: float = 60.0):  # noqa: ANN001 - a predicate
    deadline = time.monotonic() + timeout_s
    while True:
        got = ok()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} within {timeout_s:g} s"
        time.sleep(0.3)


def _no_lane_container(sim) -> bool:
    return lane_containers(sim, "dcp2") == {n: [] for n in LAB_NODES}


def test_up_dry_run_shows_the_sbatch_script_and_submits_nothing(slurm_lab, capsys) -> None:
    code, events = run(capsys, *UP, "--dry-run")
    assert code == 0, result(events)
    sbatch = [e for e in events if e["event"] == "would" and e.get("command") == "sbatch --parsable"]
    assert [e["node"] for e in sbatch] == ["slurm-controller"] and sbatch[0]["env"] == ["SLURM_CONF"]
    script = sbatch[0]["stdin"]
    assert "#SBATCH --job-name=sparkfleet-dcp2" in script.splitlines()
    assert "#SBATCH --nodelist=reddie,asusi,bluey,spark4" in script.splitlines()
    assert steps(events)["launch:workers"] == "ok" and "would submit Slurm job sparkfleet-dcp2" in \
        step(events, "launch:workers")["summary"]
    assert step(events, "launch:head")["summary"] == "would wait for the Slurm job to start rank 0 on reddie"
    # down --dry-run shows the scancel of what squeue would list, and cancels nothing
    code, events = run(capsys, "down", "--profile", "dcp2", "--inventory", "sim", "--dry-run")
    assert code == 0, result(events)
    assert any(e["event"] == "would" and e.get("command", "").startswith("scancel '<ids of the Slurm jobs named")
               for e in events), events
    assert _jobs(slurm_lab) == [] and _no_lane_container(slurm_lab)


def test_up_runs_the_lane_as_one_job_and_status_shows_it(slurm_lab, capsys) -> None:
    code, events = run(capsys, *UP)
    assert code == 0, result(events)
    rec = record_of(events)
    job = rec["data"]["slurm_job"]
    assert job["name"] == JOB and job["comment"] == f"sparkfleet.run={rec['run_id']}"
    assert job["nodes"] == ["reddie", "asusi", "bluey", "spark4"] and job["het"] is False
    assert step(events, "launch:workers")["summary"] == \
        f"Slurm job {job['job_id']} started rank 1 on asusi, rank 2 on bluey, rank 3 on spark4"
    assert step(events, "launch:head")["summary"] == f"Slurm job {job['job_id']} started rank 0 on reddie"
    assert steps(events)["gates"] == "ok"
    # Slurm's own view: one job of the lane's name and run label, running on the four nodes
    assert [(j["id"], j["name"], j["state"], j["comment"]) for j in _jobs(slurm_lab)] == [
        (job["job_id"], JOB, "RUNNING", job["comment"])]
    # the ranks' containers carry this run's label, one per node (started by the job's tasks)
    running = lane_containers(slurm_lab, "dcp2")
    assert {n: [(c["State"]["Status"], c["Config"]["Labels"]["sparkfleet.run"]) for c in cs]
            for n, cs in running.items()} == {n: [("running", rec["run_id"])] for n in LAB_NODES}
    code = main(["status", "--profile", "dcp2", "--inventory", "sim", "--json"])
    status = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [(j["id"], j["state"], j["nodes"]) for j in status["slurm_jobs"]] == [
        (job["job_id"], "RUNNING", "asusi,bluey,reddie,spark4")]
    assert sorted((r["node"], r["rank"], r["state"]) for r in status["containers"]) == [
        ("asusi", 1, "running"), ("bluey", 2, "running"), ("reddie", 0, "running"), ("spark4", 3, "running")]


def test_down_cancels_only_this_lanes_job_and_proves_no_container_remains(slurm_lab, capsys) -> None:
    """Two foreign jobs look like the lane's: its name without a run label, and a run label under another
    name. `down` cancels the lane's job only; both foreign jobs are left as they were."""
    lane = [j for j in _jobs(slurm_lab) if j["name"] == JOB]
    assert len(lane) == 1, "the lane of the previous test is up"
    foreign = []
    for name, comment in ((JOB, "someone else's"), ("sparkfleet-dcp2x", lane[0]["comment"])):
        r = _slurm(slurm_lab, "sbatch", "--parsable", f"--job-name={name}", f"--comment={comment}",
                   "--nodelist=station", "--output=/dev/null", "--wrap", "sleep 600")
        assert r.returncode == 0, r.stderr
        foreign.append(r.stdout.strip())
    try:
        code, events = run(capsys, "down", "--profile", "dcp2", "--inventory", "sim")
        assert code == 0, result(events)
        assert step(events, "stop")["summary"] == \
            f"cancelled Slurm job {lane[0]['id']}; no container of this lane on its nodes"
        assert sorted(j["id"] for j in _jobs(slurm_lab)) == sorted(foreign)
        assert _no_lane_container(slurm_lab)
    finally:
        _slurm(slurm_lab, "scancel", *foreign)
        _bounded("the foreign jobs end", lambda: _jobs(slurm_lab) == [])


def _no_ssh(d: dict) -> None:
    """Compute nodes without SSH: slurm.ssh false, and every node's SSH port one nothing listens on (the discard
    port), so an SSH connection the controller still tried would fail the run."""
    d["slurm"]["ssh"] = False
    for n in d["nodes"].values():
        n["ssh"]["port"] = 9


def _reached(sim, tmp_path: Path, reach: str) -> str:
    """The inventory that reaches the nodes so: the lab's own (`ssh`), or its copy without SSH (`srun`)."""
    return "sim" if reach == "ssh" else _inventory(sim, tmp_path, "nossh", _no_ssh)


@pytest.mark.parametrize("reach", ["ssh", "srun"])
def test_down_of_a_lane_whose_job_is_gone_removes_the_containers_left(slurm_lab, tmp_path, capsys, reach) -> None:
    """No job of the lane, but two of its containers (run by hand, with its labels): removed, and said so; with
    slurm.ssh: false (srun) through jobs of its own on the nodes."""
    inv = _reached(slurm_lab, tmp_path, reach)
    for node in ("asusi", "bluey"):
        made = slurm_lab.exec(node, ["docker", "run", "-d", "--name", f"left-{node}", "--label",
                                     "sparkfleet.profile=dcp2", "--label", "sparkfleet.run=20261202-000000-000000",
                                     "--entrypoint", "python3", "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2",
                                     "-c", "import time; time.sleep(600)"])
        assert made.returncode == 0, made.stderr
    code, events = run(capsys, "down", "--profile", "dcp2", "--inventory", inv)
    assert code == 0, result(events)
    assert step(events, "stop")["summary"] == ("no Slurm job of this lane, but 2 container(s) of the lane remained "
                                              "on asusi, bluey: removed 2 container(s) on asusi, bluey")
    assert _no_lane_container(slurm_lab)


def _step_jobs(sim) -> list[tuple[str, str]]:
    """(node, state) of every job srun made for a node command of its own (ended ones too, as slurmctld keeps
    them for MinJobAge)."""
    r = _slurm(sim, "squeue", "-h", "-t", "all", "--name=sparkfleet-step", "-o", "%N|%T")
    assert r.returncode == 0, r.stderr
    return [tuple(x.split("|")) for x in r.stdout.split()]


def test_without_ssh_to_the_nodes_up_status_and_down_go_through_srun(slurm_lab, tmp_path, capsys) -> None:
    """slurm.ssh: false. `up`'s preflight (facts, checks, the clock probe) runs each command as a one-task job of
    its own on its node, the lane as one job; `status` and `down` reach the containers as steps of that job
    (srun --overlap); `down` cancels it and proves no container remains. No SSH: every node's SSH port is
    closed, and every step that reaches a node is ok; the fabric probe says why it is not run."""
    inv = _inventory(slurm_lab, tmp_path, "nossh", _no_ssh)
    before = len(_step_jobs(slurm_lab))
    assert UP[-1] == "--no-fabric-probe"
    code, events = run(capsys, *UP[:4], inv, *UP[5:-1])
    assert code == 0, result(events)
    rec = record_of(events)
    probe = step(events, "fabric_probe")
    assert (probe["status"], probe["summary"]) == ("skip", (
        "compute nodes reached through srun (slurm.ssh: false): a node runs one command job at a time, and the "
        "probe needs a server and a driver there at once; the links are not judged"))
    assert {k: v for k, v in steps(events).items() if k in ("facts", "check", "probe", "gates")} == {
        "facts": "ok", "check": "warn", "probe": "ok", "gates": "ok"}  # warn: as over SSH, below
    job = rec["data"]["slurm_job"]
    lane = [j for j in _jobs(slurm_lab) if j["name"] != "sparkfleet-step"]
    assert [(j["id"], j["state"]) for j in lane] == [(job["job_id"], "RUNNING")]
    made = _step_jobs(slurm_lab)[before:] if before else _step_jobs(slurm_lab)
    assert {n for n, _ in made} == set(LAB_NODES), made  # preflight's commands, on every node
    code = main(["status", "--profile", "dcp2", "--inventory", inv, "--json"])
    status = json.loads(capsys.readouterr().out)
    assert code == 0, status
    assert sorted((r["node"], r["rank"], r["state"]) for r in status["containers"]) == [
        ("asusi", 1, "running"), ("bluey", 2, "running"), ("reddie", 0, "running"), ("spark4", 3, "running")]
    # the same checks, the same verdicts, whichever way the nodes are reached
    verdicts = {}
    for way in ("sim", inv):
        assert main(["check", "--profile", "dcp2", "--inventory", way, "--json"]) in (0, 1)
        verdicts[way] = sorted((f.get("node") or "", f["check"], f["status"])
                               for f in json.loads(capsys.readouterr().out)["findings"])
    assert verdicts[inv] == verdicts["sim"] and ("reddie", "fabric", "warn") in verdicts[inv]
    code, events = run(capsys, "down", "--profile", "dcp2", "--inventory", inv)
    assert code == 0, result(events)
    assert step(events, "stop")["summary"] == \
        f"cancelled Slurm job {job['job_id']}; no container of this lane on its nodes"
    _bounded("no job of the lane", lambda: [j for j in _jobs(slurm_lab) if j["name"] == JOB] == [])
    assert _no_lane_container(slurm_lab)


def test_a_job_pending_past_the_bound_is_cancelled_naming_slurms_reason(slurm_lab, tmp_path, capsys) -> None:
    """spark4 drained: the lane's job cannot start and stays pending; past slurm.pending_s `up` cancels it and
    fails with Slurm's reason; nothing was started and no job is left."""
    inv = _inventory(slurm_lab, tmp_path, "pending", lambda d: d["slurm"].update(pending_s=3))
    r = _slurm(slurm_lab, "scontrol", "update", "NodeName=spark4", "State=DRAIN", "Reason=sparkfleet test")
    assert r.returncode == 0, r.stderr
    try:
        code, events = run(capsys, *UP[:4], inv, *UP[5:])
        assert code == 1, result(events)
        summary = step(events, "launch:workers")["summary"]
        assert summary.startswith("Slurm job ") and summary.endswith(
            " still pending after 3 s (slurm.pending_s), Slurm's reason: ReqNodeNotAvail, UnavailableNodes:spark4; "
            "the job was cancelled, nothing was started"), summary
        assert _jobs(slurm_lab) == [] and _no_lane_container(slurm_lab)
    finally:
        _slurm(slurm_lab, "scontrol", "update", "NodeName=spark4", "State=RESUME")


def test_sigterm_while_the_job_is_pending_cancels_it(slurm_lab, tmp_path) -> None:
    """`kill` of an `up` whose job waits for a drained node: the run's job (no container of it exists yet) is
    cancelled, found by its name and run label, and `up` exits 143 leaving no job and no container."""
    inv = _inventory(slurm_lab, tmp_path, "wait", lambda d: d["slurm"].update(pending_s=300))
    assert _slurm(slurm_lab, "scontrol", "update", "NodeName=spark4", "State=DRAIN", "Reason=sparkfleet test").\
        returncode == 0
    log = tmp_path / "up.log"
    up = subprocess.Popen([sys.executable, "-m", "sparkfleet.cli.main", *UP[:4], inv, *UP[5:], "--json"],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, stdout=log.open("w"),
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _bounded("the lane's job is pending", lambda: [j for j in _jobs(slurm_lab) if j["name"] == JOB
                                                       and j["state"] == "PENDING"], 120)
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=120) == 143, log.read_text()[-2000:]
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        _slurm(slurm_lab, "scontrol", "update", "NodeName=spark4", "State=RESUME")
    res = result([json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")])
    assert (res["outcome"], res["reason"]) == ("interrupted", "terminated (SIGTERM); every rank of this launch was "
                                                              "stopped")
    assert _jobs(slurm_lab) == [] and _no_lane_container(slurm_lab)


def test_a_rank_killed_while_serving_ends_the_job_and_its_containers(slurm_lab, capsys) -> None:
    """asusi's engine crashes while the lane serves: its task exits with the container's code, srun's
    --kill-on-bad-exit ends the other tasks, and every task's trap removes its container: no job, no container."""
    code, events = run(capsys, *UP)
    assert code == 0, result(events)
    job = record_of(events)["data"]["slurm_job"]
    assert main(["sim", "fault", "asusi", "serve-crash"]) == 0
    capsys.readouterr()
    try:
        _bounded("the job ends", lambda: _jobs(slurm_lab) == [])
        _bounded("every container is gone", lambda: _no_lane_container(slurm_lab))
    finally:
        slurm_lab.heal("asusi")  # the fault is spent (it crashes one launch), but the sim keeps it on until healed
    # as written: the tasks' lines hold tqdm's \r redraws, which a text read would turn into line ends
    out = (slurm_lab.root("asusi") / "tmp" / f"{JOB}-{job['job_id']}.out").read_bytes().decode(errors="replace")
    assert "srun: error: asusi: task 0: Exited with exit code" in out, out[-2000:]
    # no container is left for `logs` to read: it says so and names --job, which reads that output on asusi
    assert main(["logs", "--profile", "dcp2", "--inventory", "sim"]) == 2
    assert "`sparkfleet logs --profile dcp2 --job` prints the job's output" in capsys.readouterr().err
    assert main(["logs", "--profile", "dcp2", "--inventory", "sim", "--job", "--tail", "0", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {(x["job"], x["node"]) for x in lines} == {(job["job_id"], "asusi")}
    assert out.endswith("\n") and [x["line"] for x in lines] == out[:-1].split("\n")
    code, events = run(capsys, "down", "--profile", "dcp2", "--inventory", "sim")
    assert code == 0 and step(events, "stop")["summary"] == \
        "no Slurm job of this lane; no container of this lane on its nodes"


@pytest.mark.parametrize("reach", ["ssh", "srun"])
def test_watch_resubmits_the_job_a_killed_rank_ended_and_stands_down_when_scancel_ends_it(slurm_lab, tmp_path, capsys,
                                                                                         reach) -> None:
    """watch over a Slurm lane: asusi's engine crashes while serving, which ends the job and every container;
    watch restarts the group within its budget by resubmitting the job (the up playbook): a new job id, the
    old job gone, every rank's container of the new run, the lane answering again, one restart spent. Then an
    admin's scancel of the new job leaves no container either, but Slurm says CANCELLED: watch stands down
    and restarts nothing. With slurm.ssh: false (srun) every probe and the restart's preflight reach the nodes
    through Slurm: steps of the lane's job while it runs, jobs of their own once it has ended."""
    from tests.watchproc import FAST, WatchProc

    inv = _reached(slurm_lab, tmp_path, reach)
    code, events = run(capsys, *UP[:4], inv, *UP[5:])
    assert code == 0, result(events)
    old = record_of(events)["data"]["slurm_job"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    w = WatchProc(["--profile", "dcp2", "--inventory", inv, *FAST, "--max-restarts", "2", "--gates",
                   "models,count100", "--no-fabric-probe"], env)
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        assert main(["sim", "fault", "asusi", "serve-crash"]) == 0
        capsys.readouterr()
        failure = w.event("watch.failure")  # the fault acts once (not --sticky): the restart's launch does not crash
        served = w.event("watch.serving")
        after = w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "the lane answering again")
        new = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{served['run_id']}.json").read_text())
        job = new["data"]["slurm_job"]
        # Slurm's own view: only the new job, of the restart's run, running; the old one is gone
        assert job["job_id"] != old["job_id"]
        assert [(j["id"], j["name"], j["state"], j["comment"]) for j in _jobs(slurm_lab) if j["name"] == JOB] == [
            (job["job_id"], JOB, "RUNNING", f"sparkfleet.run={served['run_id']}")]
        running = lane_containers(slurm_lab, "dcp2")
        assert {n: [(c["State"]["Status"], c["Config"]["Labels"]["sparkfleet.run"]) for c in cs]
                for n, cs in running.items()} == {n: [("running", served["run_id"])] for n in LAB_NODES}
        status = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "watch" / "dcp2.json").read_text())
        assert status["budget_left"] == 1 and sum(status["restarts"].values()) == 1
        # an admin cancels the lane's job: no container is left, as after a crash, but Slurm says CANCELLED
        assert _slurm(slurm_lab, "scancel", job["job_id"]).returncode == 0
        down = w.event("watch.stand-down")
        assert w.wait() == 0
    finally:
        w.stop()
        slurm_lab.heal("asusi")  # spent, but on until healed
        gone, events = run(capsys, "down", "--profile", "dcp2", "--inventory", inv)  # whatever a failure left
        assert gone == 0, result(events)
    assert after["t"] > served["t"] and new["outcome"] == "ok" and new["playbook"] == "up"
    assert steps([{"event": "step", **s} for s in new["steps"]])["gates"] == "ok"
    incident = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{failure['record']}.json").read_text())
    assert incident["data"]["restart"]["run_id"] == served["run_id"] and incident["outcome"] == "ok"
    # job-ended: every container was gone by the probe; rank-*: a probe caught the ranks while the job's traps
    # were removing them. Either way Slurm was asked how the job ended before watch acted.
    assert failure["reason"] in ("job-ended", "rank-exited", "rank-vanished"), failure
    assert (incident["data"]["slurm_job"]["job_id"], incident["data"]["slurm_job"]["state"]) == \
        (old["job_id"], "FAILED")
    assert any("srun: error: asusi: task 0: Exited with exit code" in x
               for x in incident["data"]["last_log_lines"][f"slurm job {old['job_id']}"]), incident["data"]
    assert down["text"].startswith(f"stood down: Slurm job {job['job_id']} CANCELLED"), down["text"]
    assert [e for e in w.events if e["event"] == "run" and e["t"] > served["t"]] == []  # nothing restarted
    _bounded("no job left (a probe's own job ends with its command)", lambda: _jobs(slurm_lab) == [])
    assert _no_lane_container(slurm_lab)


def test_watching_a_restore_point_of_a_slurm_lane_restarts_it_as_a_new_job_through_restore(slurm_lab,
                                                                                             capsys) -> None:
    """watch --restore over a Slurm lane: asusi's engine crashes while serving, which ends the job; the
    restart is the restore playbook (every pin checked against the fleet first), and it runs the point's
    launches as a new job of the restart's own run; the lane answers again."""
    from tests.watchproc import FAST, WatchProc

    code, events = run(capsys, *UP, "--save-as", "slurmwatch")
    assert code == 0, result(events)
    old = record_of(events)["data"]["slurm_job"]
    w = WatchProc(["--restore", "slurmwatch", "--inventory", "sim", *FAST, "--gates", "models,count100"],
                  {**os.environ, "PYTHONPATH": str(REPO)})
    try:
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
        assert main(["sim", "fault", "asusi", "serve-crash"]) == 0
        capsys.readouterr()
        served = w.event("watch.serving")
        w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"] and e["t"] > served["t"],
                   "the lane answering again")
        rec = json.loads((Path(os.environ["SPARKFLEET_STATE"]) / "runs" / f"{served['run_id']}.json").read_text())
        job = _one_job_serving(slurm_lab, "dcp2", rec)
        w.signal(signal.SIGTERM)
        assert w.wait() == 0
    finally:
        w.stop()
        slurm_lab.heal("asusi")
        gone, events = run(capsys, "down", "--profile", "dcp2", "--inventory", "sim")
        assert gone == 0, result(events)
    assert (rec["playbook"], rec["outcome"], rec["restored_from"]) == ("restore", "ok", "slurmwatch")
    assert step([{"event": "step", **x} for x in rec["steps"]], "pins")["summary"] == \
        "every pin of 'slurmwatch' matches the fleet"
    assert job["job_id"] != old["job_id"] and job["comment"] == f"sparkfleet.run={served['run_id']}"
    _bounded("no job left", lambda: _jobs(slurm_lab) == [])
    assert _no_lane_container(slurm_lab)


def test_a_rank_dying_at_boot_fails_up_naming_it_and_leaves_no_job(slurm_lab, capsys) -> None:
    """asusi's engine logs a CUDA error and exits during the boot: `up` fails naming rank 1 on asusi, and the
    job (ended by --kill-on-bad-exit, or cancelled) and every container of the lane are gone."""
    slurm_lab.fault("asusi", "engine-fatal")
    try:
        code, events = run(capsys, *UP)
        assert code == 1, result(events)
        reason = result(events)["reason"]
        assert reason.startswith("wait_ready: rank 1 ") and "asusi" in reason, reason
        job = record_of(events)["data"]["slurm_job"]
        _bounded("the job ends", lambda: _jobs(slurm_lab) == [])
        _bounded("every container is gone", lambda: _no_lane_container(slurm_lab))
        out = (slurm_lab.root("asusi") / "tmp" / f"{JOB}-{job['job_id']}.out").read_text()
        assert "sparkfleet: rank 1's container sf-dcp2-r1 ended with code" in out, out[-2000:]
    finally:
        slurm_lab.heal("asusi")


def test_a_container_whose_task_died_before_its_trap_is_removed_by_up(slurm_lab, capsys) -> None:
    """bluey's task is SIGKILLed while the lane boots (as slurmd kills a task whose trap outlives KillWait):
    its trap never runs, so its container outlives the job that --kill-on-bad-exit ends. `up` fails and removes
    what the job left itself: no container of the lane remains when it returns, with nothing waited for."""
    slurm_lab.fault("reddie", "slow-boot", factor=100)  # the head boots slowly: up still waits when bluey dies
    killed: list[str] = []

    def kill_blueys_task() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            if any(c["State"]["Running"] for c in lane_containers(slurm_lab, "dcp2", ("bluey",))["bluey"]):
                # the task's shells, then their children (`docker logs -f`, `docker wait`), as slurmd kills a step's
                # processes; the shell first, so it cannot see its child go and run its trap. The task's argv is its
                # script ([S]: not this command's own); srun's is not a bash
                r = slurm_lab.exec("bluey", ["sh", "-c", "for p in $(pgrep -f [S]LURMD_NODENAME); do "
                                             "[ \"$(cat /proc/$p/comm)\" = bash ] || continue; c=$(pgrep -P $p); "
                                             "kill -9 $p && echo $p; kill -9 $c; done"])
                killed.append(r.stdout.decode().strip() or f"none ({r.returncode}: {r.stderr.decode().strip()})")
            time.sleep(0.2)

    killer = threading.Thread(target=kill_blueys_task)
    killer.start()
    try:
        code, events = run(capsys, *UP)
    finally:
        killer.join()
        slurm_lab.heal("reddie")
    assert killed and killed[0][:1].isdigit(), (killed, result(events))
    assert code == 1 and result(events)["reason"].startswith("wait_ready: "), result(events)
    assert _no_lane_container(slurm_lab), lane_containers(slurm_lab, "dcp2")
    _bounded("the job ends", lambda: _jobs(slurm_lab) == [])


def test_the_station_heading_the_sparks_runs_as_one_heterogeneous_job(slurm_lab, capsys) -> None:
    """llamacpp-lab-station: a GB300 head over four GB10 rpc-servers, through the real llama.cpp. The head's
    class differs, so the job is heterogeneous (the head's component, then the workers'); the head's task waits
    until every rpc-server accepts, and the lane serves; `down` leaves no job and no container."""
    _llama_rpc_or_skip()
    lane, nodes = "llamacpp-lab-station", (*LAB_NODES, "station")
    try:
        code, events = run(capsys, "up", "--profile", lane, "--inventory", "sim", "--no-fabric-probe", "--poll", "0.2",
                           "--probe-seconds", "1")
        assert code == 0, result(events)
        job = record_of(events)["data"]["slurm_job"]
        assert job["het"] is True and job["nodes"] == ["station", *LAB_NODES]
        # squeue lists a heterogeneous job once per component: the head's (+0) on the Station, the workers' (+1)
        assert sorted((j["id"], j["nodes"]) for j in _jobs(slurm_lab)) == [
            (f"{job['job_id']}+0", "station"), (f"{job['job_id']}+1", "asusi,bluey,reddie,spark4")]
        assert {n: [c["State"]["Status"] for c in cs] for n, cs in lane_containers(slurm_lab, lane, nodes).items()} \
            == {n: ["running"] for n in nodes}
    finally:
        code, events = run(capsys, "down", "--profile", lane, "--inventory", "sim")
    assert code == 0, result(events)
    assert _jobs(slurm_lab) == [] and lane_containers(slurm_lab, lane, nodes) == {n: [] for n in nodes}


def _llama_rpc_or_skip() -> None:
    """llama.cpp's RPC binaries: a skip without them, a failure under CI (which builds them first, .ci/run)."""
    from sparkfleet.sim import llamabuild

    if llamabuild.bin_dir() is None:
        why = f"llama.cpp's RPC binaries are not built ({llamabuild.cache_dir()}): run `make llama-rpc` once"
        if os.environ.get("CI"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)


def test_the_four_spark_llamacpp_lane_runs_as_one_job(slurm_lab, capsys) -> None:
    """llamacpp-lab: llama-server on reddie over ggml-rpc-server on asusi, bluey and spark4, the real llama.cpp,
    as one (homogeneous) job: the head's task waits until every rpc-server accepts, every worker gets layers
    over RPC, the lane passes its gates; `down` leaves no job and no container."""
    _llama_rpc_or_skip()
    lane = "llamacpp-lab"
    try:
        code, events = run(capsys, "up", "--profile", lane, "--inventory", "sim", "--no-fabric-probe", "--poll", "0.2",
                           "--probe-seconds", "1")
        assert code == 0, (result(events), [(f["check"], f.get("node"), f["message"]) for e in events
                                            if e["event"] == "findings" for f in e["findings"] if f["status"] == "fail"])
        rec = record_of(events)
        job = rec["data"]["slurm_job"]
        assert job["het"] is False and job["nodes"] == list(LAB_NODES) and steps(events)["gates"] == "ok"
        assert [(j["id"], j["name"], j["state"], j["nodes"], j["comment"]) for j in _jobs(slurm_lab)] == [
            (job["job_id"], f"sparkfleet-{lane}", "RUNNING", "asusi,bluey,reddie,spark4",
             f"sparkfleet.run={rec['run_id']}")]
        containers = lane_containers(slurm_lab, lane)
        assert {n: [(c["State"]["Status"], c["Config"]["Labels"]["sparkfleet.run"]) for c in cs]
                for n, cs in containers.items()} == {n: [("running", rec["run_id"])] for n in LAB_NODES}
        # llama.cpp's own account of where the weights went: a model buffer on each worker's RPC device
        log = container_log(slurm_lab, "reddie", containers["reddie"][0]["Id"])
        fabric = {n: slurm_lab.inventory().nodes[n].fabric_ip for n in LAB_NODES[1:]}
        buffers = re.findall(r"load_tensors: +(\S+) model buffer size = +([\d.]+) MiB", log)
        offloaded = {n: sum(float(m) for dev, m in buffers if f"{ip}:50052" in dev) for n, ip in fabric.items()}
        assert all(mib > 0 for mib in offloaded.values()), buffers
    finally:
        code, events = run(capsys, "down", "--profile", lane, "--inventory", "sim")
    assert code == 0, result(events)
    assert _jobs(slurm_lab) == [] and lane_containers(slurm_lab, lane) == {n: [] for n in LAB_NODES}


def _sinfo(sim, node: str) -> str:
    r = _slurm(sim, "sinfo", "-h", "-N", "-n", node, "-p", "lab", "-o", "%T|%E")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _one_job_serving(sim, lane: str, rec: dict) -> dict:
    """The run's job (returned): the only one Slurm lists, running; on every lab node one running container
    of the run."""
    job = rec["data"]["slurm_job"]
    assert [(j["id"], j["state"]) for j in _jobs(sim)] == [(job["job_id"], "RUNNING")]
    assert {n: [(c["State"]["Status"], c["Config"]["Labels"]["sparkfleet.run"]) for c in cs]
            for n, cs in lane_containers(sim, lane).items()} == {n: [("running", rec["run_id"])] for n in LAB_NODES}
    return job


@pytest.mark.parametrize("reach", ["ssh", "srun"])
def test_restore_brings_back_the_lane_as_a_new_job_with_every_pin_checked(slurm_lab, tmp_path, capsys,
                                                                          reach) -> None:
    """`up --save-as` through Slurm records the launches; after `down`, `restore` checks every pin against the
    fleet (as on any lane) and runs the lane again as one new job of the restore's own run, and `logs --job`
    reads that job's output on its batch host. With slurm.ssh: false (srun) the pins are read, and the output,
    through steps of the job (no SSH port is open)."""
    inv = _reached(slurm_lab, tmp_path, reach)
    point = f"slurmprod-{reach}"
    code, events = run(capsys, *UP[:4], inv, *UP[5:], "--save-as", point)
    assert code == 0, result(events)
    first = record_of(events)["data"]["slurm_job"]["job_id"]
    code, events = run(capsys, "down", "--profile", "dcp2", "--inventory", inv)
    assert code == 0, result(events)
    _bounded("no job", lambda: _jobs(slurm_lab) == [])  # through srun: down's own command jobs end, too
    try:
        code, events = run(capsys, "restore", point, "--inventory", inv, *UP[5:-1])  # restore probes no fabric
        assert code == 0, result(events)
        assert step(events, "pins")["summary"] == f"every pin of '{point}' matches the fleet"
        rec = record_of(events)
        job = _one_job_serving(slurm_lab, "dcp2", rec)
        assert job["job_id"] != first and job["comment"] == f"sparkfleet.run={rec['run_id']}"
        assert main(["logs", "--profile", "dcp2", "--inventory", inv, "--job", "--tail", "0", "--json"]) == 0
        lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        (host,) = {x["node"] for x in lines}  # the job's batch host (Slurm's choice), one
        assert {x["job"] for x in lines} == {job["job_id"]} and host in LAB_NODES
        out = (slurm_lab.root(host) / "tmp" / f"{JOB}-{job['job_id']}.out").read_bytes().decode(
            errors="replace")  # read after logs: the file only grows
        assert [x["line"] for x in lines] == out.split("\n")[:len(lines)] and len(lines) > 0
    finally:
        code, events = run(capsys, "down", "--profile", "dcp2", "--inventory", inv)
    assert code == 0 and _no_lane_container(slurm_lab), result(events)
    _bounded("no job", lambda: _jobs(slurm_lab) == [])


def test_the_tensorfold_lane_runs_as_one_job(slurm_lab, capsys) -> None:
    """tf1017: TensorFold built on every rank over SSH (`build`: real git, the sim's Zig), then run through
    Slurm as one job of four tasks, serving; `down` leaves no job and no container."""
    assert main(["build", "--profile", "tf1017", "--inventory", "sim", "--json"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    try:
        code, events = run(capsys, "up", "--profile", "tf1017", *UP[3:])
        assert code == 0, result(events)
        job = _one_job_serving(slurm_lab, "tf1017", record_of(events))
        assert job["name"] == "sparkfleet-tf1017" and job["het"] is False
        assert job["nodes"][0] == "reddie" and sorted(job["nodes"]) == sorted(LAB_NODES)  # the head's first
    finally:
        code, events = run(capsys, "down", "--profile", "tf1017", "--inventory", "sim")
    assert code == 0, result(events)
    assert _jobs(slurm_lab) == [] and lane_containers(slurm_lab, "tf1017") == {n: [] for n in LAB_NODES}


@pytest.mark.parametrize("reach", ["ssh", "srun"])
def test_a_preflight_failure_drains_nothing_by_default_and_the_node_with_the_flag(slurm_lab, tmp_path, capsys,
                                                                                   reach) -> None:
    """bluey's memory below the rank floor fails `check`: plain `up` leaves bluey idle in Slurm; with
    --drain-on-fail bluey is drained with the finding as Slurm's reason. No job is submitted either way; with
    slurm.ssh: false (srun) the facts that failed were read through command jobs of their own."""
    inv = _reached(slurm_lab, tmp_path, reach)
    up = (*UP[:4], inv, *UP[5:])
    slurm_lab.fault("bluey", "low-memory")
    try:
        code, events = run(capsys, *up)
        assert code == 1 and steps(events)["check"] == "fail", result(events)
        # through srun a command job of up's may still be completing on bluey (sinfo: completing/mixed)
        _bounded("bluey idle and not drained", lambda: _sinfo(slurm_lab, "bluey") == "idle|none")
        code, events = run(capsys, *up, "--drain-on-fail")
        assert code == 1 and steps(events)["check"] == "fail", result(events)
        reason = record_of(events)["data"]["slurm_drained"]
        assert list(reason) == ["bluey"] and reason["bluey"].startswith("sparkfleet ")
        _bounded("bluey drained, the finding its reason",
                 lambda: _sinfo(slurm_lab, "bluey") == f"drained|{reason['bluey']}")
        assert [j for j in _jobs(slurm_lab) if j["name"] != "sparkfleet-step"] == [] and \
            _no_lane_container(slurm_lab)
    finally:
        slurm_lab.heal("bluey")
        _slurm(slurm_lab, "scontrol", "update", "NodeName=bluey", "State=RESUME")


def test_down_leaves_no_process_file_or_namespace(slurm_lab) -> None:
    from sparkfleet.sim import lab, netlab, paths
    from sparkfleet.sim import slurm as sim_slurm

    pids = slurm_lab.manifest["slurm"]["pids"]
    assert lab.down() is True
    for name, pid in pids.items():
        assert not alive_as(pid, name), f"{name} ({pid}) still runs"
    alive = subprocess.run(["pgrep", "-x", "slurmd|slurmctld|munged|slurmstepd"], capture_output=True, text=True)
    assert alive.stdout == ""
    assert not Path(sim_slurm.MUNGE_SOCKET_DIR).exists() and not paths.sim_dir().exists()
    assert netlab.ours() == []
