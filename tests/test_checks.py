"""Preflight checks over hand-built NodeFacts for the shipped lanes on the shipped lab inventory, and the
`check` command with gathering faked out."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

import pytest

from sparkfleet.checks import ORDER, run_checks
from sparkfleet.checks.seeds import EARLYOOM_MARGIN_BYTES, GB, GiB, engram_copy_bytes
from sparkfleet.cli.main import command_modules, main
from sparkfleet.findings import Finding
from sparkfleet.fleet.gather import facts_requests
from sparkfleet.fleet.nodefacts import (
    Container,
    Docker,
    EarlyOom,
    Gid,
    Gpu,
    Image,
    Listener,
    MemInfo,
    Mount,
    NetLink,
    NodeFacts,
    PathInfo,
    RdmaPort,
    Versions,
)
from sparkfleet.fleet.transport import Result, RunEachByRun
from sparkfleet.opsdir import Spec
from sparkfleet.plan import Plan, make_plan
from sparkfleet.schema.inventory import Inventory
from sparkfleet.schema.profile import Profile

REPO = Path(__file__).resolve().parent.parent
GB10_TOTAL = 126_701_056 * 1024  # a GB10's MemTotal in /proc/meminfo (kB): 120.8 GiB of its 121 GiB
GB300_TOTAL = 494 * GiB  # Grace RAM (INV-50)
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
LANES = ("dcp1", "dcp2", "boot10", "gb300-v23")


# -- building a lane and its healthy facts ---------------------------------------------------

def lane(sp: Spec, name: str) -> tuple[Profile, Inventory, Plan]:
    loaded = sp.profile(name)
    inventory = sp.inventory("lab")
    return loaded.profile, inventory, make_plan(loaded, inventory, sp.playbook("up"), sp.root)


def _gids(ip: str | None, iface: str, v2_ipv4_index: int = 3) -> list[Gid]:
    """A ConnectX GID table: link-local v1/v2 first, then the IPv4 entries (v1, then v2 at the index)."""
    gids = [Gid(index=0, gid="fe80:0000:0000:0000:025f:46ff:fe00:0101", type="IB/RoCE v1", netdev=iface),
            Gid(index=1, gid="fe80:0000:0000:0000:025f:46ff:fe00:0101", type="RoCE v2", netdev=iface)]
    if ip:
        octets = "".join(f"{int(x):02x}" for x in ip.split("."))
        mapped = f"0000:0000:0000:0000:0000:ffff:{octets[:4]}:{octets[4:]}"
        gids.append(Gid(index=v2_ipv4_index - 1, gid=mapped, type="IB/RoCE v1", ipv4=ip, netdev=iface))
        gids.append(Gid(index=v2_ipv4_index, gid=mapped, type="RoCE v2", ipv4=ip, netdev=iface))
    return gids


def _mount_of(path: str, mounts: list[Mount]) -> Mount:
    best = mounts[0]
    for m in mounts:
        if path == m.target or path.startswith(m.target.rstrip("/") + "/"):
            if len(m.target) >= len(best.target):
                best = m
    return best


def healthy(profile: Profile, inventory: Inventory, plan: Plan) -> dict[str, NodeFacts]:
    """What a healthy, idle, prepared node reports for this lane: every asked path present."""
    requests = facts_requests(inventory, plan, profile, root=REPO)
    out: dict[str, NodeFacts] = {}
    for r in plan.ranks:
        node = r.node
        gb10 = node.hardware == "gb10"
        total = GB10_TOTAL if gb10 else GB300_TOTAL
        mounts = [Mount(target="/", source="/dev/nvme0n1p2", fstype="ext4")]
        if node.storage.nfs_mount:
            nfs = node.storage.nfs_mount
            mounts.append(Mount(target=nfs.path, source=nfs.source, fstype="nfs4", options="ro,vers=4.2"))
        if not gb10:
            mounts.append(Mount(target="/models", source="/dev/md0", fstype="xfs"))
        paths = {p: PathInfo(path=p, exists=True, is_dir=not p.endswith(".py"), mount=_mount_of(p, mounts),
                             free_bytes=2000 * GB, total_bytes=4000 * GB)
                 for p in requests[node.name].paths}
        rdma = []
        if node.rdma:
            rdma.append(RdmaPort(hca=node.rdma.hcas[0], port=1, state="ACTIVE", netdev=node.rdma.fabric_iface,
                                 gids=_gids(node.fabric_ip, node.rdma.fabric_iface)))
            if len(node.rdma.hcas) > 1:
                second = node.rdma.rail2_iface or "enP2p1s0f0np0"
                rdma.append(RdmaPort(hca=node.rdma.hcas[1], port=1, state="ACTIVE", netdev=second,
                                     gids=_gids(None, second)))
        image = profile.image
        assert image is not None
        repo = image.ref.rsplit(":", 1)[0]
        out[node.name] = NodeFacts(
            node=node.name, hostname=node.name, collected_at=1.8e9, uptime_s=3600.0, helper_version="1",
            meminfo=MemInfo(mem_total_bytes=total, mem_available_bytes=(117 if gb10 else 480) * GiB),
            gpus=[Gpu(index=0, name="NVIDIA GB10" if gb10 else "NVIDIA GB300", pstate="P8",
                      sm_clock_mhz=208 if gb10 else 345, max_sm_clock_mhz=3003 if gb10 else 2032,
                      clock_event_reasons=0x1)],
            earlyoom=EarlyOom(running=True, pid=1187, argv=["/usr/bin/earlyoom", "-m", "2"], default_args="-m 2",
                              mem_term_percent=2.0, sigterm_threshold_bytes=total * 2 // 100),
            docker=Docker(available=True, images=[
                Image(ref=image.ref, id="sha256:" + "1" * 64, digests=[f"{repo}@{image.digest or DIGEST_A}"])]),
            listening=[Listener(port=22, address="0.0.0.0", pid=1034, process="sshd")],
            rdma=rdma, mounts=[m for m in mounts if m.fstype != "ext4"], paths=paths,
            links={i: NetLink(name=i, exists=True, operstate="up", carrier=1, speed_mbps=200_000, mtu=9000)
                   for i in requests[node.name].interfaces},
            versions=Versions(kernel="6.11.0-1016-nvidia", driver="580.95.05", cuda="13.0", docker="28.3.3"),
            hashes={p: "5" * 64 for p in requests[node.name].hash_paths}, received_at=1.8e9)
    return out


def check(profile: Profile, inventory: Inventory, plan: Plan, facts: dict, **kw) -> list[Finding]:
    return run_checks(plan, inventory, facts, profile=profile, **kw)


def only(findings: list[Finding], check_name: str, node: str) -> Finding:
    got = [f for f in findings if f.check == check_name and f.node == node]
    assert len(got) == 1, got
    return got[0]


def of(findings: list[Finding], check_name: str, node: str) -> list[Finding]:
    return [f for f in findings if f.check == check_name and f.node == node]


def statuses(findings: list[Finding]) -> dict[tuple[str | None, str], set[str]]:
    out: dict[tuple[str | None, str], set[str]] = {}
    for f in findings:
        out.setdefault((f.node, f.check), set()).add(f.status)
    return out


@pytest.fixture
def ops(ops_root: Path) -> Spec:
    return Spec(ops_root)


def add_profile(sp: Spec, name: str, text: str) -> None:
    (sp.root / "profiles" / f"{name}.yaml").write_text(text)


# -- healthy lanes -------------------------------------------------------------------------

# what a healthy lab still warns about: GB300's host memory has no prediction in the profile, boot10's KV is
# sized by gpu-memory-utilization (FM-16), v23 at off60 holds about two full-1M requests (FM-69); and an
# image without a digest pin, once, on the first rank (no shipped lane pins one: the seeds give no digest)
EXPECTED_WARNS = {"gb300-v23": {("station", "earlyoom"), ("station", "long-context")},
                  "boot10": {("reddie", "kv-sizing")}}


def expected_warns(name: str, plan: Plan, profile: Profile) -> set:
    unpinned = {(plan.ranks[0].node.name, "image")} if profile.image and not profile.image.digest else set()
    return EXPECTED_WARNS.get(name, set()) | unpinned


@pytest.mark.parametrize("name", LANES)
def test_healthy_lane_passes_every_check(repo_spec: Spec, name: str) -> None:
    profile, inv, plan = lane(repo_spec, name)
    findings = check(profile, inv, plan, healthy(profile, inv, plan))
    assert all(f.node and f.check and f.message for f in findings)
    warns = {(f.node, f.check) for f in findings if f.status == "warn"}
    assert not [f for f in findings if f.status == "fail"], [f for f in findings if f.status == "fail"]
    assert warns == expected_warns(name, plan, profile), [f for f in findings if f.status == "warn"]
    seen = statuses(findings)
    for r in plan.ranks:
        for c in ("memory", "earlyoom", "storage", "image", "mounts", "conflicts"):
            assert (r.node.name, c) in seen, (r.node.name, c)
        gb10 = r.node.hardware == "gb10"
        assert ((r.node.name, "clock") in seen) == gb10  # GB10 only (class thresholds)
        assert ((r.node.name, "rdma") in seen) == (gb10 and len(plan.ranks) > 1)


def test_findings_are_in_rank_then_check_order(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    findings = check(profile, inv, plan, healthy(profile, inv, plan))
    ranks = [r.node.name for r in plan.ranks]
    keys = [(ranks.index(f.node), ORDER.index(f.check)) for f in findings]
    assert keys == sorted(keys)
    assert [f.node for f in findings][0] == "reddie" and [f.node for f in findings][-1] == "spark4"


def test_unreachable_node_is_a_finding_and_the_others_are_still_checked(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts: dict = healthy(profile, inv, plan)
    facts["bluey"] = Result("bluey", False, error="unreachable", message="bluey: 10.10.0.13:22 unreachable (timed out)")
    findings = check(profile, inv, plan, facts)
    f = only(findings, "reach", "bluey")
    assert f.status == "fail" and "unreachable" in f.message and f.observed == "unreachable"
    assert not [x for x in findings if x.node == "bluey" and x.check != "reach"]
    assert only(findings, "memory", "spark4").status == "ok"
    del facts["bluey"]
    assert only(check(profile, inv, plan, facts), "reach", "bluey").status == "fail"


def test_facts_errors_are_reported(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["asusi"].errors = ["nvidia-smi: not found"]
    f = only(check(profile, inv, plan, facts), "facts", "asusi")
    assert f.status == "warn" and "nvidia-smi: not found" in (f.observed or "")


# -- memory ----------------------------------------------------------------------------------

def test_low_mem_available_fails_and_says_caches_were_not_dropped(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["asusi"].meminfo.mem_available_bytes = 80 * GiB
    f = only(check(profile, inv, plan, facts), "memory", "asusi")
    assert f.status == "fail"
    assert "80.0 GiB is below 100.0 GiB" in f.message and "not dropped" in f.message
    assert f.expected == ">= 100.0 GiB (per rank, gb10 class; HLT-03)"
    assert "caches not dropped" in (f.observed or "") and "--drop-caches" in f.remedy
    dropped = check(profile, inv, plan, facts, caches_dropped={n: True for n in facts})
    f = only(dropped, "memory", "asusi")
    assert f.status == "fail" and "not dropped" not in f.message and "--drop-caches" not in f.remedy
    assert "after dropping caches" in (f.observed or "")
    assert only(dropped, "memory", "reddie").status == "ok"


def test_memory_floor_comes_from_the_hardware_class(ops: Spec) -> None:
    inv_file = ops.root / "inventories" / "lab.yaml"
    inv_file.write_text(inv_file.read_text().replace("nodes:\n", "hardware_classes:\n  gb10: {min_mem_available_gib: 118}\n"
                                                      "nodes:\n", 1))
    profile, inv, plan = lane(ops, "dcp2")
    f = only(check(profile, inv, plan, healthy(profile, inv, plan)), "memory", "reddie")
    assert f.status == "fail" and "below 118.0 GiB" in f.message


def test_drop_caches_failure_is_reported_per_node(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    findings = check(profile, inv, plan, facts, caches_dropped={"reddie": True, "asusi": "Permission denied"})
    f = only(findings, "drop-caches", "asusi")
    assert f.status == "warn" and "Permission denied" in f.message
    assert not of(findings, "drop-caches", "reddie")


def test_gb300_pin_hot_lane_needs_the_host_floor(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "gb300-v23")
    facts = healthy(profile, inv, plan)
    assert only(check(profile, inv, plan, facts), "memory", "station").status == "ok"
    facts["station"].meminfo.mem_available_bytes = 8 * GiB
    f = only(check(profile, inv, plan, facts), "memory", "station")
    assert f.status == "fail" and "below 10.0 GiB" in f.message and "pin-hot hook" in (f.expected or "")
    # a Station lane without the hook has no launch floor
    profile, inv, plan = lane(repo_spec, "gb300-v12")
    facts = healthy(profile, inv, plan)
    facts["station"].meminfo.mem_available_bytes = 8 * GiB
    f = only(check(profile, inv, plan, facts), "memory", "station")
    assert f.status == "ok" and "no launch floor" in f.message


# -- earlyoom --------------------------------------------------------------------------------

def test_earlyoom_not_running_fails(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp1")
    facts = healthy(profile, inv, plan)
    facts["spark4"].earlyoom = EarlyOom(running=False, default_args="-r 3600", mem_term_percent=10.0)
    f = only(check(profile, inv, plan, facts), "earlyoom", "spark4")
    assert f.status == "fail" and "not running" in f.message and "watchdogs reset the node" in f.message
    assert 'EARLYOOM_ARGS="-m 2"' in f.remedy and "INV-14" in f.remedy


def test_the_seeds_8_gib_kv_passes_with_9_gb_headroom(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp1")
    findings = check(profile, inv, plan, healthy(profile, inv, plan))
    f = only(findings, "earlyoom", "reddie")
    threshold = GB10_TOTAL * 2 // 100
    assert f.status == "ok" and "9.0 GB" in f.message
    assert "measured headroom after load (memory.headroom_after_load_gb.head: 9 GB)" in (f.observed or "")
    assert f.expected == (f"predicted MemAvailable after load >= {(threshold + EARLYOOM_MARGIN_BYTES) / GB:.1f} GB "
                          f"({threshold / GB:.1f} GB SIGTERM line + 2.6 GB margin)")
    # workers have no measured headroom: MemTotal - model - the 8 GiB KV budget
    w = only(findings, "earlyoom", "asusi")
    assert w.status == "ok" and "model 81.6 GiB - KV 8.0 GiB" in (w.observed or "")


def test_the_seeds_10_gib_kv_is_refused(ops: Spec) -> None:
    add_profile(ops, "dcp1-kv10", "extends: dcp1\nflags:\n  --kv-cache-memory-bytes: 10737418240\n"
                "memory:\n  headroom_after_load_gb: {head: 2}   # FM-15: the head sat at 2 GB\n")
    profile, inv, plan = lane(ops, "dcp1-kv10")
    findings = check(profile, inv, plan, healthy(profile, inv, plan))
    f = only(findings, "earlyoom", "reddie")
    assert f.status == "fail" and f.message.startswith("refused: predicted MemAvailable after load 2.0 GB")
    assert "FM-15" in f.remedy and "--kv-cache-memory-bytes" in f.remedy
    assert only(findings, "earlyoom", "asusi").status == "ok"  # 121 - 81.6 - 10 GiB is still far above


def test_the_profile_floor_raises_the_margin(ops: Spec) -> None:
    add_profile(ops, "dcp1-floor", "extends: dcp1\nexpect:\n  mem_available_floor_gb: {head: 10}\n")
    profile, inv, plan = lane(ops, "dcp1-floor")
    f = only(check(profile, inv, plan, healthy(profile, inv, plan)), "earlyoom", "reddie")
    assert f.status == "fail" and "expect.mem_available_floor_gb.head: 10 GB" in (f.expected or "")


def test_earlyoom_at_a_higher_percent_than_the_class_is_named(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp1")
    facts = healthy(profile, inv, plan)
    facts["reddie"].earlyoom = EarlyOom(running=True, pid=7, argv=["/usr/bin/earlyoom", "-r", "3600"],
                                        mem_term_percent=10.0, sigterm_threshold_bytes=GB10_TOTAL // 10)
    f = only(check(profile, inv, plan, facts), "earlyoom", "reddie")
    assert f.status == "fail" and "-m 10, above the gb10 class's 2%" in f.remedy


def test_no_memory_budget_is_a_warning(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "gb300-v23")
    f = only(check(profile, inv, plan, healthy(profile, inv, plan)), "earlyoom", "station")
    assert f.status == "warn" and f.message.startswith("no prediction: the profile has no memory budget")


# -- clock latch and slow state ---------------------------------------------------------------

def probe_doc(sm: int, reasons: int, *, top: int = 3003, n: int = 10, load: bool = True,
              step_ms: dict | None = None, rc: int = 0) -> dict:
    samples = [{"t": 0.0, "gpu": 0, "sm": 208, "max": top, "reasons": 1, "load": False}]
    samples += [{"t": 0.2 * (i + 1), "gpu": 0, "sm": sm, "max": top, "reasons": reasons, "load": load}
                for i in range(n)]
    return {"probe": "sparkfleet-clock-probe", "version": 1, "interval_s": 0.2, "samples": samples,
            "load": {"command": "sim-gpu-load 5", "rc": rc, "killed": False, "ended_s": 5.1,
                     "stdout_tail": "", "stderr_tail": "" if rc == 0 else "sim-gpu-load: no GPU\n"},
            "step_ms": step_ms, "errors": []}


def test_latched_clock_under_load_fails(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    findings = check(profile, inv, plan, facts, probes={"asusi": probe_doc(780, 0x0)})
    f = only(findings, "clock", "asusi")
    assert f.status == "fail" and "latched: 780 MHz under load" in f.message
    assert "unplug" in f.remedy and "a reboot does not clear it" in f.remedy
    assert "SM 780 of 3003 MHz (median of 10 samples under load), reasons none" in (f.observed or "")
    assert f.expected == "under load: SM clock outside 630-950 MHz and >= 0.5 x max SM clock, unless a throttle " \
                         "reason explains it"
    # nodes without a probe run show their idle snapshot, not judged
    assert only(findings, "clock", "reddie").status == "unknown"


def test_the_same_clock_idle_is_not_judged(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    f = only(check(profile, inv, plan, facts, probes={"asusi": probe_doc(780, 0x1)}), "clock", "asusi")
    assert f.status == "unknown" and f.message.startswith("idle: not judged")
    f = only(check(profile, inv, plan, facts, probes={"asusi": probe_doc(780, 0x0, load=False)}), "clock", "asusi")
    assert f.status == "unknown" and f.message.startswith("idle: not judged")
    # the facts snapshot (no probe) is never judged, latch-band clock or not, and says which it measured
    facts["asusi"].gpus[0] = Gpu(index=0, name="NVIDIA GB10", sm_clock_mhz=780, max_sm_clock_mhz=3003,
                                 clock_event_reasons=0x0)
    f = only(check(profile, inv, plan, facts), "clock", "asusi")
    assert f.status == "unknown" and "idle: not judged (no load running)" in f.message and "--probe" in f.remedy
    assert (f.observed or "").startswith("snapshot, GPU 0 SM 780 of 3003 MHz, reasons 0x0 (none)")
    f = only(check(profile, inv, plan, healthy(profile, inv, plan)), "clock", "asusi")
    assert "idle: not judged (GpuIdle)" in f.message and "0x1 (GpuIdle)" in (f.observed or "")


def test_a_low_clock_with_a_power_cap_is_not_a_latch(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    f = only(check(profile, inv, plan, healthy(profile, inv, plan), probes={"bluey": probe_doc(780, 0x4)}),
             "clock", "bluey")
    assert f.status == "warn" and "not a latch" in f.message and "SwPowerCap" in f.message
    assert "unplug" not in f.remedy


def test_below_half_of_max_outside_the_band_is_a_latch_too(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    assert only(check(profile, inv, plan, facts, probes={"bluey": probe_doc(1400, 0x0)}), "clock", "bluey").status \
        == "fail"
    assert only(check(profile, inv, plan, facts, probes={"bluey": probe_doc(1600, 0x0)}), "clock", "bluey").status \
        == "ok"


def test_one_ramping_sample_does_not_make_a_latch(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    doc = probe_doc(3003, 0x0)
    doc["samples"][1].update(sm=700)  # the first sample under load, while the clock still ramps
    f = only(check(profile, inv, plan, healthy(profile, inv, plan), probes={"bluey": doc}), "clock", "bluey")
    assert f.status == "ok" and "3003 of 3003 MHz" in f.message


def test_latch_thresholds_come_from_the_hardware_class(ops: Spec) -> None:
    inv_file = ops.root / "inventories" / "lab.yaml"
    inv_file.write_text(inv_file.read_text().replace(
        "nodes:\n", "hardware_classes:\n  gb10: {clock_latch_mhz: [500, 700], clock_latch_fraction: 0.2}\nnodes:\n", 1))
    profile, inv, plan = lane(ops, "dcp2")
    f = only(check(profile, inv, plan, healthy(profile, inv, plan), probes={"bluey": probe_doc(780, 0x0)}),
             "clock", "bluey")
    assert f.status == "ok" and "outside 500-700 MHz and >= 0.2 x max" in (f.expected or "")


def test_probe_failures_are_unknown_not_judged(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    findings = check(profile, inv, plan, facts, probes={"asusi": probe_doc(208, 0x1, rc=1),
                                                        "bluey": {"error": "bluey: timed out after 150 s"}})
    a, b = only(findings, "clock", "asusi"), only(findings, "clock", "bluey")
    assert a.status == "unknown" and "exited 1" in a.message and "sim-gpu-load: no GPU" in a.message
    assert b.status == "unknown" and "did not run: bluey: timed out" in b.message


def test_slow_state_warns(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    slow = {"after_idle": [94, 95, 93, 94, 94], "back_to_back": [63] * 30, "pause_s": 3}
    findings = check(profile, inv, plan, facts, probes={"spark4": probe_doc(3003, 0x0, step_ms=slow)})
    f = only(findings, "slow-state", "spark4")
    assert f.status == "warn" and "1.492x slower" in f.message and "FM-10" in f.remedy
    assert f.observed == "94 ms/step after a 3 s idle pause vs 63 back to back (ratio 1.492)"
    assert f.expected == "after-idle / back-to-back step time <= 1.25"
    assert only(findings, "clock", "spark4").status == "ok"
    fast = {"after_idle": [64, 63], "back_to_back": [63] * 30, "pause_s": 3}
    f = only(check(profile, inv, plan, facts, probes={"spark4": probe_doc(3003, 0x0, step_ms=fast)}),
             "slow-state", "spark4")
    assert f.status == "ok"
    f = only(check(profile, inv, plan, facts, probes={"spark4": probe_doc(3003, 0x0)}), "slow-state", "spark4")
    assert f.status == "unknown" and f.message == "not measured: the probe's load printed no step timings"
    busy = {**slow, "idle_seen": False}
    f = only(check(profile, inv, plan, facts, probes={"spark4": probe_doc(3003, 0x0, step_ms=busy)}),
             "slow-state", "spark4")
    assert f.status == "unknown" and f.message == "not measured: the GPU was not idle before the load's first steps"
    assert not of(check(profile, inv, plan, facts), "slow-state", "spark4")  # no probe: no slow-state finding


def test_gb300_clock_is_not_judged(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "gb300-v23")
    findings = check(profile, inv, plan, healthy(profile, inv, plan), probes={"station": probe_doc(780, 0x0)})
    assert not of(findings, "clock", "station")


# -- rdma ------------------------------------------------------------------------------------

def test_auto_gid_resolves_to_the_roce_v2_ipv4_entry(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["asusi"].rdma[0].gids = _gids("192.168.192.12", "enp1s0f0np0", v2_ipv4_index=5)
    findings = check(profile, inv, plan, facts)
    f = only([x for x in findings if x.status == "ok"], "rdma", "asusi")
    assert f.message == "gid_index auto resolves to 5"
    assert (f.observed or "").startswith("index 5: RoCE v2 192.168.192.12 on enp1s0f0np0 (rocep1s0f0 port 1)")
    # the profile's fixed NCCL_IB_GID_INDEX=3 points elsewhere on this node: refused before launch
    w = [x for x in of(findings, "rdma", "asusi") if x.status == "fail"]
    assert [(x.message, x.expected) for x in w] == [
        ("rank 1: NCCL_IB_GID_INDEX=3 on HCA rocep1s0f0,roceP2p1s0f0 is not this node's RoCE v2 IPv4 entry for "
         "192.168.192.12; the right index is 5", "NCCL_IB_GID_INDEX=5")]
    assert {x.status for x in of(findings, "rdma", "reddie")} == {"ok"}


def test_a_wrong_fixed_gid_index_fails_and_names_the_right_one(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    inv.nodes["bluey"].rdma.gid_index = 3
    facts = healthy(profile, inv, plan)
    facts["bluey"].rdma[0].gids = _gids("192.168.192.13", "enp1s0f0np0", v2_ipv4_index=5)
    f = [x for x in of(check(profile, inv, plan, facts), "rdma", "bluey") if x.status == "fail"][0]
    assert "gid_index 3 is not this node's RoCE v2 IPv4 entry; the right index is 5" in f.message
    assert "nodes.bluey.rdma.gid_index: 5" in f.remedy
    inv.nodes["bluey"].rdma.gid_index = 5
    got = of(check(profile, inv, plan, facts), "rdma", "bluey")
    assert [(x.status, x.message[:40]) for x in got] == [("ok", "gid_index 5 is the RoCE v2 IPv4 entry"),
                                                         ("fail", "rank 2: NCCL_IB_GID_INDEX=3 on HCA rocep")]


def test_no_roce_v2_ipv4_entry_fails(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["spark4"].rdma[0].gids = _gids(None, "enp1s0f0np0")
    f = only(check(profile, inv, plan, facts), "rdma", "spark4")
    assert f.status == "fail" and f.message == "no RoCE v2 IPv4 GID entry on enp1s0f0np0"
    assert "192.168.192.14" in f.remedy
    facts["spark4"].rdma = []
    f = only(check(profile, inv, plan, facts), "rdma", "spark4")
    assert f.status == "fail" and "no RDMA port" in f.message


# -- storage ---------------------------------------------------------------------------------

def test_cifs_model_on_the_station_fails(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "gb300-v23")
    facts = healthy(profile, inv, plan)
    mdir = posixpath.join("/models", profile.model.repo_dir)
    facts["station"].paths[mdir].mount = Mount(target="/models", source="//milo-ark/models", fstype="cifs")
    f = [x for x in of(check(profile, inv, plan, facts), "storage", "station") if x.status != "ok"][0]
    assert f.status == "fail" and f"model dir {mdir} is on cifs" in f.message
    assert "local NVMe" in f.remedy and "FM-44" in f.remedy
    assert f.observed == "on cifs //milo-ark/models at /models"


def test_worker_model_dir_without_its_nfs_mount_fails(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    mdir = "/mnt/models/models--deepseek-ai--DeepSeek-V4.1-Flash"
    facts["bluey"].paths[mdir] = PathInfo(path=mdir, exists=False, mount=Mount(target="/", source="/dev/nvme0n1p2",
                                                                                fstype="ext4"))
    fails = [x for x in of(check(profile, inv, plan, facts), "storage", "bluey") if x.status == "fail"]
    assert len(fails) == 1
    assert fails[0].message == f"model dir {mdir} is missing: the NFS mount /mnt/models is not mounted"
    assert "mount /mnt/models" in fails[0].remedy and "192.168.192.11:/nvme/hf" in fails[0].remedy
    # present but on the root disk instead of the NFS mount: a warning
    facts["bluey"].paths[mdir].exists = True
    w = [x for x in of(check(profile, inv, plan, facts), "storage", "bluey") if x.status != "ok"]
    assert len(w) == 1 and w[0].status == "warn" and "not on the NFS mount" in w[0].message


def test_no_room_for_the_engram_copy_fails(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "boot10")
    facts = healthy(profile, inv, plan)
    copy = "/nvme/engram-local/df42c109f1defefcbfcedbe7d905718a12266e40"
    facts["asusi"].paths[copy] = PathInfo(path=copy, exists=False, free_bytes=20 * GiB, total_bytes=1000 * GiB)
    findings = check(profile, inv, plan, facts)
    f = [x for x in of(findings, "storage", "asusi") if x.status == "fail"][0]
    assert f"no room for the rank's Engram copy at {copy}: 20.0 GiB free, 47.2 GiB needed" == f.message
    assert "INV-36" in (f.expected or "")
    # the copy is made by the engram step after the check: its -v source is not a missing bind source
    assert only(findings, "mounts", "asusi").status == "ok"
    # the head reads Engram from the model dir in boot 10 (engram.nfs_ranks: [0]): no copy needed there
    assert not [x for x in of(findings, "storage", "reddie") if "Engram" in x.message]
    facts["asusi"].paths[copy].free_bytes = 60 * GiB
    f = [x for x in of(check(profile, inv, plan, facts), "storage", "asusi") if "Engram" in x.message][0]
    assert f.status == "warn" and "not made yet (there is room for it)" in f.message
    assert "sparkfleet engram-local" in f.remedy


def test_engram_copy_size_table() -> None:
    assert engram_copy_bytes("fp8", 4) == int(47.2 * GiB)
    assert engram_copy_bytes("nvfp4", 4) == 28 * GB
    assert engram_copy_bytes("fp8", 3) == int(47.2 * GiB) * 4 // 3  # 8 of 24 hash columns (ENG-03)
    assert engram_copy_bytes("fp8", 5) is None and engram_copy_bytes(None, 4) is None


def test_missing_cache_dir_fails_as_a_bind_source_and_a_full_disk_warns(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["reddie"].paths["/nvme/cache"].free_bytes = 0
    f = [x for x in of(check(profile, inv, plan, facts), "storage", "reddie") if "cache dir" in x.message][0]
    assert f.status == "warn" and "is full" in f.message and "FM-29" in f.message
    facts["reddie"].paths["/nvme/cache"].exists = False
    findings = check(profile, inv, plan, facts)
    assert not [x for x in of(findings, "storage", "reddie") if "cache dir" in x.message]
    f = only(findings, "mounts", "reddie")
    assert f.status == "fail" and f.message.startswith("bind-mount source /nvme/cache does not exist")


# -- bind mounts -----------------------------------------------------------------------------

def test_missing_bind_source_fails_naming_the_path(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "gb300-v23")
    facts = healthy(profile, inv, plan)
    hook = "/home/milo/dsv41/hook/sitecustomize.py"
    facts["station"].paths[hook].exists = False
    f = only(check(profile, inv, plan, facts), "mounts", "station")
    assert f.status == "fail" and f.message.startswith(f"bind-mount source {hook} does not exist")
    assert "empty directory" in f.message and "FM-12" in f.remedy and f.observed == f"{hook}: missing"


# -- image -----------------------------------------------------------------------------------

def test_image_digest_mismatch_fails_naming_both(ops: Spec) -> None:
    add_profile(ops, "dcp2-pinned", f"extends: dcp2\nimage:\n  digest: {DIGEST_A}\n")
    profile, inv, plan = lane(ops, "dcp2-pinned")
    facts = healthy(profile, inv, plan)
    assert {only(check(profile, inv, plan, facts), "image", n).status for n in facts} == {"ok"}
    repo = "aidendle94/sparkrun-vllm-dsv41-gb10"
    facts["spark4"].docker.images[0].digests = [f"{repo}@{DIGEST_B}"]
    f = only(check(profile, inv, plan, facts), "image", "spark4")
    assert f.status == "fail" and f.message == (f"image {repo}:production-1.2 on rank 3 (spark4) is not the pinned one: "
                                                f"it has {DIGEST_B}, the profile pins {DIGEST_A}")
    assert f"docker pull {repo}:production-1.2@{DIGEST_A}" in f.remedy
    assert "sparkfleet pin --profile dcp2-pinned" in f.remedy
    facts["spark4"].docker.images = []
    f = only(check(profile, inv, plan, facts), "image", "spark4")
    assert f.status == "fail" and "is not on spark4" in f.message


def test_a_missing_digest_pin_is_said_once_for_the_image(ops: Spec) -> None:
    """Every rank runs the lane's image: an unpinned one is one warning (on the first rank), not one per rank,
    and a pinned one none."""
    profile, inv, plan = lane(ops, "dcp2")
    findings = [f for f in check(profile, inv, plan, healthy(profile, inv, plan)) if f.check == "image"]
    assert [(f.node, f.status) for f in findings] == [("reddie", "warn"), ("asusi", "ok"), ("bluey", "ok"),
                                                      ("spark4", "ok")]
    assert findings[0].message == ("image aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2 has no digest pin: "
                                   "a re-pushed tag would change every rank's engine unnoticed")
    assert findings[0].field == "image.digest" and "HLT-12" in findings[0].remedy
    add_profile(ops, "dcp2-pinned", f"extends: dcp2\nimage:\n  digest: {DIGEST_A}\n")
    profile, inv, plan = lane(ops, "dcp2-pinned")
    assert {f.status for f in check(profile, inv, plan, healthy(profile, inv, plan)) if f.check == "image"} == {"ok"}


def test_image_absent_and_docker_down(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "gb300-v23")
    facts = healthy(profile, inv, plan)
    facts["station"].docker.images[0].ref = "vllm/vllm-openai:nightly"
    f = only(check(profile, inv, plan, facts), "image", "station")
    assert f.status == "fail" and "vllm/vllm-openai:deepseekv41-flash-0909 is not on station" in f.message
    facts["station"].docker = Docker(available=False, error="Cannot connect to the Docker daemon")
    findings = check(profile, inv, plan, facts)
    assert only(findings, "image", "station").status == "fail"
    assert only(findings, "conflicts", "station").status == "warn"


# -- conflicts -------------------------------------------------------------------------------

def test_foreign_container_on_the_port_fails_and_is_named(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["reddie"].docker.containers.append(Container(
        id="c1", name="glm-5.3", image="glm:latest", state="running", host_ports=[8410], network_mode="bridge"))
    f = only(check(profile, inv, plan, facts), "conflicts", "reddie")
    assert f.status == "fail" and f.message == "foreign container glm-5.3 holds :8410 (port)"
    assert "stop it yourself or pick another lane" in f.remedy and "no sparkfleet labels" in (f.observed or "")


def test_foreign_process_on_the_master_port_and_gpu_container_on_a_worker(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["reddie"].listening.append(Listener(port=29551, address="0.0.0.0", pid=4242, process="python3"))
    facts["reddie"].docker.containers.append(Container(id="c2", name="dsfv-glm", image="glm:1", state="running",
                                                       network_mode="host"))
    facts["bluey"].docker.containers.append(Container(id="c3", name="notebook", image="jupyter", state="running",
                                                      gpus=True))
    findings = check(profile, inv, plan, facts)
    f = only(findings, "conflicts", "reddie")
    assert f.status == "fail" and ":29551 (master port) is held by python3 (pid 4242) on 0.0.0.0" in f.message
    assert "dsfv-glm" in f.message  # a host-network container there is named as a suspect
    g = only(findings, "conflicts", "bluey")
    assert g.status == "fail" and g.message == "foreign container notebook holds the GPU"
    # a worker's port is not the lane's: a listener on 8410 there is no conflict
    facts["bluey"].docker.containers.clear()
    facts["bluey"].listening.append(Listener(port=8410, address="0.0.0.0", pid=5, process="nginx"))
    assert only(check(profile, inv, plan, facts), "conflicts", "bluey").status == "ok"


def test_stale_sparkfleet_container_warns(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    labels = {"sparkfleet.profile": "dcp2", "sparkfleet.rank": "1", "sparkfleet.run": "r-0917"}
    facts["asusi"].docker.containers.append(Container(id="c4", name="sf-dcp2-r1", image="x", state="running",
                                                      labels=labels, network_mode="host", gpus=True))
    labels0 = {**labels, "sparkfleet.rank": "0"}
    facts["reddie"].docker.containers.append(Container(id="c5", name="sf-dcp2-r0", image="x", state="running",
                                                       labels=labels0, network_mode="host", gpus=True))
    facts["reddie"].listening.append(Listener(port=8410, address="0.0.0.0", pid=50001, process="python3"))
    findings = check(profile, inv, plan, facts)
    f = only(findings, "conflicts", "asusi")
    assert f.status == "warn" and "earlier launch of this lane; holds the GPU" in f.message
    assert "`sparkfleet up` stops it first" in f.remedy and "FM-01" in f.remedy and "run r-0917" in (f.observed or "")
    r = of(findings, "conflicts", "reddie")
    assert {x.status for x in r} == {"warn"} and any("most likely this lane's running container sf-dcp2-r0"
                                                     in x.message for x in r)
    assert not [x for x in findings if x.status == "fail"]


def test_another_lane_on_the_gpu_is_named(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["spark4"].docker.containers.append(Container(
        id="c6", name="sf-tf1017-r3", image="nvcr.io/nvidia/pytorch:26.07-py3", state="running", gpus=True,
        labels={"sparkfleet.profile": "tf1017", "sparkfleet.rank": "3"}))
    facts["spark4"].docker.containers.append(Container(
        id="c7", name="sf-dcp1-r3", image="x", state="exited", gpus=True, labels={"sparkfleet.profile": "dcp1"}))
    f = only(check(profile, inv, plan, facts), "conflicts", "spark4")
    assert f.status == "fail" and f.message == "sparkfleet lane tf1017 holds the GPU (container sf-tf1017-r3)"
    assert "sparkfleet down --profile tf1017" in f.remedy


# -- the check command -----------------------------------------------------------------------

DCP2_RANKS = {"reddie": 0, "asusi": 1, "bluey": 2, "spark4": 3}


def good_copy(rank: int) -> dict:
    """dcp2's rank `rank` node-local Engram copy as engram_copy.py leaves a complete, verified one."""
    from sparkfleet.fleet.nodeside.engram_copy import MANIFEST_SCHEMA

    q = 96_000_000  # a quarter of a 384M-row table (ENG-01/03)
    return {"schema": MANIFEST_SCHEMA, "complete": True, "verified": True, "mode": "rows", "format": "fp8",
            "source": {"revision": "df42c109f1defefcbfcedbe7d905718a12266e40"}, "tp": {"size": 4, "rank": rank},
            "layers": {k: {"start": rank * q, "end": (rank + 1) * q} for k in ("1", "14")},
            "completed_at": "2026-12-01T09:00:00+00:00"}


