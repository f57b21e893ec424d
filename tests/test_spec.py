"""The spec: shipped files load; `extends` merges; bad input names file, line and field (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.opsdir import Spec
from sparkfleet.schema.errors import SpecError

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

SERVABLE = ["1017g", "boot10", "dcp1", "dcp2", "dcp4", "exl3-1017-full", "exl3tp3", "exl3tp3a10", "exl3tp4b",
            "exl3tp4b-ablit-best", "gb300-1017-v21cfg", "gb300-configc", "gb300-v11", "gb300-v12", "gb300-v18",
            "gb300-v22", "gb300-v23", "llamacpp-lab", "llamacpp-lab-station", "llamacpp-spark", "llamacpp-sparks", "local-gemma", "production-1.0-dcp2set", "production-1.0-tonyd2wild", "production-1.1",
            "sglang-dryrun", "speedrun2", "tf1017", "tf1017-rail2", "vllm-lab", "vllm-lab-station"]


def test_every_shipped_profile_loads(repo_spec: Spec) -> None:
    names = repo_spec.profile_names()
    lanes = [n for n in names if not repo_spec.profile(n).profile.abstract]
    assert sorted(n for n in lanes if repo_spec.profile(n).profile.servable) == sorted(SERVABLE)
    assert [n for n in lanes if not repo_spec.profile(n).profile.servable] == ["nvfp4"]
    assert sorted(set(names) - set(lanes)) == ["gb300-vllm", "production-1.2", "spark-vllm"]


def test_lab_inventory(repo_spec: Spec) -> None:
    inv = repo_spec.inventory("lab")
    assert inv.groups == {"sparks": ["reddie", "asusi", "bluey", "spark4"], "station": ["station"],
                      "mixed": ["station", "reddie", "asusi", "bluey", "spark4"]}
    assert inv.example is True
    reddie = inv.nodes["reddie"]
    assert reddie.storage.model_local and reddie.storage.nfs_export.options == "ro,no_subtree_check"
    for name in ("asusi", "bluey", "spark4"):
        node = inv.nodes[name]
        assert node.storage.nfs_mount.options == "_netdev,nofail"
        assert node.storage.engram_local_dir
    gb10 = inv.hardware(reddie)
    assert (gb10.gpu_memory_gib, gb10.sms, gb10.earlyoom_percent) == (121, 48, 2)
    gb300 = inv.hardware(inv.nodes["station"])
    assert (gb300.gpu_memory_gib, gb300.host_memory_gib) == (250.7, 494)


def test_extends_deep_merges_dicts(repo_spec: Spec) -> None:
    p = repo_spec.profile("dcp2")
    assert p.chain == ["profiles/spark-vllm.yaml", "profiles/production-1.2.yaml", "profiles/dcp2.yaml"]
    prof = p.profile
    # env from all three files, in base-first order
    assert prof.env["MAX_JOBS"] == "2" and prof.env["VLLM_ENABLE_ROCE_ALLREDUCE"] == "1"
    assert prof.env["DSV41_DCP_STAGE"] == "3"
    assert list(prof.env)[0] == "DSV41_ENGRAM_DISK"
    # a nested flag dict: production's speculative keys on top of the base's
    assert prof.flags["--speculative-config"] == {
        "method": "dspark", "num_speculative_tokens": 5, "draft_sample_method": "probabilistic",
        "rejection_sample_method": "block", "enable_adaptive_verification": False}
    assert prof.dcp == 2 and prof.port == 8410 and prof.expect.kv_tokens.min == 1888800
    assert prof.abstract is False and prof.description.startswith("Production, DCP2")


def test_extends_replaces_lists_and_unset_removes(repo_spec: Spec) -> None:
    v12 = repo_spec.profile("gb300-v12").profile
    assert v12.docker["--ulimit"] == ["memlock=-1"]  # list replaced, not appended
    assert "num_speculative_tokens_per_batch_size" not in v12.flags["--speculative-config"]
    assert repo_spec.profile("dcp4").profile.expect.kv_tokens is None
    assert repo_spec.profile("boot10").profile.engram.nfs_ranks == [0]
    assert repo_spec.profile("1017g").profile.engram.nfs_ranks == []


def _run(root: Path, *argv: str, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = main([*argv, "--root", str(root)])
    captured = capsys.readouterr()
    return code, captured.err.strip()


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("text, expected", [
    ("extends: dcp2\nport: [8410\n", "profiles/bad.yaml:3: malformed YAML: expected ',' or ']', but got '<stream end>' "
     "(while parsing a flow sequence started at line 2)"),
    ("extends: dcp2\n\nportt: 8410\n", "profiles/bad.yaml:3: portt: unknown field"),
    ("extends: dcp2\nport: eighty\n", "profiles/bad.yaml:2: port: Input should be a valid integer"),
    ("extends: dcp2\nflags:\n  --block-size: 128\n  block: 1\n", "profiles/bad.yaml:4: flags.block: 'block' is not a flag name (expected --name)"),
    ("extends: dcp2\nenv:\n  BAD-NAME: 1\n", "profiles/bad.yaml:3: env.BAD-NAME: 'BAD-NAME' is not a valid environment variable name"),
    ("extends: nosuch\n", "profiles/bad.yaml:1: extends: no profile named 'nosuch'"),
    ("extends: dcp2\nimage: {ref: x, digest: 'sha256:abc'}\n", "profiles/bad.yaml:2: image.digest: expected 'sha256:' followed by 64 lowercase hex digits"),
    ("extends: dcp2\nmodel: {repo_dir: ../../etc}\n", "profiles/bad.yaml:2: model.repo_dir: must be a directory name under the node's model_root"),
    ("extends: dcp2\nservable: false\n", "profiles/bad.yaml:2: servable: servable: false needs unservable_reason"),
])
def test_profile_errors_name_file_line_field(ops_root: Path, capsys, text: str, expected: str) -> None:
    _write(ops_root, "profiles/bad.yaml", text)
    code, err = _run(ops_root, "plan", "--profile", "bad", capsys=capsys)
    assert code == 2
    assert err.startswith("sparkfleet: " + expected), err
    assert "Traceback" not in err


def test_errors_in_a_base_point_at_the_base(ops_root: Path, capsys) -> None:
    _write(ops_root, "profiles/base-bad.yaml", "abstract: true\nengine: vllm\ntp: many\n")
    _write(ops_root, "profiles/child.yaml", "extends: base-bad\n")
    code, err = _run(ops_root, "plan", "--profile", "child", capsys=capsys)
    assert code == 2 and err.startswith("sparkfleet: profiles/base-bad.yaml:3: tp: Input should be a valid integer")


def test_extends_cycle(ops_root: Path, capsys) -> None:
    _write(ops_root, "profiles/a.yaml", "extends: b\n")
    _write(ops_root, "profiles/b.yaml", "extends: a\n")
    code, err = _run(ops_root, "plan", "--profile", "a", capsys=capsys)
    assert code == 2
    assert err == ("sparkfleet: profiles/a.yaml: extends cycle: profiles/a.yaml -> profiles/b.yaml -> profiles/a.yaml")


def test_missing_profile(ops_root: Path, capsys) -> None:
    code, err = _run(ops_root, "plan", "--profile", "dcp3", capsys=capsys)
    assert code == 2 and err.startswith("sparkfleet: no profile named 'dcp3' (known: 1017g, boot10, dcp1, dcp2")


def test_group_with_no_nodes(ops_root: Path, capsys) -> None:
    inv = (ops_root / "inventories/lab.yaml").read_text().replace("  station: [station]", "  station: []")
    _write(ops_root, "inventories/lab.yaml", inv)
    code, err = _run(ops_root, "plan", "--profile", "dcp2", capsys=capsys)
    line = inv.splitlines().index("  station: []") + 1
    assert code == 2 and err == f"sparkfleet: inventories/lab.yaml:{line}: groups.station: group has no nodes"


def test_group_names_unknown_node(ops_root: Path, capsys) -> None:
    inv = (ops_root / "inventories/lab.yaml").read_text().replace("[station]", "[station, stationn]")
    _write(ops_root, "inventories/lab.yaml", inv)
    code, err = _run(ops_root, "plan", "--profile", "gb300-v23", capsys=capsys)
    assert code == 2 and "groups.station: names node 'stationn', which is not under nodes:" in err


def test_more_ranks_than_group(ops_root: Path, capsys) -> None:
    _write(ops_root, "profiles/tp8.yaml", "extends: dcp2\ntp: 8\n")
    code, err = _run(ops_root, "plan", "--profile", "tp8", capsys=capsys)
    assert code == 2
    assert err == ("sparkfleet: profiles/tp8.yaml:2: tp: the lane needs 8 ranks (tp: 8) but group 'sparks' has 4 "
                   "node(s) (profiles/spark-vllm.yaml:8)")


def test_rank_order_outside_group(ops_root: Path, capsys) -> None:
    _write(ops_root, "profiles/r.yaml", "extends: exl3tp3\nranks: [reddie, asusi, station]\n")
    code, err = _run(ops_root, "plan", "--profile", "r", capsys=capsys)
    assert code == 2 and err.startswith("sparkfleet: profiles/r.yaml:2: ranks: node 'station' is not in group 'sparks'")


def test_unknown_playbook_step(ops_root: Path, capsys) -> None:
    _write(ops_root, "playbooks/up.yaml", "name: up\nsteps:\n  - stop\n  - launch: {role: workers}\n  - lauch\n")
    code, err = _run(ops_root, "plan", "--profile", "dcp2", capsys=capsys)
    assert code == 2 and err.startswith("sparkfleet: playbooks/up.yaml:5: steps.2: unknown step 'lauch'; known steps: stop, facts")


def test_inventory_fabric_ip_outside_subnet(ops_root: Path, capsys) -> None:
    inv = (ops_root / "inventories/lab.yaml").read_text().replace("fabric_ip: 192.168.192.13", "fabric_ip: 10.0.0.13")
    _write(ops_root, "inventories/lab.yaml", inv)
    code, err = _run(ops_root, "plan", "--profile", "dcp2", capsys=capsys)
    assert code == 2 and "nodes.bluey.fabric_ip: 10.0.0.13 is outside fabric_subnet 192.168.192.0/24" in err


def test_missing_inventory_file(ops_root: Path, capsys) -> None:
    code, err = _run(ops_root, "plan", "--profile", "dcp2", "--inventory", "nope", capsys=capsys)
    assert code == 2 and err == "sparkfleet: inventories/nope.yaml: no such inventory (known: lab)"


def test_spec_error_str() -> None:
    assert str(SpecError("bad", "f.yaml", 3, "a.b")) == "f.yaml:3: a.b: bad"
    assert str(SpecError("bad")) == "bad"
