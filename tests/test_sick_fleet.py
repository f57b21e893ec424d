"""A sick fleet through the real CLI on the lab: a wrong RoCE GID refused before launch, a `down` that stops
what it can reach when a node is gone, and nothing left running when `up` is interrupted.

THE LAB IS A SIMULATION (sparkfleet/sim): faults change what the nodes' real commands see (their GID
tables, whether they answer at all); the runner, transports, checks and docker calls are the real code.
Uses the sim's fixed ports: run under the lab lock (`flock /tmp/sparkfleet-lab.lock ...`).
"""

from __future__ import annotations

import json

import pytest

from sparkfleet.cli.main import main
from tests.cli_run import LAB_NODES, lane_states, result, run, step

LANE = ["--profile", "dcp2", "--inventory", "sim"]
FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe"]


@pytest.fixture(autouse=True)
def clean(lane_cleaned):
    """Every test here leaves the lab healed and dcp2 down (tests/cli_run.py lane_cleaned)."""


states = lane_states


# -- a wrong RoCE GID: refused before launch --------------------------------------------------------------

GID_FAIL = ("rank 1: NCCL_IB_GID_INDEX=3 on HCA rocep1s0f0,roceP2p1s0f0 is not this node's RoCE v2 IPv4 entry for "
            "192.168.192.12; the right index is 5")


