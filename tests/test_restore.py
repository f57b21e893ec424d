"""`restore` on the simulated lab: the recorded launches verbatim, today's differences said, pins enforced.

THE LAB IS A SIMULATION (sparkfleet/sim): the runner, transports, facts helper, patch hashing, docker CLI
calls and the record are the real code. The lane is dcp2 (from a copy of the ops directory), so a restore
point pins image ids, resolved GID indexes, hostnames (and Engram copies and patch files where the lane
has them) on every rank. Patch-file and Engram-copy pins are not driven through the lab here: in local mode
the lab's node commands read host paths while `put` writes into the sandbox, so neither a pushed set nor a
copy's manifest can be read back on a node until the lab's node roots land (issue 11).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from sparkfleet.cli.main import main
from sparkfleet.root import sim_inventory_path
from sparkfleet.sim import lab
from tests import cli_run
from tests.cli_run import findings, result, run, step
from tests.conftest import copy_ops, engram_copies

FAST = ["--gates", "models", "--poll", "0.2", "--probe-seconds", "1"]
NODES = ("reddie", "asusi", "bluey", "spark4")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A sim lab, an ops root with the probe lane, the lane up and saved as restore point 'night'."""
    state = tmp_path_factory.mktemp("state")
    ops = copy_ops(tmp_path_factory.mktemp("ops"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        s = lab.up("lab")
        try:
            engram_copies(s)
            shutil.copy(sim_inventory_path(), ops / "inventories/sim.yaml")
            base = ["--inventory", "sim", "--root", str(ops)]
            code = main(["up", "--profile", "dcp2", *base, *FAST, "--save-as", "night", "--json"])
            assert code == 0
            yield s, ops, state
        finally:
            main(["down", "--profile", "dcp2", "--inventory", "sim", "--root", str(ops), "--json"])
            lab.down()






def point(state: Path) -> dict:
    return json.loads((state / "restore/night.json").read_text())


def lane_containers(sim) -> dict[str, list[tuple[str, str, str]]]:
    return {node: sorted((c["Id"], c["State"]["Status"], c["Config"]["Labels"]["sparkfleet.run"]) for c in cs)
            for node, cs in cli_run.lane_containers(sim, "dcp2", NODES).items()}


def run_record(state: Path, events: list[dict]) -> dict:
    return json.loads((state / "runs" / f"{result(events)['run_id']}.json").read_text())


def restore(capsys, ops: Path, *extra: str) -> tuple[int, list[dict]]:
    return run(capsys, "restore", "night", "--inventory", "sim", "--root", str(ops), *FAST, *extra)


def test_a_point_holds_each_ranks_launch_and_its_pins(env) -> None:
    sim, ops, state = env
    p = point(state)
    assert p["schema_version"] == 4 and p["record"]["outcome"] == "ok" and p["record"]["profile"] == "dcp2"
    launches = {x["rank"]: x for x in p["record"]["data"]["launches"]}
    assert sorted(launches) == [0, 1, 2, 3]
    head = launches[0]
    assert head["node"] == "reddie" and head["argv"][:2] == ["docker", "run"]
    assert head["image_ref"] == "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2" and head["image_id"]
    assert head["engram_dir"] == "/nvme/engram-local/df42c109f1defefcbfcedbe7d905718a12266e40"
    assert head["inventory"]["hostname"] and head["container_spec"]["image"] == head["image_ref"]
    assert isinstance(head["inventory"]["gid_index"], int) and head["inventory"]["hcas"]
    assert f"B12X_ROCE_GID_INDEX={head['inventory']['gid_index']}" in head["argv"]
    assert head["env"]["VLLM_HOST_IP"] == head["inventory"]["fabric_ip"]
    assert p["record"]["served"]["kv_tokens"] == 1888800
    assert set(p["record"]["template_hashes"]) >= {"vllm-multinode.sh.j2", "vllm-single.sh.j2"}
    assert p["record"]["profile_merged"]["name"] == "dcp2" and p["record"]["profile_merged"]["dcp"] == 2


@pytest.mark.parametrize("pin", ["image", "gid"])
def test_restore_refuses_a_drifted_pin_naming_node_and_pin_and_stops_nothing(env, capsys, pin) -> None:
    sim, ops, state = env
    before = lane_containers(sim)
    assert all(len(v) == 1 and v[0][1] == "running" for v in before.values())
    launch = next(x for x in point(state)["record"]["data"]["launches"] if x["node"] == "bluey")
    with contextlib.ExitStack() as undo:
        if pin == "image":  # the tag was re-pulled on bluey: its local image id moved
            new_id = undo.enter_context(cli_run.repulled(sim, ("bluey",), launch["image_ref"]))
            want = (f"bluey: image id of {launch['image_ref']}: recorded "
                    f"{launch['image_id'].removeprefix('sha256:')[:12]}, now {new_id.removeprefix('sha256:')[:12]}")
        else:  # a global IPv6 address moved bluey's RoCE v2 IPv4 GID entry
            sim.fault("bluey", "wrong-gid")
            undo.callback(sim.heal, "bluey")
            want = f"bluey: resolved GID index: recorded {launch['inventory']['gid_index']}, now 5"
        code, events = restore(capsys, ops)
    assert code == 1, result(events)
    assert step(events, "pins")["status"] == "fail"
    assert [s["step"] for s in events if s["event"] == "step" and s["status"] != "start"] == ["pins"]
    fails = [f for f in findings(events, "pins") if f["status"] == "fail"]
    assert len(fails) == 1 and fails[0]["node"] == "bluey" and fails[0]["message"] == want, fails
    assert lane_containers(sim) == before  # nothing was stopped


def test_restore_relaunches_the_recorded_argv_and_says_what_today_would_change(env, capsys) -> None:
    sim, ops, state = env
    inv_path, prof_path, tpl_path = (ops / "inventories/sim.yaml", ops / "profiles/dcp2.yaml",
                                     ops / "templates/vllm-multinode.sh.j2")
    saved = {p: p.read_text() for p in (inv_path, prof_path, tpl_path)}
    recorded = {x["rank"]: x for x in point(state)["record"]["data"]["launches"]}
    asusi_hcas = recorded[1]["inventory"]["hcas"]
    try:
        prof_path.write_text(saved[prof_path].replace("  --dcp-comm-backend: ag_rs",
                                                      "  --dcp-comm-backend: ag_rs\n  --new-lever: true"))
        inv = yaml.safe_load(saved[inv_path])
        inv["nodes"]["asusi"]["rdma"]["hcas"] = ["mlx5_9"]  # asusi's HCAs changed in the inventory
        inv_path.write_text(yaml.safe_dump(inv, sort_keys=False))
        tpl = saved[tpl_path].replace("  --tensor-parallel-size {{ tp }} \\\n",
                                      "  --tensor-parallel-size {{ tp }} \\\n  --template-edit \\\n")
        assert tpl != saved[tpl_path]
        tpl_path.write_text(tpl)  # the template gained a flag
        code, events = restore(capsys, ops)
    finally:
        for p, text in saved.items():
            p.write_text(text)
    assert code == 0, result(events)
    pins = step(events, "pins")
    assert pins["status"] == "warn" and "relaunching the recorded lane" in pins["summary"]
    msgs = [f["message"] for f in findings(events, "pins")]
    for rank, node in ((1, "asusi"), (2, "bluey"), (3, "spark4"), (0, "reddie")):
        assert f"rank {rank} ({node}): today would change flag --new-lever: (none) -> (bare)" in msgs
        assert f"rank {rank} ({node}): today would change flag --template-edit: (none) -> (bare)" in msgs
    hcas = ",".join(asusi_hcas)
    assert f"rank 1 (asusi): today would change env NCCL_IB_HCA: {hcas} -> mlx5_9" in msgs
    assert not [m for m in msgs if "NCCL_IB_HCA" in m and "asusi" not in m]
    assert any(m.startswith("template vllm-multinode.sh.j2 changed since the point was recorded") for m in msgs)
    rec = run_record(state, events)
    assert rec["restored_from"] == "night" and not rec.get("forced")
    new_run = rec["run_id"]
    for x in rec["data"]["launches"]:  # exactly the recorded argv; only the run label is this run's
        old = recorded[x["rank"]]["argv"]
        old_run = point(state)["record"]["run_id"]
        assert x["argv"] == [t.replace(f"sparkfleet.run={old_run}", f"sparkfleet.run={new_run}") for t in old]
        assert "--new-lever" not in x["argv"] and "--template-edit" not in x["argv"]
    running = lane_containers(sim)
    assert all(len(v) == 1 and v[0][1] == "running" and v[0][2] == new_run for v in running.values())


def test_force_restores_despite_a_drifted_pin_and_the_record_says_forced(env, capsys) -> None:
    """The tag was re-pulled on every node (one new image id everywhere, so the lane's own drift check
    passes): the pins refuse, --force relaunches the recorded lane and the record says forced."""
    sim, ops, state = env
    launch = point(state)["record"]["data"]["launches"][0]
    with cli_run.repulled(sim, NODES, launch["image_ref"]) as new_id:
        assert new_id != launch["image_id"]
        code, events = restore(capsys, ops)
        assert code == 1 and step(events, "pins")["status"] == "fail"
        code, events = restore(capsys, ops, "--force")
    assert code == 0, result(events)
    pins = step(events, "pins")
    assert pins["status"] == "warn" and pins["summary"].endswith("(--force)")
    fs = [f for f in findings(events, "pins") if f["check"] == "pins"]
    assert sorted(f["node"] for f in fs) == sorted(NODES)
    now = f"now {new_id.removeprefix('sha256:')[:12]}"
    assert all(f["status"] == "warn" and "image id" in f["message"] and f["message"].endswith(now) for f in fs)
    assert run_record(state, events)["forced"] is True


def test_restore_bad_names_and_old_points(env, capsys) -> None:
    sim, ops, state = env
    assert main(["restore", "nosuch", "--inventory", "sim", "--root", str(ops)]) == 2
    assert "no restore point and no profile named 'nosuch'; restore points: night" in capsys.readouterr().err
    old = state / "restore/old.json"  # a schema-1 point: pins only
    old.write_text(json.dumps({"name": "old", "profile": "dcp2", "pins": {"ranks": {"0": "reddie"}}}))
    try:
        assert main(["restore", "old", "--inventory", "sim", "--root", str(ops)]) == 2
        assert "was saved by an older sparkfleet (schema 1: pins only, no recorded launches)" in capsys.readouterr().err
    finally:
        old.unlink()
    moved = state / "restore/moved.json"  # a point of nodes this inventory does not have
    p = point(state)
    p["name"] = "moved"
    for x in p["record"]["data"]["launches"]:
        if x["node"] == "spark4":
            x["node"] = "spark9"
    moved.write_text(json.dumps(p))
    before = lane_containers(sim)
    try:
        assert main(["restore", "moved", "--inventory", "sim", "--root", str(ops)]) == 2
        assert "ran on node(s) spark9, which inventory 'sim' does not have" in capsys.readouterr().err
    finally:
        moved.unlink()
    assert lane_containers(sim) == before
    assert os.environ.get("SPARKFLEET_STATE") == str(state)