class FakeTransport(RunEachByRun):
    """Records commands; drop-caches and probe answers per node come from the test."""

    def __init__(self, answers: dict[str, Result] | None = None, probe_stdout: str = "") -> None:
        self.commands: list[str] = []
        self.answers = answers or {}
        self.probe_stdout = probe_stdout
        self.closed = False

    def run(self, nodes, command, *, stdin=None, timeout_s=60.0, env=None):
        self.commands.extend([command] * len(nodes))  # one per node (run_each groups nodes sharing a command)
        if "drop_caches" in command:  # sparkfleet.fleet.ops.DropCaches
            return {n.name: self.answers.get(n.name, Result(n.name, True)) for n in nodes}
        if command.startswith("cat ") and command.endswith("/engram-manifest.json"):  # a healthy lane's copies
            return {n.name: Result(n.name, True, stdout=json.dumps(good_copy(DCP2_RANKS[n.name]))) for n in nodes}
        return {n.name: Result(n.name, True, stdout=self.probe_stdout) for n in nodes}

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_fleet(monkeypatch: pytest.MonkeyPatch):
    """Patch the transport and gathering; returns a setter for the facts the fake gather hands back."""
    state: dict = {"transport": FakeTransport(), "facts": None, "requests": None}
    # import every command module first: one that binds `gather` at import must not keep the fake
    command_modules()

    def fake_gather(transport, nodes, requests, timeout_s=30.0):
        state["requests"] = requests
        return {n.name: state["facts"][n.name] for n in nodes}

    monkeypatch.setattr("sparkfleet.fleet.connect.transport_for", lambda nodes: state["transport"])
    def fake_gather_ops(nodes, requests, timeout_s=30.0):  # check gathers through its executor
        return fake_gather(None, nodes, requests, timeout_s)
        yield  # a generator that asks no node

    monkeypatch.setattr("sparkfleet.fleet.gather.gather", fake_gather)
    monkeypatch.setattr("sparkfleet.fleet.gather.gather_ops", fake_gather_ops)
    return state


