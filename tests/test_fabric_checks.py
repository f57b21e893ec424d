"""The fabric and drift checks over hand-built facts of the shipped lab inventory (issue 15)."""

from __future__ import annotations

import pytest

from sparkfleet.checks import drift
from sparkfleet.opsdir import Spec
from tests.test_checks import check, healthy, lane, of

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


@pytest.fixture
def dcp2(repo_spec: Spec):
    profile, inv, plan = lane(repo_spec, "dcp2")
    assert [r.node.name for r in plan.ranks] == ["reddie", "asusi", "bluey", "spark4"]
    return profile, inv, plan, healthy(profile, inv, plan)


def bad(findings, name: str) -> list[tuple[str | None, str, str]]:
    return [(f.node, f.status, f.message) for f in findings if f.check == name and f.status != "ok"]


def test_healthy_fabric_and_stack_pass(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    found = check(profile, inv, plan, facts)
    assert bad(found, "fabric") == [] and bad(found, "drift") == []
    ok = of(found, "fabric", "asusi")[0]
    assert ok.observed == ("enp1s0f0np0 up, carrier 1, 200 Gb/s, MTU 9000, rocep1s0f0/1 ACTIVE ?; "
                           "GID 3 192.168.192.12 RoCE v2")
    assert of(found, "drift", "bluey")[0].status == "ok"


def test_mtu_mismatch_names_the_node_and_each_value(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    facts["bluey"].links["enp1s0f0np0"].mtu = 1500
    found = check(profile, inv, plan, facts)
    assert bad(found, "fabric") == [("bluey", "fail", "MTU 1500 on enp1s0f0np0 differs from the lane's other ranks")]
    (f,) = [x for x in of(found, "fabric", "bluey") if x.status == "fail"]
    assert f.observed == "reddie 9000, asusi 9000, bluey 1500, spark4 9000"


def test_mtu_tie_fails_every_rank(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    for n in ("bluey", "spark4"):
        facts[n].links["enp1s0f0np0"].mtu = 1500
    assert [n for n, s, _ in bad(check(profile, inv, plan, facts), "fabric")] == ["reddie", "asusi", "bluey",
                                                                                   "spark4"]


def test_link_down_and_port_not_active_fail(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    link = facts["asusi"].links["enp1s0f0np0"]
    link.operstate, link.carrier, link.speed_mbps = "down", None, None
    facts["spark4"].rdma[0].state = "DOWN"
    assert bad(check(profile, inv, plan, facts), "fabric") == [
        ("asusi", "fail", "fabric link enp1s0f0np0 is down"),
        ("spark4", "fail", "RDMA port rocep1s0f0/1 is DOWN, not ACTIVE")]


def test_slow_link_rate_warns_against_the_class_and_its_override(repo_spec: Spec, dcp2) -> None:
    profile, inv, plan, facts = dcp2
    facts["reddie"].links["enp1s0f0np0"].speed_mbps = 100_000
    assert bad(check(profile, inv, plan, facts), "fabric") == [
        ("reddie", "warn", "enp1s0f0np0 runs at 100 Gb/s, below the class's 200 Gb/s")]
    over = inv.model_copy(update={"hardware_classes": {"gb10": inv.hardware_classes.get("gb10")
                                                       or type(inv.hardware(plan.ranks[0].node))(
                                                           fabric_speed_gbps=100)}})
    assert over.hardware(plan.ranks[0].node).fabric_speed_gbps == 100
    assert bad(check(profile, over, plan, facts), "fabric") == []


def test_an_interface_the_node_lacks_is_named(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    facts["spark4"].links["enp1s0f0np0"] = type(facts["spark4"].links["enp1s0f0np0"])(name="enp1s0f0np0",
                                                                                       exists=False)
    (f,) = [x for x in check(profile, inv, plan, facts) if x.check == "fabric" and x.status != "ok"]
    assert (f.node, f.status) == ("spark4", "fail")
    assert f.message == "the inventory's fabric interface enp1s0f0np0 does not exist on spark4"


def test_driver_image_and_patch_drift_fail_kernel_and_docker_warn(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    facts["bluey"].versions.driver = "570.86.10"
    facts["asusi"].docker.images[0].id = "sha256:" + "9" * 64
    facts["reddie"].versions.kernel = "6.14.0-1009-nvidia"
    facts["spark4"].versions.docker = "27.5.1"
    assert bad(check(profile, inv, plan, facts), "drift") == [
        ("reddie", "warn", "kernel 6.14.0-1009-nvidia differs from the lane's other ranks"),
        ("asusi", "fail", "image id 999999999999 differs from the lane's other ranks"),
        ("bluey", "fail", "NVIDIA driver 570.86.10 differs from the lane's other ranks"),
        ("spark4", "warn", "docker 27.5.1 differs from the lane's other ranks")]


def test_patch_drift_from_the_hashes(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    profile = profile.model_copy(update={"patches": "probe"})
    for r in plan.ranks:
        base = f"{r.node.storage.patch_root}/probe"
        facts[r.node.name].hashes = {f"{base}/a.py": "1" * 64, f"{base}/b.py": "2" * 64}
    facts["asusi"].hashes[f"{plan.ranks[1].node.storage.patch_root}/probe/b.py"] = None
    (f,) = [x for x in check(profile, inv, plan, facts) if x.check == "drift" and x.status != "ok"]
    assert (f.node, f.status) == ("asusi", "fail") and f.message.startswith("patch set ")


def test_clock_skew_warns_above_the_bound(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    facts["spark4"].collected_at += 2.5
    found = check(profile, inv, plan, facts)
    assert bad(found, "drift") == [("spark4", "warn", "clock +2.50 s off the lane's other ranks")]
    wide = inv.model_copy(update={"max_clock_skew_s": 3.0})
    assert bad(check(profile, wide, plan, facts), "drift") == []


def test_unreported_versions_are_not_judged(dcp2) -> None:
    profile, inv, plan, facts = dcp2
    facts["bluey"].versions = None
    found = bad(check(profile, inv, plan, facts), "drift")
    assert found == [("bluey", "warn", "not reported, not compared: NVIDIA driver, CUDA, kernel, docker")]


def test_odd_ones() -> None:
    assert drift.odd_ones({"a": 1, "b": 1, "c": 2}) == {"c"}
    assert drift.odd_ones({"a": 1, "b": 2}) == {"a", "b"}
    assert drift.odd_ones({"a": 1, "b": 1}) == set()


def test_llamacpp_ranks_on_other_drivers_only_warn_and_the_image_still_fails(repo_spec: Spec) -> None:
    """A GB300 head over GB10 rpc-servers: each rank drives its own GPU (ggml's RPC between them), so the
    Station's own driver and CUDA warn; a rank on another llama.cpp image (its RPC protocol) still fails."""
    profile, inv, plan = lane(repo_spec, "llamacpp-lab-station")
    facts = healthy(profile, inv, plan)
    facts["station"].versions.driver, facts["station"].versions.cuda = "595.84", "13.1"
    facts["bluey"].docker.images[0].id = "sha256:" + "9" * 64
    assert bad(check(profile, inv, plan, facts), "drift") == [
        ("station", "warn", "NVIDIA driver 595.84 differs from the lane's other ranks"),
        ("station", "warn", "CUDA 13.1 differs from the lane's other ranks"),
        ("bluey", "fail", "image id 999999999999 differs from the lane's other ranks")]
