"""The pure parts of a lab node's real Docker: the image archive, the stand-in runtime's spec edits, the
runc command lines it reads (no daemon needed)."""

from __future__ import annotations

import hashlib
import io
import json
import resource
import tarfile
from pathlib import Path

from sparkfleet.sim import image
from sparkfleet.sim.shim import runtime


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_the_archive_is_the_same_bytes_every_time_and_ids_are_config_hashes():
    refs = {"vllm/vllm-openai:v1": {"entrypoint": ["vllm", "serve"], "engine_version": "0.11.1"},
            "exl3b-roce-lim": {"entrypoint": None}}
    a, ids = image.archive(refs, "/venv/bin/python", "/src")
    b, _ = image.archive(refs, "/venv/bin/python", "/src")
    assert a == b
    with tarfile.open(fileobj=io.BytesIO(a)) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
        assert [m["RepoTags"] for m in manifest] == [["exl3b-roce-lim:latest"], ["vllm/vllm-openai:v1"]]
        for m in manifest:
            cfg = tar.extractfile(m["Config"]).read()
            assert m["Config"] == hashlib.sha256(cfg).hexdigest() + ".json"
            layers = [tar.extractfile(n).read() for n in m["Layers"]]
            assert json.loads(cfg)["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(x).hexdigest() for x in layers]
        vllm = json.loads(tar.extractfile(manifest[1]["Config"]).read())
        assert vllm["config"]["Entrypoint"] == ["vllm", "serve"]
        layer = tar.extractfile(manifest[0]["Layers"][0]).read()
        assert len(manifest[0]["Layers"]) == 1
        version = tar.extractfile(manifest[1]["Layers"][1]).read()
    assert members(version)[image.VERSION_FILE].size == len(b"0.11.1\n")
    assert ids["vllm/vllm-openai:v1"] != ids["exl3b-roce-lim"]
    files = members(layer)
    tool = files[f"{image.BIN_DIR}/vllm"]
    assert tool.mode == 0o755 and tool.mtime == 0 and tool.uid == 0
    assert files[f"{image.APP_DIR}/ggml-rpc-server"].linkname == f"/{image.BIN_DIR}/ggml-rpc-server"


def test_a_tool_runs_the_container_module_under_its_own_name():
    script = image.tool_script("/p y/python", "/src dir").decode()
    assert script.splitlines()[-1] == "PYTHONPATH='/src dir' exec '/p y/python' -m sparkfleet.sim.container \"$0\" \"$@\""


def test_rlimits_above_this_machines_hard_limit_are_lowered_others_kept():
    _soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    cap = runtime.INFINITY if hard == resource.RLIM_INFINITY else hard
    asked = [{"type": "RLIMIT_MEMLOCK", "hard": runtime.INFINITY, "soft": runtime.INFINITY},
             {"type": "RLIMIT_STACK", "hard": 1024, "soft": 1024}, {"type": "RLIMIT_RTPRIO", "hard": 5, "soft": 5}]
    assert runtime.clamp_rlimits(asked) == [{"type": "RLIMIT_MEMLOCK", "hard": cap, "soft": cap},
                                            {"type": "RLIMIT_STACK", "hard": 1024, "soft": 1024},
                                            {"type": "RLIMIT_RTPRIO", "hard": 5, "soft": 5}]


def test_the_runtime_finds_the_bundle_of_create_after_runcs_global_options():
    argv = ["--root", "/run/docker/runtime-runc/moby", "--log", "/x/log.json", "--log-format", "json", "create",
            "--bundle", "/run/containerd/b1", "--pid-file", "/p", "cid"]
    assert runtime._bundle(argv) == ("create", Path("/run/containerd/b1"))
    assert runtime._bundle(["--root", "/r", "delete", "cid"])[0] == "delete"


def test_inject_binds_the_system_python_and_state_and_keeps_the_lanes_mounts(tmp_path):
    (tmp_path / "var/lib/sparkfleet-sim").mkdir(parents=True)
    (tmp_path / "var/lib/sparkfleet-sim/engine.json").write_text(json.dumps({"python_roots": [str(tmp_path)]}))
    (tmp_path / "var/lib/sparkfleet-sim/node/proc").mkdir(parents=True)
    (tmp_path / "var/lib/sparkfleet-sim/node/proc/meminfo").write_text("MemTotal:       126877696 kB\n")
    spec = {"process": {"rlimits": []}, "mounts": [{"destination": "/models", "type": "bind", "source": "/nvme/m"}]}
    out = runtime.inject(spec, tmp_path)
    assert [m["destination"] for m in out["mounts"]] == ["/models", "/usr", str(tmp_path), "/var/lib/sparkfleet-sim",
                                                         "/proc/meminfo"]  # the node's memory, not this machine's
    assert out["mounts"][4]["source"] == str(tmp_path / "var/lib/sparkfleet-sim/node/proc/meminfo")
    assert out["mounts"][1]["options"] == ["rbind", "ro", "nosuid"]
    assert out["mounts"][3] == {"destination": "/var/lib/sparkfleet-sim", "type": "bind",
                                "source": str(tmp_path / "var/lib/sparkfleet-sim"), "options": ["rbind", "rw", "nosuid"]}


def test_a_lab_node_s_images_take_their_entrypoint_from_the_engine_adapter():
    """vLLM's image runs `vllm serve` (the adapter's image_entrypoint, from vLLM's Dockerfile); a llama.cpp
    lane's image has none (the lane's command is the container's command)."""
    from sparkfleet.opsdir import Spec
    from sparkfleet.sim.sandbox import Lanes, image_specs, images_archive

    sp = Spec(Path(__file__).resolve().parent.parent)
    inv = sp.inventory("lab")
    lanes = Lanes([sp.profile("dcp2").profile, sp.profile("local-gemma").profile])
    entry = {}
    with tarfile.open(fileobj=io.BytesIO(images_archive(image_specs(inv, inv.nodes["reddie"], lanes)))) as tar:
        for m in json.loads(tar.extractfile("manifest.json").read()):
            entry[m["RepoTags"][0]] = json.loads(tar.extractfile(m["Config"]).read())["config"].get("Entrypoint")
    refs = {p.engine: p.image.ref for p in lanes.profiles}
    assert [entry[t] for t in entry if t.startswith(refs["vllm"])] == [["vllm", "serve"]]
    assert [entry[t] for t in entry if t.startswith(refs["llamacpp"])] in ([None], [[]])


def _as_init(tmp_path: Path, program: str):
    """A process running `sh -c program` under llama.run_as_init, as a real container's first process would."""
    import subprocess
    import sys
    import time

    ready = tmp_path / "ready"
    ready.unlink(missing_ok=True)
    code = ("import sys; from pathlib import Path; from sparkfleet.sim.llama import run_as_init; "
            "sys.exit(run_as_init(Path('/bin/sh'), ['sh', '-c', sys.argv[1]], {'PATH': '/usr/bin:/bin'}))")
    proc = subprocess.Popen([sys.executable, "-c", code, f"touch {ready}; {program}"])
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    return proc


def test_under_the_containers_init_a_signal_the_binary_does_not_handle_ends_it_as_tini_says(tmp_path):
    import signal

    proc = _as_init(tmp_path, "sleep 30")  # sh waits on sleep; USR2 (sh has no handler) ends sh
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(10) == 128 + signal.SIGUSR2
    proc = _as_init(tmp_path, "exit 3")
    assert proc.wait(10) == 3  # the binary's own exit status is the container's


def test_a_docker_exec_process_gets_the_containers_rlimits_lowered_as_on_create(tmp_path):
    _soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    spec = tmp_path / "process.json"
    asked = {"type": "RLIMIT_MEMLOCK", "hard": runtime.INFINITY, "soft": runtime.INFINITY}
    spec.write_text(json.dumps({"args": ["/bin/true"], "rlimits": [asked]}))
    runtime.lower_exec(["--root", "/r", "exec", "--process", str(spec), "--detach", "--pid-file", "/p", "cid"])
    got = json.loads(spec.read_text())
    assert got["args"] == ["/bin/true"] and got["rlimits"] == runtime.clamp_rlimits([asked])
    if hard != resource.RLIM_INFINITY:  # this machine (no CAP_SYS_RESOURCE): runc would refuse the ask
        assert got["rlimits"][0]["hard"] == hard


def test_the_lab_gets_the_real_daemon_wherever_this_machine_can_run_one(monkeypatch):
    """`sim up`'s default docker: each node's own dockerd where nothing is missing (root, docker.io), the shim
    where something is (no root: `make demo` as a user); $SPARKFLEET_SIM_DOCKER overrides either way."""
    from sparkfleet.sim import dockerd, lab, registry

    monkeypatch.delenv(lab.DOCKER_ENV, raising=False)
    monkeypatch.setattr(dockerd, "missing", lambda: [])
    monkeypatch.setattr(registry, "missing", lambda: [])
    assert lab.default_docker() == "daemon"
    monkeypatch.setattr(registry, "missing", lambda: ["/usr/bin/docker-registry"])
    assert lab.default_docker() == "shim"
    monkeypatch.setattr(registry, "missing", lambda: [])
    monkeypatch.setattr(dockerd, "missing", lambda: ["root (a Docker daemon needs it)"])
    assert lab.default_docker() == "shim"
    monkeypatch.setenv(lab.DOCKER_ENV, "daemon")
    assert lab.default_docker() == "daemon"
    monkeypatch.setattr(dockerd, "missing", lambda: [])
    monkeypatch.setenv(lab.DOCKER_ENV, "shim")
    assert lab.default_docker() == "shim"