def cli(*args: str) -> int:
    return main(["check", "--root", str(REPO), *args])


def test_cli_exit_0_and_json_shape(repo_spec: Spec, fake_fleet: dict, capsys: pytest.CaptureFixture) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    fake_fleet["facts"] = healthy(profile, inv, plan)
    assert cli("--profile", "dcp2", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"profile", "inventory", "ok", "summary", "nodes", "findings", "lane"}
    assert doc["ok"] is True and doc["profile"] == "dcp2" and doc["summary"]["fail"] == 0
    assert [n["node"] for n in doc["nodes"]] == ["reddie", "asusi", "bluey", "spark4"]
    assert doc["nodes"][0] == {"node": "reddie", "rank": 0, "role": "head", "reachable": True, "simulated": False,
                               "caches_dropped": False}
    first = doc["findings"][0]
    assert {"check", "status", "message", "node"} <= set(first) and first["node"] == "reddie"
    assert fake_fleet["transport"].closed
    # only reads: each rank's Engram manifest (the one rule, as `up` judges it); nothing changed on a node
    assert fake_fleet["transport"].commands == [f"cat {MANIFEST_PATH}"] * 4
    # the facts request asks for every -v source of each node's launch
    assert "/nvme/engram-local/df42c109f1defefcbfcedbe7d905718a12266e40" in fake_fleet["requests"]["asusi"].paths


