"""llama.cpp lanes: the plan (rpc-server on the workers first, then llama-server with their --rpc; exact
argv) and the rules that refuse a lane before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.opsdir import Spec
from sparkfleet.placement import place
from sparkfleet.rules import lint

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

LABELS = ["--label", "sparkfleet.profile={p}", "--label", "sparkfleet.rank={r}", "--label", "sparkfleet.run=plan"]


def labels(profile: str, rank: int) -> list[str]:
    return [t.format(p=profile, r=rank) for t in LABELS]


def launches(capsys, profile: str) -> list[dict]:
    assert main(["plan", "--profile", profile, "--json"]) == 0
    return [s for s in json.loads(capsys.readouterr().out)["steps"] if s["step"] == "launch"]


def findings(root: Path, profile: str) -> list:
    sp = Spec(root)
    loaded = sp.profile(profile)
    inv = sp.inventory("lab")
    return lint(loaded, inv, place(loaded, inv))


def fails(root: Path, profile: str) -> list[tuple]:
    return [(f.check, f.field, f.node, f.message) for f in findings(root, profile) if f.status == "fail"]


def test_four_sparks_workers_first_then_the_head_with_their_rpc(capsys) -> None:
    got = launches(capsys, "llamacpp-sparks")
    assert [(x["node"], x["rank"], x["wave"], x["parallel"]) for x in got] == [
        ("asusi", 1, 1, True), ("bluey", 2, 1, True), ("spark4", 3, 1, True), ("reddie", 0, 2, False)]
    unset = "<image unset: set image.ref>"
    for x, ip in zip(got[:3], ("192.168.192.12", "192.168.192.13", "192.168.192.14"), strict=True):
        assert x["argv"] == ["docker", "run", "-d", "--name", f"sf-llamacpp-sparks-r{x['rank']}",
                             *labels("llamacpp-sparks", x["rank"]), "--network", "host", "--gpus", "all",
                             "--entrypoint", "/app/rpc-server", unset, "--host", ip, "--port", "50052"]
        assert x["env"] == {}
    assert got[3]["argv"] == [
        "docker", "run", "-d", "--name", "sf-llamacpp-sparks-r0", *labels("llamacpp-sparks", 0),
        "--network", "host", "--gpus", "all", "--entrypoint", "/app/llama-server",
        "-v", "/nvme/hf/gguf/model-Q4_K_M.gguf:/models/model-Q4_K_M.gguf:ro", unset,
        "--model", "/models/model-Q4_K_M.gguf", "--alias", "llama", "--host", "127.0.0.1", "--port", "8080",
        "--rpc", "192.168.192.12:50052,192.168.192.13:50052,192.168.192.14:50052",
        "--ctx-size", "32768", "--n-gpu-layers", "999", "--metrics"]


def test_single_spark_has_no_rpc(capsys) -> None:
    (head,) = launches(capsys, "llamacpp-spark")
    assert head["node"] == "reddie" and "--rpc" not in head["argv"]
    assert head["argv"][-9:] == ["--host", "127.0.0.1", "--port", "8080", "--ctx-size", "32768",
                                 "--n-gpu-layers", "999", "--metrics"]


def test_unset_image_warns_in_plan(capsys) -> None:
    assert main(["plan", "--profile", "llamacpp-sparks", "--json"]) == 0
    found = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["check"] == "image"]
    assert [(f["status"], f["field"]) for f in found] == [("warn", "image")]


def test_no_model_path_is_refused(ops_root: Path) -> None:
    (ops_root / "profiles" / "x.yaml").write_text("extends: llamacpp-spark\nllamacpp:\n  gguf: !unset\n")
    assert fails(ops_root, "x") == [("llamacpp-model", "llamacpp.gguf", None,
                                     "no GGUF file: llama-server needs --model")]
    assert main(["plan", "--profile", "x", "--root", str(ops_root)]) == 2


def test_context_size_and_jinja_for_tools(ops_root: Path) -> None:
    (ops_root / "profiles" / "x.yaml").write_text(
        "extends: llamacpp-spark\ntools: true\nflags:\n  --ctx-size: !unset\n")
    assert [(c, f) for c, f, _, _ in fails(ops_root, "x")] == [("llamacpp-context", "flags.--ctx-size"),
                                                             ("llamacpp-jinja", "flags.--jinja")]
    (ops_root / "profiles" / "y.yaml").write_text("extends: llamacpp-spark\ntools: true\nflags:\n  --jinja: true\n")
    assert fails(ops_root, "y") == []


def test_a_worker_without_an_rpc_port_is_named(ops_root: Path) -> None:
    (ops_root / "profiles" / "x.yaml").write_text(
        "extends: llamacpp-sparks\nllamacpp:\n  rpc_ports:\n    bluey: !unset\n")
    assert fails(ops_root, "x") == [("llamacpp-rpc", "llamacpp.rpc_ports.bluey", "bluey",
                                     "worker bluey has no rpc-server port")]


def test_vllm_rules_do_not_apply_and_reserved_flags_do(ops_root: Path) -> None:
    (ops_root / "profiles" / "x.yaml").write_text(
        "extends: llamacpp-sparks\nflags:\n  --port: 9\n  --enforce-eager: true\n")
    assert [(c, f) for c, f, _, _ in fails(ops_root, "x")] == [("reserved", "flags.--port")]


def test_the_station_heads_the_four_sparks_over_the_fabric(capsys) -> None:
    got = launches(capsys, "llamacpp-lab-station")
    assert [(x["node"], x["rank"], x["wave"]) for x in got] == [
        ("reddie", 1, 1), ("asusi", 2, 1), ("bluey", 3, 1), ("spark4", 4, 1), ("station", 0, 2)]
    sparks = ("192.168.192.11", "192.168.192.12", "192.168.192.13", "192.168.192.14")
    for x, ip in zip(got[:4], sparks, strict=True):
        assert x["argv"][-4:] == ["--host", ip, "--port", "50052"]
    head = got[4]["argv"]
    assert head[head.index("--rpc") + 1] == ",".join(f"{ip}:50052" for ip in sparks)
    # the GGUF from the Station's own model root (INV-53's /models)
    assert "/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf:/models/gemma-3-270m-q4_k_m.gguf:ro" in head


def test_a_head_without_a_fabric_ip_is_refused(ops_root: Path) -> None:
    inv = ops_root / "inventories" / "lab.yaml"
    text = inv.read_text()
    inv.write_text(text.replace("    fabric_ip: 192.168.192.20             # example\n", ""))
    assert fails(ops_root, "llamacpp-lab-station") == [(
        "llamacpp-fabric", "nodes.station.fabric_ip", "station",
        "station (rank 0) has no fabric_ip: llama-server would reach the rpc-servers' fabric addresses over "
        "another network (management), not the fabric")]
    assert main(["plan", "--profile", "llamacpp-lab-station", "--root", str(ops_root)]) != 0
