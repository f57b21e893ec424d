"""`plan`: golden argv/env for every servable lane, ordering, quoting, and running the rendered shell."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.opsdir import Spec
from sparkfleet.plan import make_plan
from tests.test_spec import SERVABLE

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

GOLDEN = Path(__file__).parent / "golden" / "plan"


def plan_json(capsys, *argv: str) -> dict:
    code = main(["plan", *argv, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


@pytest.mark.parametrize("profile", SERVABLE)
def test_plan_matches_golden(capsys, profile: str) -> None:
    """The full plan (every argv and env) for each shipped servable lane; regenerate with UPDATE_GOLDEN=1
    and review the diff like code."""
    got = plan_json(capsys, "--profile", profile)
    path = GOLDEN / f"{profile}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads(path.read_text())


def launches(plan: dict) -> list[dict]:
    return [s for s in plan["steps"] if s["step"] == "launch"]


def test_dcp2_workers_then_head_with_exact_per_node_argv(capsys) -> None:
    plan = plan_json(capsys, "--profile", "dcp2")
    assert [s["step"] for s in plan["steps"]][:10] == ["stop", "drop_caches", "facts", "patches", "engine_build", "check",
                                                     "probe", "fabric_probe", "engram", "rail2_up"]
    ls = launches(plan)
    assert [(s["node"], s["rank"], s["role"], s["wave"], s["parallel"]) for s in ls] == [
        ("asusi", 1, "worker", 1, True), ("bluey", 2, "worker", 1, True), ("spark4", 3, "worker", 1, True),
        ("reddie", 0, "head", 2, False)]
    head, worker = ls[3], ls[0]
    assert head["argv"][-9:] == ["--distributed-executor-backend", "mp", "--nnodes", "4", "--node-rank", "0",
                                 "--master-addr", "192.168.192.11", "--master-port", "29551"][-9:]
    assert worker["argv"][-1] == "--headless" and "--headless" not in head["argv"]
    assert worker["argv"][worker["argv"].index("--node-rank") + 1] == "1"
    assert head["env"]["VLLM_HOST_IP"] == "192.168.192.11" and worker["env"]["VLLM_HOST_IP"] == "192.168.192.12"
    assert head["env"]["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
    assert head["env"]["B12X_ROCE_GID_INDEX"] == "auto"  # resolved from facts at launch
    assert head["env"]["DSV41_DCP_STAGE"] == "3" and head["env"]["MAX_JOBS"] == "2"
    # the head reads the model from local NVMe, workers from the NFS mount
    assert "/nvme/hf/models--deepseek-ai--DeepSeek-V4.1-Flash:/models/repo:ro" in head["argv"]
    assert "/mnt/models/models--deepseek-ai--DeepSeek-V4.1-Flash:/models/repo:ro" in worker["argv"]
    argv = head["argv"]
    i = argv.index("aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2")
    assert argv[i + 1] == "/models/repo/snapshots/df42c109f1defefcbfcedbe7d905718a12266e40"
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "6442450944"
    assert argv[argv.index("--decode-context-parallel-size") + 1] == "2"
    assert argv[argv.index("--speculative-config") + 1] == (
        '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic",'
        '"rejection_sample_method":"block","enable_adaptive_verification":false}')
    # every -e in argv is in env and nothing else is
    pairs = [argv[j + 1] for j in range(i) if argv[j] == "-e"]
    assert pairs == [f"{k}={v}" for k, v in head["env"].items()]


def test_tensorfold_starts_ranks_3_2_1_then_0(capsys) -> None:
    ls = launches(plan_json(capsys, "--profile", "tf1017"))
    assert [(s["rank"], s["node"], s["wave"], s["parallel"]) for s in ls] == [
        (3, "spark4", 1, False), (2, "bluey", 2, False), (1, "asusi", 3, False), (0, "reddie", 4, False)]
    head = ls[3]
    recipe = "/opt/deepseek-v4.1-tensorfold-tp4-4xgb10"
    # each rank a labelled container of the profile's image, recipe dir and its own config.env mounted,
    # the serve script in the foreground (issue 12 item 5; the contract in TEAM.md)
    assert head["argv"] == [
        "docker", "run", "-d", "--name", "sf-tf1017-r0", "--label", "sparkfleet.profile=tf1017",
        "--label", "sparkfleet.rank=0", "--label", "sparkfleet.run=plan", "--network", "host", "--gpus", "all",
        "-v", f"{recipe}:{recipe}", "-v", f"{recipe}/.sparkfleet-tf1017-r0.config.env:{recipe}/config.env:ro",
        "-v", "/DeepSeek-V4.1-Flash-1017-EXL3-3.5bpw:/DeepSeek-V4.1-Flash-1017-EXL3-3.5bpw:ro",
        "nvcr.io/nvidia/pytorch:26.07-py3", "bash", f"{recipe}/scripts/serve.sh", "start"]
    assert list(head["files"]) == [f"{recipe}/.sparkfleet-tf1017-r0.config.env"]
    assert (head["env"]["HOST"], head["env"]["PORT"], head["env"]["RANK"]) == ("127.0.0.1", "8001", "0")
    assert head["env"]["RDMA_HCA"] == "rocep1s0f0"  # one rail
    assert head["env"]["SERVE_ARGS"] == ("--context 1048576 --streams 16 --round-rows 48 --pool 2097152 "
                                         "--no-thinking --max-tokens 32768")


def test_rail2_uses_both_hcas_and_patch_0004_env(capsys) -> None:
    head = launches(plan_json(capsys, "--profile", "tf1017-rail2"))[3]
    assert (head["env"]["HOST"], head["env"]["PORT"]) == ("0.0.0.0", "8000")
    assert head["env"]["RDMA_HCA"] == "rocep1s0f0,roceP2p1s0f0"
    assert (head["env"]["TF_SEED_RANDOM"], head["env"]["TF_TOP_K_MAX"]) == ("1", "56")


def test_station_single_node_launch(capsys) -> None:
    (launch,) = launches(plan_json(capsys, "--profile", "gb300-v23"))
    argv = launch["argv"]
    assert (launch["node"], launch["rank"], launch["role"]) == ("station", 0, "head")
    assert "/models/DeepSeek-V4.1-Flash-1017-1bae0e1088993b9b82de08f59de5be5a34e42170:/model:ro" in argv
    assert "/home/milo/dsv41/vllm-cache:/root/.cache/vllm" in argv
    assert "/home/milo/dsv41/hook/sitecustomize.py:/usr/lib/python3.12/sitecustomize.py:ro" in argv
    assert launch["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "pinned_max_cached_size_mb:1024"
    assert argv[argv.index("--cpu-offload-params") + 1: argv.index("--cpu-offload-params") + 3] == [
        "routed_experts.w13_weight", "routed_experts.w2_weight"]
    assert argv[argv.index("--speculative-config") + 1] == (
        '{"method":"dspark","num_speculative_tokens":5,"num_speculative_tokens_per_batch_size":[[1,8,5],[9,24,1]]}')
    assert argv.count("--ulimit") == 2 and argv[-4:] == ["--host", "0.0.0.0", "--port", "30006"]
    assert "--nnodes" not in argv


def test_capture_sizes_generated_when_unlisted(ops_root: Path) -> None:
    (ops_root / "profiles" / "g.yaml").write_text(
        "extends: dcp2\nflags:\n  --compilation-config: {cudagraph_capture_sizes: !unset }\n")
    sp = Spec(ops_root)
    plan = make_plan(sp.profile("g"), sp.inventory("lab"), sp.playbook("up"), ops_root)
    argv = plan.launches[0].argv
    cc = json.loads(argv[argv.index("--compilation-config") + 1])
    assert cc == {"cudagraph_mode": "FULL_AND_PIECEWISE",
                  "cudagraph_capture_sizes": [5, 6, 10, 12, 15, 18, 20, 24, 25, 30, 35, 36, 40, 42, 45, 48]}
    assert not [f for f in plan.findings if f.check == "capture-sizes"]


HOSTILE = "$(touch {d}/pwned); rm -rf {d}/victim; `touch {d}/pwned2` 'q\" \\n"


def hostile_profile(root: Path, d: Path) -> str:
    v = HOSTILE.format(d=d)
    q = json.dumps(v)  # a YAML double-quoted scalar
    (root / "profiles" / "evil.yaml").write_text(f"""extends: dcp2