def test_a_fixed_gid_that_is_not_the_nodes_roce_v2_entry_fails_check_and_up_before_anything_starts(sim,
                                                                                                    capsys) -> None:
    sim.fault("asusi", "wrong-gid")  # a global IPv6 address moves asusi's RoCE v2 IPv4 entry from 3 to 5
    code = main(["check", *LANE, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    rdma = [(f["node"], f["status"], f["message"]) for f in doc["findings"] if f["check"] == "rdma"]
    assert ("asusi", "fail", GID_FAIL) in rdma
    assert [x for x in rdma if x[1] != "ok"] == [("asusi", "fail", GID_FAIL)]  # B12X_ROCE_GID_INDEX: auto
    f = next(f for f in doc["findings"] if f["check"] == "rdma" and f["status"] == "fail")
    assert f["expected"] == "NCCL_IB_GID_INDEX=5"
    assert f["observed"].startswith("NCCL_IB_GID_INDEX=3; index 5: RoCE v2 192.168.192.12 on enp1s0f0np0 "
                                    "(rocep1s0f0 port 1)")

    code, events = run(capsys, "up", *LANE, *FAST)
    assert code == 1
    assert result(events)["reason"].startswith("check: ")
    done = [e["step"] for e in events if e["event"] == "step" and e["status"] != "start"]
    assert done[-1] == "check" and not any(s.startswith("launch") for s in done)
    fails = [(f["node"], f["message"]) for e in events if e["event"] == "findings" and e["step"] == "check"
             for f in e["findings"] if f["status"] == "fail"]
    assert fails == [("asusi", GID_FAIL)]
    assert states(sim) == {n: [] for n in LAB_NODES}  # nothing was started


TF_GID_FAIL = ("rank 1: GID_INDEX=3 on HCA rocep1s0f0,roceP2p1s0f0 is not this node's RoCE v2 IPv4 entry for "
               "192.168.192.12; the right index is 5")


def test_tensorfolds_fixed_gid_index_that_is_not_the_nodes_roce_v2_entry_fails_check_and_up(sim, capsys,
                                                                                             tmp_path) -> None:
    """TensorFold's GID_INDEX (its config.env) carries the inventory's index: fixed at seed 002's 3 on asusi,
    whose entry the fault moved to 5, `check` and `up` of tf1017 fail before anything starts, naming it."""
    import yaml

    from tests.conftest import tensorfold_built

    tensorfold_built("tf1017")
    capsys.readouterr()
    data = yaml.safe_load(sim.inventory_path.read_text())
    data["nodes"]["asusi"]["rdma"]["gid_index"] = 3
    inventory = tmp_path / "sim.yaml"  # the lab's inventory (same name), asusi's index fixed
    inventory.write_text(yaml.safe_dump(data))
    sim.fault("asusi", "wrong-gid")
    tf = ["--profile", "tf1017", "--inventory", str(inventory)]
    code = main(["check", *tf, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    bad = [(f["node"], f["message"]) for f in doc["findings"] if f["check"] == "rdma" and f["status"] != "ok"]
    assert [n for n, _ in bad] == ["asusi", "asusi"]
    assert bad[0][1].startswith("gid_index 3 is not this node's RoCE v2 IPv4 entry; the right index is 5")
    assert bad[1][1] == TF_GID_FAIL
    f = next(f for f in doc["findings"] if f["message"] == TF_GID_FAIL)
    assert (f["status"], f["expected"]) == ("fail", "GID_INDEX=5")

    code, events = run(capsys, "up", *tf, "--gates", "models", "--poll", "0.2", "--no-probe")
    assert code == 1
    assert result(events)["reason"].startswith("check: ")
    done = [e["step"] for e in events if e["event"] == "step" and e["status"] != "start"]
    assert done[-1] == "check" and not any(s.startswith("launch") for s in done)
    fails = [(f["node"], f["message"]) for e in events if e["event"] == "findings" and e["step"] == "check"
             for f in e["findings"] if f["status"] == "fail" and f["check"] == "rdma"]
    assert fails == bad
    assert lane_states(sim, "tf1017") == {n: [] for n in LAB_NODES}  # nothing was started


def test_auto_resolves_and_up_serves_with_the_moved_entry_when_no_fixed_index_is_given(sim, capsys) -> None:
    sim.fault("asusi", "wrong-gid")
    code, events = run(capsys, "up", *LANE, *FAST, "-o", "env.NCCL_IB_GID_INDEX=!unset")
    assert code == 0, result(events)
    assert step(events, "check")["status"] in ("ok", "warn")


def test_up_warns_of_a_slow_state_gpu_through_its_probe_step_and_serves(sim, capsys) -> None:
    """FM-10 through `up`: reddie's steps after an idle pause are slower than back to back (the seeds' 94 ms
    against 63). `up`'s probe step (the clock probe under load) warns naming reddie and the ratio; slow state
    is a warning in the seeds (not a refusal), so the lane starts and serves, the warning in its record."""
    sim.fault("reddie", "slow-state")
    code, events = run(capsys, "up", *LANE, "--gates", "models", "--poll", "0.2", "--probe-seconds", "1",
                       "--no-fabric-probe")
    assert code == 0, result(events)
    assert step(events, "probe")["status"] == "warn"
    warned = [(f["node"], f["check"], f["status"], f["message"]) for e in events
              if e["event"] == "findings" and e["step"] == "probe" for f in e["findings"] if f["status"] != "ok"]
    assert warned == [("reddie", "slow-state", "warn", "slow state: steps after idle are 1.492x slower than back "
                       "to back")]
    rec = record_of_down(events)
    probe = next(s for s in rec["steps"] if s["step"] == "probe")
    assert [(f["node"], f["check"]) for f in probe["findings"] if f["status"] == "warn"] == [("reddie", "slow-state")]
    assert states(sim) == {n: ["running"] for n in LAB_NODES}


# -- one node gone: stop what can be reached -------------------------------------------------------------

def test_down_with_a_node_unreachable_stops_the_others_and_names_the_rank_that_may_still_run(sim, capsys) -> None:
    code, events = run(capsys, "up", *LANE, *FAST)
    assert code == 0, result(events)
    run_id = result(events)["run_id"]
    sim.fault("bluey", "unreachable")

    code, events = run(capsys, "down", *LANE)
    assert code == 1
    after = states(sim)
    assert {n: after[n] for n in ("reddie", "asusi", "spark4")} == {"reddie": [], "asusi": [], "spark4": []}
    assert after["bluey"] == ["running"]  # what the controller could not reach is still there
    stop = step(events, "stop")
    assert stop["status"] == "fail"
    assert stop["summary"] == ("removed 3 container(s) on reddie, asusi, spark4; bluey (reach) did not answer: "
                               "rank 2 may still be running there; once it answers, run `sparkfleet down --profile "
                               "dcp2 --limit bluey`")
    (f,) = [f for e in events if e["event"] == "findings" and e["step"] == "stop" for f in e["findings"]]
    assert (f["node"], f["check"]) == ("bluey", "reach") and f["message"].startswith("bluey: ")
    assert f["remedy"].endswith("rank 2 of dcp2 may still run there (holding its GPU memory and port): once bluey "
                                "answers, run `sparkfleet down --profile dcp2 --limit bluey`")
    rec = record_of_down(events)
    assert list(rec["data"]["unreachable"]) == ["bluey"]
    assert {k: rec["data"]["unreachable"]["bluey"][k] for k in ("rank", "kind")} == {"rank": 2, "kind": "reach"}

    assert main(["status", *LANE, "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)["containers"]
    assert [(r["node"], r.get("rank"), r["state"]) for r in rows] == [("bluey", 2, "unreachable, may be running")]

    assert main(["logs", *LANE]) == 2
    err = capsys.readouterr().err
    assert "logs: could not reach bluey: " in err
    assert "no container of lane 'dcp2' on the selected nodes that answered; could not reach bluey, so it may " \
           "still run there" in err

    sim.heal("bluey")  # the node is back: a limited down cleans the rest
    code, events = run(capsys, "down", *LANE, "--limit", "bluey")
    assert code == 0, result(events)
    assert step(events, "stop")["summary"] == "removed 1 container(s) on bluey"
    assert states(sim) == {n: [] for n in LAB_NODES}
    assert run_id  # the up's record names the run the rank belonged to


def test_the_blackhole_fault_is_refused_on_nodes_without_their_own_network(sim, capsys) -> None:
    """A node sharing this machine's network has no management link of its own to drop packets on
    (tests/test_sick_fleet_blackhole.py runs it in ssh mode)."""
    assert main(["sim", "fault", "bluey", "blackhole"]) == 2
    assert "blackhole needs nodes with their own network: `sparkfleet sim up --transport ssh` as root" in \
        capsys.readouterr().err
    assert sim.faults("bluey") == {}


def record_of_down(events: list[dict]) -> dict:
    from tests.cli_run import record_of

    return record_of(events)


def test_limit_is_checked_against_the_lane_and_refused_on_up(sim, capsys) -> None:
    assert main(["down", *LANE, "--limit", "asusi,station", "--json"]) == 2
    err = capsys.readouterr().err
    assert "--limit asusi,station: station is not a node of lane dcp2 (its nodes: reddie, asusi, bluey, spark4)" in err
    assert main(["up", *LANE, *FAST, "--limit", "asusi", "--json"]) == 2
    assert "--limit is refused on up: a tensor-parallel lane cannot start on part of its nodes" in \
        capsys.readouterr().err
    assert main(["status", *LANE, "--limit", "nowhere", "--json"]) == 2
    assert "nowhere is not a node of lane dcp2" in capsys.readouterr().err
    assert states(sim) == {n: [] for n in LAB_NODES}  # nothing was started


# -- Engram per layer ---------------------------------------------------------------------------------------

def test_a_rank_that_reads_one_engram_layer_over_nfs_fails_expect_naming_rank_and_layer(sim, capsys) -> None:
    sim.fault("bluey", "engram-layer-nfs")  # its last layer from the model directory, the others node-local
    code, events = run(capsys, "up", *LANE, *FAST)
    assert code == 1
    assert result(events)["reason"] == "expect: expectations not met; every rank of this launch was stopped"
    fails = [(f["node"], f["message"]) for e in events if e["event"] == "findings" and e["step"] == "expect"
             for f in e["findings"] if f["status"] == "fail"]
    assert fails == [("bluey", "rank 2 (bluey) read Engram layer(s) 14 over NFS, not from its node-local copy "
                               "(expect.engram_node_local; 6-8 ms a step against 3, ENG-16)")]
    assert states(sim) == {n: ["exited"] for n in LAB_NODES}


def test_status_endpoint_probes_the_api_even_when_the_head_cannot_be_reached_over_ssh(sim, capsys) -> None:
    from tests.cli_run import record_of

    code, events = run(capsys, "up", *LANE, *FAST)
    assert code == 0, result(events)
    base = record_of(events)["data"]["gates"]["endpoint"]
    sim.fault("reddie", "unreachable")  # SSH to the head fails; its API still answers
    assert main(["status", *LANE, "--endpoint", base, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [(r["node"], r.get("rank"), r["state"]) for r in doc["containers"] if "error" in r] == [
        ("reddie", 0, "unreachable, may be running")]
    lane_st = doc["lanes"]["dcp2"]
    assert (lane_st["endpoint"], lane_st["health"], lane_st["models"]) == (base, 200, ["deepseek-v4.1-flash"])
