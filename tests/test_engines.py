"""Engine adapters: the ContainerSpec is what the plan's argv and shell are rendered from, the readers
use its fields, each engine's rules and vocabulary are its own, and the registry lists them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfleet.engines.base import Engine
from sparkfleet.engines.container import Bind, ContainerSpec, docker_argv, docker_script
from sparkfleet.engines.logs import parse
from sparkfleet.engines.registry import ADAPTERS, NAMES, engine_for
from sparkfleet.fleet.gather import facts_requests
from sparkfleet.opsdir import Spec
from sparkfleet.placement import place
from sparkfleet.plan import make_plan
from sparkfleet.render.shell import to_argv
from sparkfleet.rules import lint
from sparkfleet.schema.errors import SpecError
from sparkfleet.schema.playbook import Playbook, Step
from tests.conftest import REPO

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

ONE = Playbook(name="t", steps=[Step(step="launch", role="all")])


def plan_of(sp: Spec, name: str, inventory: str = "lab"):
    return make_plan(sp.profile(name), sp.inventory(inventory), ONE, sp.root)


def test_spec_renders_argv_and_shell_in_one_order() -> None:
    spec = ContainerSpec(name="sf-x-r0", image="img:1", command=["serve", "--port", "8"],
                         command_text="  serve --port 8\n", labels={"sparkfleet.profile": "x"},
                         options=[["--network", "host"], ["--device", "/dev/infiniband:/dev/infiniband"]],
                         mounts=[Bind("/a b", "/a", True)], env={"K": "v w", "SECRET": None}, ports={8: "port"})
    assert docker_argv(spec) == ["docker", "run", "-d", "--name", "sf-x-r0", "--label", "sparkfleet.profile=x",
                                 "--network", "host", "--device", "/dev/infiniband:/dev/infiniband",
                                 "-v", "/a b:/a:ro", "-e", "K=v w", "-e", "SECRET", "img:1", "serve", "--port", "8"]
    assert docker_script(spec) == (
        "docker run -d --name sf-x-r0 \\\n  --label sparkfleet.profile=x \\\n --network host \\\n"
        " --device /dev/infiniband:/dev/infiniband \\\n  -v '/a b:/a:ro' \\\n  -e 'K=v w' \\\n  -e SECRET \\\n"
        "  img:1 \\\n  serve --port 8\n")
    assert to_argv(docker_script(spec)) == docker_argv(spec)
    assert spec.devices == ["/dev/infiniband:/dev/infiniband"]
    assert spec.env_items() == {"K": "v w", "SECRET": ""}  # a passed-through secret has no value here


def test_plan_launches_keep_the_structure(repo_spec: Spec) -> None:
    plan = plan_of(repo_spec, "dcp4")
    worker = next(x for x in plan.launches if x.rank == 1)
    assert worker.spec is not None and worker.argv == docker_argv(worker.spec)
    assert to_argv(worker.script) == worker.argv
    assert worker.spec.source_of("/engram-local") == \
        "/nvme/engram-local/df42c109f1defefcbfcedbe7d905718a12266e40"
    assert worker.spec.env["VLLM_HOST_IP"] == "192.168.192.12" and worker.spec.ports == {}
    head = next(x for x in plan.launches if x.rank == 0)
    assert head.spec is not None and head.spec.ports == {8410: "port", 29551: "master port"}
    # facts are asked about exactly the specs' bind sources (no argv parsing)
    asked = facts_requests(repo_spec.inventory("lab"), plan)["asusi"].paths
    assert set(worker.spec.bind_sources) <= set(asked)


def test_tensorfold_ranks_are_containers_with_their_config_env(repo_spec: Spec) -> None:
    launches = plan_of(repo_spec, "tf1017").launches
    assert [x.rank for x in launches] == [3, 2, 1, 0]
    recipe = "/opt/deepseek-v4.1-tensorfold-tp4-4xgb10"
    for x in launches:
        assert x.spec is not None and x.argv == docker_argv(x.spec)
        assert x.spec.source_of(f"{recipe}/config.env") is not None
        assert x.spec.command == ["bash", f"{recipe}/scripts/serve.sh", "start"]


def test_registry_names_every_adapter_and_the_schema_uses_them(ops_root: Path) -> None:
    assert NAMES == tuple(ADAPTERS)
    for name in NAMES:
        engine = engine_for(name)
        assert isinstance(engine, Engine) and engine.name == name
    (ops_root / "profiles" / "z.yaml").write_text("extends: dcp2\nengine: vllx\n")
    with pytest.raises(SpecError) as exc:
        Spec(ops_root).profile("z")
    assert str(exc.value).startswith("profiles/z.yaml:2: engine: Input should be 'vllm', 'tensorfold'")


def test_vllm_rules_are_vllms_alone(ops_root: Path) -> None:
    # --block-size is vLLM's rule: an SGLang lane on the same Sparks is not held to it
    (ops_root / "profiles" / "s.yaml").write_text("extends: boot10\nengine: sglang\nflags:\n  --block-size: !unset\n")
    sp = Spec(ops_root)
    loaded = sp.profile("s")
    inv = sp.inventory("lab")
    checks = {f.check for f in lint(loaded, inv, place(loaded, inv))}
    assert "block-size" not in checks and "jit-guard" not in checks  # boot10 sets the JIT guard


def test_tensorfold_config_keys_are_reserved(ops_root: Path) -> None:
    (ops_root / "profiles" / "t.yaml").write_text("extends: tf1017\nenv:\n  PORT: 9\nflags:\n  --x: 1\n")
    sp = Spec(ops_root)
    loaded = sp.profile("t")
    inv = sp.inventory("lab")
    got = [(f.check, f.status, f.field) for f in lint(loaded, inv, place(loaded, inv)) if f.status == "fail"]
    assert got == [("engine-flags", "fail", "flags"), ("reserved", "fail", "env.PORT")]


def test_api_key_needs_an_engine_that_reads_one(ops_root: Path) -> None:
    (ops_root / "profiles" / "k.yaml").write_text("extends: tf1017\napi_key_env: MY_KEY\n")
    sp = Spec(ops_root)
    loaded = sp.profile("k")
    inv = sp.inventory("lab")
    (f,) = [f for f in lint(loaded, inv, place(loaded, inv)) if f.check == "api-key"]
    assert (f.status, f.where) == ("fail", "profiles/k.yaml:2")


def test_llamacpp_vocabulary_reads_the_servers_own_lines() -> None:
    # lines as llama.cpp's server (xllamacpp build) printed them in the lab, and its fatal line
    log = ("0.00.000.411 I srv          init: initializing ...\n"
           "0.00.008.971 I srv          init: loading model\n"
           "0.02.859.859 W load: control-looking token:    212 '</s>' was not control-type; this is probably a bug\n"
           "0.03.240.690 I srv          init: model loaded\n"
           "0.03.245.579 I srv          init: listening on http://127.0.0.1:8080\n")
    f = parse(log, [], engine_for("llamacpp").log)
    assert (f.started, f.loaded, f.api_up, f.phase, f.fatal) == (True, True, True, "serving", None)
    # what the server printed for a GGUF that is not there (xllamacpp 2026.10)
    first = "0.00.006.231 E gguf_init_from_file: failed to open GGUF file '/m/x.gguf' (No such file or directory)"
    bad = parse(first + "\n0.00.008.137 E srv          init: exiting due to model loading error\n", [],
                engine_for("llamacpp").log)
    assert bad.fatal == first
    assert parse("W srv: failed to load model (retrying) WARNING\n", [], engine_for("llamacpp").log).fatal is None


def test_vocabularies_are_per_engine() -> None:
    line = "INFO 09-11 [kv_cache_utils.py:775] GPU KV cache size: 1,888,800 tokens"
    assert parse(line, [], engine_for("vllm").log).kv_tokens == 1888800
    assert parse(line, [], engine_for("tensorfold").log).kv_tokens is None


def test_spark_multinode_without_rdma_is_a_spec_error(ops_root: Path) -> None:
    sp = Spec(ops_root)
    loaded = sp.profile("dcp2")
    lab = sp.inventory("lab")
    node = lab.nodes["asusi"].model_copy(update={"rdma": None})
    lab = lab.model_copy(update={"nodes": {**lab.nodes, "asusi": node}})
    with pytest.raises(SpecError, match="node asusi has no rdma"):
        make_plan(loaded, lab, ONE, REPO)


@pytest.mark.parametrize(("body", "message"), [
    ("image: null\n", "profiles/tfx.yaml:2: image: a lane needs image"),
    ("tensorfold: {recipe_dir: null}\n", "profiles/tfx.yaml:2: tensorfold.recipe_dir: Input should be a valid string"),
])
def test_a_tensorfold_lane_without_image_or_recipe_dir_names_the_field(ops_root, capsys, body, message) -> None:
    """`up` of such a lane is refused with exit 2 and one line naming file, line and field; nothing runs."""
    from sparkfleet.cli.main import main

    (ops_root / "profiles" / "tfx.yaml").write_text("extends: tf1017\n" + body)
    assert main(["up", "--profile", "tfx", "--inventory", "lab", "--root", str(ops_root), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"sparkfleet: {message}"), err


@pytest.mark.parametrize(("version", "refused"), [("0.11.0", True), ("0.10.2", True), ("0.11.1", False),
                                                  ("0.13.0+cu129", False)])
def test_a_multi_node_lane_refuses_an_image_of_vllm_before_0_11_1(ops_root, capsys, version, refused) -> None:
    """`plan` of a two-node lane whose image declares vLLM 0.11.0 exits 2 naming file, line and field:
    --nnodes/--node-rank/--master-addr came in 0.11.1 (engine/arg_utils.py:757-759 there, none in 0.11.0)."""
    from sparkfleet.cli.main import main

    (ops_root / "profiles" / "old.yaml").write_text(
        f"extends: dcp2\nimage:\n  ref: local/vllm:old\n  engine_version: '{version}'\n")
    code = main(["plan", "--profile", "old", "--root", str(ops_root)])
    err = " ".join(capsys.readouterr().err.split())
    if refused:
        assert code == 2
        assert (f"FAIL vllm-version (profiles/old.yaml:4): the image declares vLLM {version}; a lane over several "
                "nodes needs 0.11.1 or newer") in err
    else:
        assert code == 0 and "vllm-version" not in err