served_names: [{q}]
env:
  EVIL: {q}
flags:
  --evil-flag: {q}
  --evil-json: {{"k": {q}}}
mounts:
  - {{source: {json.dumps("/x/" + v)}, target: /y}}
image:
  ref: {q}
model:
  snapshot: {q}
""")
    return v


def test_hostile_values_render_as_inert_arguments(ops_root: Path, tmp_path: Path) -> None:
    d = tmp_path / "trap"
    d.mkdir()
    (d / "victim").write_text("still here")
    v = hostile_profile(ops_root, d)
    sp = Spec(ops_root)
    plan = make_plan(sp.profile("evil"), sp.inventory("lab"), sp.playbook("up"), ops_root)
    head = plan.launches[-1]
    argv = head.argv
    assert argv[argv.index("--served-model-name") + 1] == v
    assert argv[argv.index("--evil-flag") + 1] == v
    assert json.loads(argv[argv.index("--evil-json") + 1]) == {"k": v}
    assert f"EVIL={v}" in argv and head.env["EVIL"] == v
    assert f"/x/{v}:/y:ro" in argv and v in argv and f"/models/repo/snapshots/{v}" in argv
    # Run the rendered shell under set -euo pipefail with `docker` replaced by a recorder: the shell
    # sees exactly argv, and none of the hostile text ran.
    record = tmp_path / "argv.bin"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {shlex.quote(str(record))}\n")
    (fake / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", "set -euo pipefail\n" + head.script], env=env, check=True)
    assert record.read_bytes().split(b"\0")[:-1] == [a.encode() for a in argv[1:]]
    assert sorted(p.name for p in d.iterdir()) == ["victim"]


@pytest.mark.parametrize("profile", SERVABLE)
def test_rendered_shell_is_what_argv_says(profile: str, tmp_path: Path, repo_spec: Spec) -> None:
    """Every launch script parses under bash -n and `set -u`, and runs as exactly its argv."""
    plan = make_plan(repo_spec.profile(profile), repo_spec.inventory("lab"), repo_spec.playbook("up"),
                     repo_spec.root)
    fake = tmp_path / "bin"
    fake.mkdir()
    record = tmp_path / "argv.bin"
    (fake / "docker").write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {shlex.quote(str(record))}\n")
    (fake / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    for launch in plan.launches:
        if launch.argv[0] != "docker":
            assert shlex.split(launch.script, comments=True) == launch.argv
            continue
        subprocess.run(["bash", "-c", "set -euo pipefail\n" + launch.script], env=env, check=True)
        assert record.read_bytes().split(b"\0")[:-1] == [a.encode() for a in launch.argv[1:]]


def test_tensorfold_config_env_sources_cleanly(repo_spec: Spec, tmp_path: Path) -> None:
    plan = make_plan(repo_spec.profile("tf1017-rail2"), repo_spec.inventory("lab"), repo_spec.playbook("up"),
                     repo_spec.root)
    launch = plan.launches[0]
    ((path, content),) = launch.files.items()
    assert path == "/opt/deepseek-v4.1-tensorfold-tp4-4xgb10/.sparkfleet-tf1017-rail2-r3.config.env"
    f = tmp_path / "config.env"
    f.write_text(content)
    keys = list(launch.env)
    out = subprocess.run(["bash", "-c", f"set -euo pipefail; . {shlex.quote(str(f))}; "
                          + "; ".join(f'printf "%s\\0" "${k}"' for k in keys)],
                         capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [launch.env[k].encode() for k in keys]


def test_plan_human_output(capsys) -> None:
    assert main(["plan", "--profile", "dcp2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("plan dcp2 (up on inventory lab): rank 0 reddie, rank 1 asusi, rank 2 bluey, "
                                   "rank 3 spark4")
    assert "11. launch       rank 1 on asusi (worker, wave 1 (in parallel))" in out
    assert "14. launch       rank 0 on reddie (head, wave 2)" in out
    assert "WARN capture-sizes (profiles/production-1.2.yaml:48): capture sizes miss [45]" in out


def test_abstract_base_is_not_a_lane(capsys) -> None:
    assert main(["plan", "--profile", "production-1.2"]) == 2
    assert "is a base for other lanes (abstract: true)" in capsys.readouterr().err


def test_profiles_and_show(capsys) -> None:
    assert main(["profiles", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert sorted(rows) == sorted([*SERVABLE, "nvfp4"])
    assert (rows["dcp2"]["engine"], rows["dcp2"]["group"], rows["dcp2"]["port"], rows["dcp2"]["servable"]) == (
        "vllm", "sparks", 8410, True)
    assert rows["nvfp4"]["servable"] is False and rows["tf1017"]["port"] == 8001
    assert rows["nvfp4"]["refused"].startswith("fourteen boots of nvidia/DeepSeek-V4.1-Flash-NVFP4 never served")
    # `up` refuses a lane whose patch set the seeds do not list (its patches step): profiles says so, and why
    assert (rows["boot10"]["servable"], rows["boot10"]["refused"]) == (
        False, "patch set 'vllm-lanes' is not known in full (the seeds do not list its files or checksums)")
    assert rows["llamacpp-sparks"]["refused"] == "the lane names no image (set image.ref)"
    assert sorted(n for n, r in rows.items() if not r["servable"]) == [
        "1017g", "boot10", "exl3-1017-full", "exl3tp3", "exl3tp3a10", "exl3tp4b", "exl3tp4b-ablit-best",
        "llamacpp-spark", "llamacpp-sparks", "nvfp4", "production-1.0-dcp2set", "production-1.0-tonyd2wild",
        "speedrun2", "tf1017", "tf1017-rail2"]
    # `up` refuses a lane whose engine was never built (its engine_build step): no pin in this state dir
    assert rows["tf1017"]["refused"] == "its engine is not built here (sparkfleet build --profile tf1017)"
    assert "refused" not in rows["dcp2"]
    assert main(["show", "dcp2", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["files"][-1] == "profiles/dcp2.yaml" and shown["profile"]["dcp"] == 2


def test_tensorfold_rank_command_overrides_the_serve_script(capsys) -> None:
    ls = launches(plan_json(capsys, "--profile", "tf1017", "-o",
                            'tensorfold.rank_command=["python3", "-m", "tensorfold.serve", "--config", "x y"]'))
    for s in ls:
        argv = s["argv"]
        assert argv[argv.index("nvcr.io/nvidia/pytorch:26.07-py3") + 1:] == [
            "python3", "-m", "tensorfold.serve", "--config", "x y"]
        assert s["script"].endswith("nvcr.io/nvidia/pytorch:26.07-py3 \\\npython3 -m tensorfold.serve --config 'x y'")


@pytest.mark.parametrize("profile", SERVABLE)
def test_a_run_s_plan_bound_after_facts_is_the_plan_rendered_with_them(profile: str) -> None:
    """A run renders its plan once, before facts, with each `auto` GID index as a slot; binding the indexes facts
    resolve gives exactly what rendering with them gives (argv, env, shell, files, container spec, plan steps),
    binding none gives the plain plan (`auto`), and no slot is left either way."""
    import dataclasses

    sp = Spec(Path(__file__).resolve().parent.parent)
    loaded, inventory, playbook = sp.profile(profile), sp.inventory("lab"), sp.playbook("up")
    gids = {n: 1 + i for i, n in enumerate(inventory.nodes)}  # not the inventory's fixed values, to be seen
    gids.update({n.name: int(n.rdma.gid_index) for n in inventory.nodes.values()
                 if n.rdma is not None and n.rdma.gid_index != "auto"})

    def shape(plan) -> dict:
        return {"plan": plan.as_dict(), "launches": [dataclasses.asdict(x) for x in plan.launches]}

    for given in (gids, {}):
        late = make_plan(loaded, inventory, playbook, sp.root, run_id="r1", late_gids=True)
        slots = "@sparkfleet-gid:" in json.dumps(shape(late), default=str)
        late.bind_gids(given)
        got = shape(late)
        assert "@sparkfleet-gid:" not in json.dumps(got, default=str)
        assert got == shape(make_plan(loaded, inventory, playbook, sp.root, run_id="r1", gid_index=given))
    auto = any(n.rdma is not None and n.rdma.gid_index == "auto" for n in inventory.nodes.values())
    if profile in ("dcp2", "tf1017"):  # lanes whose launch carries the GID: the slot was there to bind
        assert auto and slots
