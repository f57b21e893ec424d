"""Lane rules refuse a lane before anything runs; each rule fails the right way."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.engines.vllm import required_capture_sizes
from sparkfleet.opsdir import Spec
from sparkfleet.placement import place
from sparkfleet.rules import lint

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


def findings(root: Path, profile: str) -> list:
    sp = Spec(root)
    loaded = sp.profile(profile)
    inv = sp.inventory("lab")
    return lint(loaded, inv, place(loaded, inv))


def by_check(fs: list, check: str) -> list:
    return [(f.status, f.message, f.where) for f in fs if f.check == check]


def write(root: Path, name: str, text: str) -> None:
    (root / "profiles" / f"{name}.yaml").write_text(text)


def test_required_capture_sizes_rule() -> None:
    # k=5, max_num_seqs=8: multiples of 5 and 6 up to 48; the shipped list omits 45 (OQ-02)
    assert required_capture_sizes(5, 8) == [5, 6, 10, 12, 15, 18, 20, 24, 25, 30, 35, 36, 40, 42, 45, 48]


def test_shipped_production_list_warns_about_45(repo_spec: Spec) -> None:
    loaded = repo_spec.profile("dcp2")
    inv = repo_spec.inventory("lab")
    fs = lint(loaded, inv, place(loaded, inv))
    (cap,) = [f for f in fs if f.check == "capture-sizes"]
    assert cap.status == "warn" and "miss [45]" in cap.message
    assert cap.where == "profiles/production-1.2.yaml:48"
    assert not [f for f in fs if f.status == "fail"]


def test_eager_flag_refused(ops_root: Path) -> None:
    write(ops_root, "e", "extends: dcp2\nflags:\n  --enforce-eager: true\n")
    assert by_check(findings(ops_root, "e"), "eager") == [
        ("fail", "eager mode (--enforce-eager) is the throughput ceiling: ~200 ms a step", "profiles/e.yaml:3")]


def test_no_cuda_graphs_refused(ops_root: Path) -> None:
    write(ops_root, "e", "extends: dcp2\nflags:\n  --compilation-config: {cudagraph_mode: NONE}\n")
    assert by_check(findings(ops_root, "e"), "eager") == [
        ("fail", "cudagraph_mode NONE runs eager", "profiles/e.yaml:3")]


def test_block_size_required_on_gb10(ops_root: Path) -> None:
    write(ops_root, "b", "extends: boot10\nflags:\n  --block-size: !unset\n")
    assert by_check(findings(ops_root, "b"), "block-size") == [
        ("fail", "a vLLM lane on GB10 needs --block-size 128 (has none)", "profiles/b.yaml:3")]
    write(ops_root, "b64", "extends: boot10\nflags:\n  --block-size: 64\n")
    assert by_check(findings(ops_root, "b64"), "block-size")[0][:2] == (
        "fail", "a vLLM lane on GB10 needs --block-size 128 (has 64)")


def test_block_size_not_asked_of_the_station(repo_spec: Spec) -> None:
    loaded = repo_spec.profile("gb300-v23")
    inv = repo_spec.inventory("lab")
    assert by_check(lint(loaded, inv, place(loaded, inv)), "block-size") == []


def test_jit_guard_required(ops_root: Path) -> None:
    write(ops_root, "j", "extends: dcp2\nenv:\n  MAX_JOBS: !unset\n  FLASHINFER_NVCC_THREADS: !unset\n")
    ((status, message, _),) = by_check(findings(ops_root, "j"), "jit-guard")
    assert status == "fail" and message == "no JIT-storm guard: MAX_JOBS, FLASHINFER_NVCC_THREADS not set"


def test_k_schedule_band_smaller_than_k(ops_root: Path) -> None:
    write(ops_root, "k", "extends: gb300-v23\nflags:\n  --speculative-config:\n"
          "    num_speculative_tokens_per_batch_size: [[1, 4, 5], [5, 8, 3], [9, 24, 1]]\n")
    ((status, message, _),) = by_check(findings(ops_root, "k"), "k-schedule")
    assert status == "fail"
    assert message.startswith("band [5, 8, 3] drafts k=3 inside a num_speculative_tokens=5 schedule")


def test_shipped_schedules_pass(repo_spec: Spec) -> None:
    for name in ("gb300-v22", "gb300-v23", "gb300-configc", "gb300-v12"):
        loaded = repo_spec.profile(name)
        inv = repo_spec.inventory("lab")
        assert [f for f in lint(loaded, inv, place(loaded, inv)) if f.status == "fail"] == [], name


def test_reasoning_effort_medium_refused(ops_root: Path) -> None:
    write(ops_root, "m", "extends: dcp2\nflags:\n  --default-chat-template-kwargs: {reasoning_effort: medium}\n")
    ((status, message, where),) = by_check(findings(ops_root, "m"), "reasoning-effort")
    assert (status, where) == ("fail", "profiles/m.yaml:3")
    assert "returns 400" in message


def test_station_offload_matcher(ops_root: Path) -> None:
    write(ops_root, "o", "extends: gb300-v23\nflags:\n  --cpu-offload-params: [experts.w13_weight, experts.w2_weight]\n")
    ((status, message, _),) = by_check(findings(ops_root, "o"), "offload-matcher")
    assert status == "fail"
    assert message == "offload matcher ['experts.w13_weight', 'experts.w2_weight'] is not routed_experts.*"


def test_station_megamoe_refused(ops_root: Path) -> None:
    write(ops_root, "mm", "extends: gb300-v23\nflags:\n  --moe-backend: megamoe\n")
    ((status, message, _),) = by_check(findings(ops_root, "mm"), "megamoe")
    assert status == "fail" and message.startswith("MegaMoE on one GPU")


def test_reserved_flags_and_env(ops_root: Path) -> None:
    write(ops_root, "r", "extends: dcp2\nflags:\n  --port: 9000\nenv:\n  VLLM_HOST_IP: 1.2.3.4\n")
    got = by_check(findings(ops_root, "r"), "reserved")
    assert [g[0] for g in got] == ["fail", "fail"]
    assert got[0][1] == "--port is set by sparkfleet from the profile and inventory"
    assert got[1][1] == "env VLLM_HOST_IP is per node and comes from the inventory"


def test_plan_says_example_values_once_and_no_digest_warning(ops_root: Path) -> None:
    """One example-values warning for the lane (the profile's fields and the inventory's), and no digest
    warning in plan: `check` says that once per image (checks/image.py)."""
    got = [(f.check, f.message) for f in findings(ops_root, "boot10") if f.status == "warn"]
    assert [c for c, _ in got].count("example-values") == 1
    assert not [m for _, m in got if "digest" in m]  # checks/image.py's warning is check `image`, "no digest pin"
    assert ("example-values", "example values, not from the seeds: profile: image.ref, flags.--max-num-seqs; "
            "inventory 'lab': node addresses, HCAs and interfaces") in got
    assert [f.message for f in findings(ops_root, "dcp2") if f.check == "example-values"] == [
        "example values, not from the seeds: inventory 'lab': node addresses, HCAs and interfaces"]


def test_boot10_head_reads_engram_from_its_local_checkpoint(repo_spec: Spec, ops_root: Path) -> None:
    """Boot 10 copied rows to the three workers; reddie holds the checkpoint on local NVMe and reads its
    rows there (seed 002: "Engram rows node-local on every rank"), so it is not an NFS warning. A worker
    listed in nfs_ranks still is."""
    loaded = repo_spec.profile("boot10")
    inv = repo_spec.inventory("lab")
    got = [(f.status, f.node, f.message) for f in lint(loaded, inv, place(loaded, inv)) if f.check == "engram-nfs"]
    assert got == [("ok", "reddie", "rank 0 (reddie) reads Engram rows from its local checkpoint "
                    "(the model is on this node's disk)")]
    write(ops_root, "b", "extends: boot10\nengram:\n  nfs_ranks: [0, 2]\n")
    assert [(f.status, f.node) for f in findings(ops_root, "b") if f.check == "engram-nfs"] == [
        ("ok", "reddie"), ("warn", "bluey")]


@pytest.mark.parametrize("profile, reason", [
    ("nvfp4", "lane 'nvfp4' never served: fourteen boots of nvidia/DeepSeek-V4.1-Flash-NVFP4 never served"),
])
def test_plan_refuses_unservable(capsys, profile: str, reason: str) -> None:
    assert main(["plan", "--profile", profile]) == 2
    err = " ".join(capsys.readouterr().err.split())  # findings wrap at whole words to the width
    assert reason in err and "refused" in err


def test_plan_refuses_eager_with_exit_2(ops_root: Path, capsys) -> None:
    write(ops_root, "e", "extends: dcp2\nflags:\n  --enforce-eager: true\n")
    assert main(["plan", "--profile", "e", "--root", str(ops_root)]) == 2
    err = capsys.readouterr().err
    assert "FAIL eager (profiles/e.yaml:3): eager mode (--enforce-eager)" in err
    assert "remove --enforce-eager" in err