def test_cli_exit_1_on_a_failure_and_table(repo_spec: Spec, fake_fleet: dict, capsys: pytest.CaptureFixture,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["asusi"].earlyoom = EarlyOom(running=False)
    for f in facts.values():
        f.simulated = True
    fake_fleet["facts"] = facts
    assert cli("--profile", "dcp2", "--wide") == 1  # --wide: one line per row, so the row can be read whole
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if "asusi [sim]" in line and " earlyoom " in line)
    assert "FAIL" in row and "earlyoom is not running" in row and 'EARLYOOM_ARGS="-m 2"' in row
    assert "simulated lab" in text and "FAIL: 1 fail, 1 warn" in text  # the warn: no digest pin, said once


def test_cli_unreachable_node_exits_1(repo_spec: Spec, fake_fleet: dict, capsys: pytest.CaptureFixture) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts: dict = healthy(profile, inv, plan)
    facts["bluey"] = Result("bluey", False, error="hostkey-unknown", message="bluey: host key not in known_hosts")
    fake_fleet["facts"] = facts
    assert cli("--profile", "dcp2", "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    reach = [f for f in doc["findings"] if f["check"] == "reach"]
    assert reach == [{"check": "reach", "status": "fail", "message": "bluey: host key not in known_hosts",
                      "remedy": "pin the node's host key: `sparkfleet trust bluey`", "node": "bluey",
                      "observed": "hostkey-unknown", "expected": "facts from the node"}]
    assert [n["reachable"] for n in doc["nodes"]] == [True, True, False, True]


MANIFEST_PATH = "/nvme/engram-local/df42c109f1defefcbfcedbe7d905718a12266e40/engram-manifest.json"  # dcp2's copy


def test_cli_drop_caches(repo_spec: Spec, fake_fleet: dict, capsys: pytest.CaptureFixture) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    fake_fleet["facts"] = healthy(profile, inv, plan)
    fake_fleet["transport"] = FakeTransport({"bluey": Result(
        "bluey", False, stderr="sysctl: permission denied on key \"vm.drop_caches\"\n", exit_code=1,
        error="exit")})
    assert cli("--profile", "dcp2", "--drop-caches", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    commands = fake_fleet["transport"].commands
    assert [c for c in commands if not c.startswith("cat ")] == ["sync && sysctl -q -w vm.drop_caches=3"] * 4
    # and each rank's Engram manifest, judged by the one rule as `up` judges it
    assert [c for c in commands if c.startswith("cat ")] == [f"cat {MANIFEST_PATH}"] * 4
    drop = [f for f in doc["findings"] if f["check"] == "drop-caches"]
    assert len(drop) == 1 and drop[0]["node"] == "bluey" and "permission denied" in drop[0]["message"]
    assert [n["caches_dropped"] for n in doc["nodes"]][:2] == [True, True]


def test_cli_probe(repo_spec: Spec, fake_fleet: dict, capsys: pytest.CaptureFixture) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["reddie"].simulated = True  # a simulated node probes like any other: the load runs in the lane's image
    fake_fleet["facts"] = facts
    fake_fleet["transport"] = FakeTransport(probe_stdout="noise\n" + json.dumps(probe_doc(780, 0x0)) + "\n")
    assert cli("--profile", "dcp2", "--probe", "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["probes"]["asusi"]["clock"]["state"] == "latched"
    clocks = [f for f in doc["findings"] if f["check"] == "clock"]
    assert {f["status"] for f in clocks} == {"fail"} and len(clocks) == 4
    commands = [c for c in fake_fleet["transport"].commands if c != f"cat {MANIFEST_PATH}"]
    assert len(commands) == 4  # one probe per rank, the same command
    assert all("docker run --rm --pull never --gpus all" in c and "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2"
               in c and "--entrypoint python3" in c for c in commands)
    fake_fleet["transport"] = FakeTransport(probe_stdout=json.dumps(probe_doc(3003, 0x0)))
    assert cli("--profile", "dcp2", "--probe-command", "my-load --gpu 0", "--json") == 0
    assert {c.count("my-load --gpu 0") for c in fake_fleet["transport"].commands if not c.startswith("cat ")} == {1}


def test_cli_bad_input_exits_2(fake_fleet: dict, capsys: pytest.CaptureFixture) -> None:
    assert cli("--profile", "spark-vllm") == 2
    assert "abstract" in capsys.readouterr().err
    assert cli("--profile", "no-such-lane") == 2
    assert cli("--profile", "nvfp4", "--json") == 2  # a refused lane: nodes are never contacted
    assert json.loads(capsys.readouterr().out)["refused"] is True
    assert fake_fleet["requests"] is None


def test_cli_help_has_an_example(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    assert "sparkfleet check --profile dcp2" in capsys.readouterr().out


def test_run_checks_without_the_profile_loads_it_by_the_plans_name(repo_spec: Spec) -> None:
    """The runner's check step calls run_checks(plan, inventory, facts): same findings as with the profile."""
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["asusi"].meminfo.mem_available_bytes = 80 * GiB
    assert run_checks(plan, inv, facts) == run_checks(plan, inv, facts, profile=profile)


def test_a_file_the_launch_writes_first_is_not_a_missing_mount_source(repo_spec: Spec) -> None:
    """A TensorFold rank's config.env is written by the launch, then mounted: not missing before it."""
    profile, inv, plan = lane(repo_spec, "tf1017")
    facts = healthy(profile, inv, plan)
    for launch in plan.launches:
        for path in launch.files:
            facts[launch.node].paths.pop(path, None)
    findings = check(profile, inv, plan, facts)
    assert [f for f in findings if f.check == "mounts" and f.status != "ok"] == []
    launch = plan.launches[0]
    assert launch.files and all(p in launch.spec.bind_sources for p in launch.files)
