"""The simulated lab: sandbox layout, shim output shapes (docs/sim-layout.md), faults and heal, ssh mode."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import zipfile
from fractions import Fraction
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.opsdir import Spec
from sparkfleet.root import find_root, sim_inventory_path
from sparkfleet.sim import lab, netlab, paths, sandbox, shim, sshd, values
from sparkfleet.sim import node as simnode

GIB_KB = 1024 * 1024
QUERY = ("--query-gpu=index,name,pstate,clocks.sm,clocks.max.sm,clocks_event_reasons.active,power.draw,"
         "memory.total,memory.used")
CSV = "--format=csv,noheader,nounits"
# the line shape docs/sim-layout.md gives: "0, NVIDIA GB10, P0, 2405, 3003, 0x0000000000000000, 35.20, [N/A], [N/A]"
CSV_LINE = re.compile(r"^\d+, NVIDIA GB(10|300), P\d+, \d+, \d+, 0x[0-9a-f]{16}, \d+\.\d\d, (\[N/A\]|\d+), "
                      r"(\[N/A\]|\d+)$")
SPARKS = ("reddie", "asusi", "bluey", "spark4")


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path))
    yield tmp_path
    lab.down()  # a test that failed half-way leaves no running node behind


# This module tests the docker shim itself (its files byte for byte, its output shapes, its faults' changes to
# them), so its labs are the shim's whatever SPARKFLEET_SIM_DOCKER says; the real daemon's side is
# test_docker_daemon_lab.py, and test_docker_contract.py holds the two to the same output.
DOCKER = "shim"

@pytest.fixture
def sim(state):
    s = lab.up("lab", docker=DOCKER)
    yield s
    lab.down()


@pytest.fixture(scope="module")
def shared_state(tmp_path_factory):
    """One simulated lab for the tests that only read it (building one takes most of a second)."""
    state_dir = tmp_path_factory.mktemp("shared-sim")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state_dir))
        lab.up("lab", docker=DOCKER)
    yield state_dir
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state_dir))
        lab.down()


def _shared(shared_state, monkeypatch):
    monkeypatch.setenv("SPARKFLEET_STATE", str(shared_state))
    s = lab.current()
    assert s is not None
    before = snapshot(paths.nodes_dir())
    yield s
    assert snapshot(paths.nodes_dir()) == before, "a test changed the shared simulated lab and did not restore it"


@pytest.fixture
def ro_sim(shared_state, monkeypatch):
    """The shared lab, read-only: tests using it must not change it."""
    yield from _shared(shared_state, monkeypatch)


@pytest.fixture
def restored_sim(shared_state, monkeypatch):
    """The shared lab for a test that changes it and puts it back byte for byte (checked after, as ro_sim)."""
    yield from _shared(shared_state, monkeypatch)


@pytest.fixture(scope="module")
def source():
    return Spec(find_root()).inventory("lab")


def tool(root: Path, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command on the node whose tree is `root`, as the local transport does (through its wrapper)."""
    proc = subprocess.run([str(simnode.enter_path(root.parent)), name, *args], env={}, capture_output=True, text=True,
                          timeout=30)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def cat(root: Path, path: str) -> str:
    """A file as the node sees it."""
    return tool(root, "cat", path).stdout


def meminfo(root: Path) -> dict[str, int]:
    out = {}
    for line in cat(root, "/proc/meminfo").splitlines():
        key, value = line.split(":")
        out[key] = int(value.split()[0])
    return out


def gid_table(root: Path, hca: str = "rocep1s0f0") -> dict[int, tuple[str, str | None]]:
    base = root / f"sys/class/infiniband/{hca}/ports/1"  # the node's /sys is its tree's sys/
    table = {}
    for f in (base / "gids").iterdir():
        types = base / "gid_attrs/types" / f.name
        table[int(f.name)] = (f.read_text().strip(), types.read_text().strip() if types.exists() else None)
    return table


def roce_v2_ipv4_index(table: dict[int, tuple[str, str | None]]) -> int | None:
    for i in sorted(table):
        gid, kind = table[i]
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
        if kind == "RoCE v2" and mapped is not None:
            return i
    return None


BIG = 1 << 20  # a file this size or more is compared by inode, size and mtime, not read (below)


UPTIME = f"/{shim.STATE}/node/proc/uptime"  # what a node's /proc/uptime shows (sim/shim/render.py)


def snapshot(top: Path) -> dict[str, object]:
    """Every path under `top` with its content (bytes), symlink target or 'dir', plus its mode.

    A file of BIG bytes or more (the real 253 MB GGUF the lab hard-links onto each Spark when the llama
    extra is installed, as in CI: four of them made each snapshot read 1 GB) is recorded by inode, size
    and mtime in ns instead of its bytes: rewriting or replacing it changes one of them."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        d = Path(dirpath)
        for name in dirnames + filenames:
            p = d / name
            rel = str(p.relative_to(top))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", p.stat().st_mode)
            elif p.as_posix().endswith(UPTIME):
                out[rel] = ("counts", p.stat().st_mode)  # a clock: the node's init rewrites it every second
            else:
                st = p.stat()
                content = ("big", st.st_ino, st.st_size, st.st_mtime_ns) if st.st_size >= BIG else p.read_bytes()
                out[rel] = (content, st.st_mode)
    return out


def changed(before: dict, after: dict) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


# -- the sandbox layout -----------------------------------------------------------------------


def node_procs(root: Path) -> dict[int, tuple[str, list[str]]]:
    """pid -> (comm, argv) of every process the node shows in its own /proc."""
    out = tool(root, "python3", "-c", "import os, json; print(json.dumps({p: [open(f'/proc/{p}/comm').read().strip(), "
               "open(f'/proc/{p}/cmdline','rb').read().decode().split(chr(0))[:-1]] for p in os.listdir('/proc') "
               "if p.isdigit()}))").stdout
    return {int(k): (v[0], v[1]) for k, v in json.loads(out).items()}


def test_up_builds_one_node_per_inventory_node_with_the_contract_layout(ro_sim, source):
    assert sorted(p.name for p in paths.nodes_dir().iterdir()) == sorted(source.nodes)
    asusi = ro_sim.root("asusi")
    assert asusi == paths.node_dir("asusi") / "fs"
    assert {p.name for p in asusi.parent.iterdir()} == {"fs", "bin", "enter", "init.json", "node.log"}
    # the node's own tree: exactly the absolute storage paths the inventory and lanes use, plus its home,
    # /tmp, /run, /var (the sim's state) and /sys (the RDMA files); /usr, /etc, /proc are not the node's
    home = simnode.home_dir().strip("/").split("/")[0]
    assert {p.name for p in asusi.iterdir()} == {
        home, "tmp", "run", "sys", "var",
        "mnt",  # /mnt/models (model root, NFS)
        "nvme",  # /nvme/engram-local, /nvme/cache
        "opt", "DeepSeek-V4.1-Flash-1017-EXL3-3.5bpw",  # tf1017's recipe_dir and model_dir
    }
    assert {p.name for p in (asusi / shim.STATE).iterdir()} == {
        "node.json", "gpu.json", "docker.json", "faults.json", "engine.json", "logs", "stash", ".lock", "node",
        "llama.cpp",  # llama.cpp's built binaries, placed in every node for its RPC lanes (sim/llama.py)
        "tensorfold",  # the stand-in TensorFold fork `sparkfleet build` clones (sim/tfbuild.py)
        "init.ready"}
    tools = [p.name for p in (asusi.parent / "bin").iterdir() if p.name not in (sandbox.SHIM_ZIP, "zig")]
    assert sorted(tools) == sorted(set(sandbox.SHIM_NAMES) - set(sandbox.DAEMON_TOOLS))  # a node without its own dockerd
    assert (asusi.parent / "bin" / "zig").read_text().startswith('#!/usr/bin/python3\n"""SIMULATION: the simulated')
    for name in tools:
        s = asusi.parent / "bin" / name
        assert os.access(s, os.X_OK) and s.read_text() == sandbox.SHIM_STUB
    with zipfile.ZipFile(asusi.parent / "bin" / sandbox.SHIM_ZIP) as z:  # the package, each module with its bytecode
        names = z.namelist()
        assert {n for n in names if n.endswith(".py")} == {f"{sandbox.SHIM_MODULE}/{m}" for m in sandbox.shim_sources()}
        assert {n[:-1] for n in names if n.endswith(".pyc")} == {n for n in names if n.endswith(".py")}
        assert all(z.read(f"{sandbox.SHIM_MODULE}/{m}") == data for m, data in sandbox.shim_sources().items())
    # inside, it is a machine of its own: its hostname, its files at the inventory's paths, shims on PATH
    assert tool(asusi, "hostname").stdout == "asusi\n" and cat(asusi, "/etc/hostname") == "asusi\n"
    assert tool(asusi, "bash", "-c", "command -v nvidia-smi docker").stdout == "/usr/local/bin/nvidia-smi\n" \
        "/usr/local/bin/docker\n"
    assert tool(asusi, "test", "-d", "/nvme/engram-local").returncode == 0
    assert tool(asusi, "test", "-e", str(asusi), check=False).returncode == 1  # this machine's paths are not on the node
    assert json.loads(cat(asusi, f"/{shim.STATE}/faults.json")) == {"faults": {}}
    up, idle = (float(x) for x in cat(asusi, "/proc/uptime").split())
    assert up > 0 and idle > up
    assert tool(asusi, "pwd").stdout == simnode.home_dir() + "\n"


def test_each_node_has_its_own_processes(ro_sim):
    procs = node_procs(ro_sim.root("asusi"))
    comms = sorted(c for c, _ in procs.values())
    assert comms == ["bwrap", "earlyoom", "python3", "sim-node-init"] or comms == [
        "bwrap", "earlyoom", "python3", "python3"], procs  # pid 1, init, earlyoom, and this command
    assert 1 in procs and procs[1][0] == "bwrap"


def test_meminfo_from_the_hardware_class(ro_sim):
    for node in SPARKS:
        mem = meminfo(ro_sim.root(node))
        assert mem["MemTotal"] == 121 * GIB_KB  # GB10: 121 GiB unified (INV-10)
        assert mem["MemAvailable"] > 100 * GIB_KB  # healthy: above the 100 GiB rank floor (HLT-03)
        assert mem["MemAvailable"] == 121 * GIB_KB - values.HARDWARE["gb10"]["used_gib"] * GIB_KB
        assert mem["MemFree"] <= mem["MemAvailable"] <= mem["MemTotal"]
    station = meminfo(ro_sim.root("station"))
    assert station["MemTotal"] == 494 * GIB_KB  # Grace host RAM (INV-50)
    assert station["SwapTotal"] == 0
    # the kernel's layout: label padded to 16 columns, value right-aligned in 8, then " kB"
    first = cat(ro_sim.root("asusi"), "/proc/meminfo").splitlines()[0]
    assert first == f"MemTotal:       {121 * GIB_KB:>8} kB"


def test_mounts_nfs4_on_workers_local_nvme_on_head_and_station(ro_sim, source):
    for node in ("asusi", "bluey", "spark4"):
        rows = [line.split() for line in cat(ro_sim.root(node), "/etc/mtab").splitlines()]
        nfs = [r for r in rows if r[1] == "/mnt/models"]
        assert len(nfs) == 1
        src, target, fstype, opts, dump, passno = nfs[0]
        assert (src, fstype, dump, passno) == ("192.168.192.11:/nvme/hf", "nfs4", "0", "0")
        assert source.nodes[node].storage.nfs_mount.source == src
        assert f"clientaddr={source.nodes[node].fabric_ip}" in opts and "addr=192.168.192.11" in opts
    reddie = [line.split() for line in cat(ro_sim.root("reddie"), "/etc/mtab").splitlines()]
    assert not [r for r in reddie if r[2] in ("nfs", "nfs4", "cifs")]
    assert ["/dev/nvme0n1p2", "/", "ext4"] == [r for r in reddie if r[1] == "/"][0][:3]  # /nvme/hf lies on it
    station = [line.split() for line in cat(ro_sim.root("station"), "/etc/mtab").splitlines()]
    assert [r[:3] for r in station if r[1] == "/models"] == [["/dev/md0", "/models", "xfs"]]  # INV-53


def earlyoom_argv(root: Path) -> list[str]:
    [argv] = [argv for comm, argv in node_procs(root).values() if comm == "earlyoom"]
    return argv


def test_earlyoom_process_and_config(ro_sim):
    for n in SPARKS:
        root = ro_sim.root(n)
        # a real process named earlyoom (the sim's stand-in script) with earlyoom's options
        assert earlyoom_argv(root) == ["/usr/bin/python3", "/usr/local/bin/earlyoom", "-m", "2", "-r", "3600"]
        assert 'EARLYOOM_ARGS="-m 2 -r 3600"\n' in cat(root, "/etc/default/earlyoom")  # 2 % (INV-13)
    # no earlyoom percentage for GB300 in the seeds: Debian's defaults
    assert earlyoom_argv(ro_sim.root("station"))[2:] == ["-r", "3600"]


def test_gid_table_roce_v2_ipv4_entry_at_index_3(ro_sim, source):
    for node in SPARKS:
        root = ro_sim.root(node)
        table = gid_table(root)
        ip = source.nodes[node].fabric_ip
        assert table[3] == (ipaddress.IPv6Address("::ffff:" + ip).exploded, "RoCE v2")
        assert table[2] == (ipaddress.IPv6Address("::ffff:" + ip).exploded, "IB/RoCE v1")
        assert table[0][0].startswith("fe80:") and table[1] == (table[0][0], "RoCE v2")
        assert table[4] == ("0000:0000:0000:0000:0000:0000:0000:0000", None)
        assert len(table) == values.GID_TABLE_SIZE
        assert roce_v2_ipv4_index(table) == 3
        base = root / "sys/class/infiniband/rocep1s0f0/ports/1"
        assert (base / "state").read_text() == "4: ACTIVE\n"
        assert (base / "gid_attrs/ndevs/3").read_text() == "enp1s0f0np0\n"
        # the second ConnectX-7 function has no address until a rail-2 lane adds its alias
        assert roce_v2_ipv4_index(gid_table(root, "roceP2p1s0f0")) is None
    assert not (ro_sim.root("station") / "sys/class/infiniband").exists()  # no rdma: in the inventory
    assert tool(ro_sim.root("asusi"), "ibdev2netdev").stdout == (
        "rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)\nroceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Up)\n")


def test_storage_dirs_for_the_shipped_lanes(ro_sim, source):
    spec = Spec(find_root())
    for node_name in ("reddie", "asusi", "station"):
        node = source.nodes[node_name]
        root = ro_sim.root(node_name)
        st = node.storage
        for path in (st.model_root, st.cache_dir, st.patch_root) + ((st.engram_local_dir,) if st.engram_local_dir
                                                                   else ()):
            assert paths.inside(root, path).is_dir(), path
        for name in spec.profile_names():
            p = spec.profile(name).profile
            if p.model is None or node_name not in source.groups.get(p.group or "", []):
                continue
            repo = paths.inside(root, st.model_root) / p.model.repo_dir
            snap = p.model.snapshot or p.model.revision
            assert (repo / "snapshots" / snap).is_dir() if snap else repo.is_dir(), (name, node_name)
    dcp2 = paths.inside(ro_sim.root("asusi"), "/mnt/models/models--deepseek-ai--DeepSeek-V4.1-Flash")
    assert (dcp2 / "snapshots/df42c109f1defefcbfcedbe7d905718a12266e40").is_dir()
    assert (dcp2 / "refs/main").read_text() == "df42c109f1defefcbfcedbe7d905718a12266e40"
    assert paths.inside(ro_sim.root("station"), "/home/milo/dsv41/hook/sitecustomize.py").is_file()  # a -v source
    # the stand-in checkpoint: Engram tables of the sim's size in shards 47 and 48; the workers' NFS mount shows
    # the head's files (one inode), the Station holds none (its lanes pin Engram in memory)
    from sparkfleet.fleet.nodeside.engram_copy import read_shard

    snap = dcp2 / "snapshots/df42c109f1defefcbfcedbe7d905718a12266e40"
    assert sorted(p.name for p in snap.iterdir()) == [
        "model-00001-of-00048.safetensors", "model-00047-of-00048.safetensors", "model-00048-of-00048.safetensors",
        "model.safetensors.index.json"]
    for layer, shard in ((1, 47), (14, 48)):
        t = read_shard(str(snap / f"model-000{shard}-of-00048.safetensors")).tensors
        assert t[f"model.layers.{layer}.engram.embed.weight"].shape == [values.ENGRAM_STANDIN_ROWS,
                                                                         values.ENGRAM_STANDIN_WIDTH]
    head = paths.inside(ro_sim.root("reddie"), "/nvme/hf/models--deepseek-ai--DeepSeek-V4.1-Flash") / snap.relative_to(
        dcp2)
    assert (head / "model-00047-of-00048.safetensors").stat().st_ino == (
        snap / "model-00047-of-00048.safetensors").stat().st_ino
    # no stand-in shard on the Station (the lab's real vLLM checkpoint for vllm-lab-station is another file)
    assert not list(paths.inside(ro_sim.root("station"), "/models").rglob("model-000*-of-*.safetensors"))


def test_docker_images_for_every_shipped_lane(ro_sim, source):
    spec = Spec(find_root())
    wanted: dict[str, set[str]] = {n: set() for n in source.nodes}
    for name in spec.profile_names():
        p = spec.profile(name).profile
        if p.image and p.group in source.groups:
            for n in source.groups[p.group]:
                wanted[n].add(p.image.ref)
    for node in ("asusi", "station"):
        root = ro_sim.root(node)
        ids = tool(root, "docker", "images", "-q", "--no-trunc").stdout.split()
        assert ids and all(re.fullmatch(r"sha256:[0-9a-f]{64}", i) for i in ids)
        images = json.loads(tool(root, "docker", "image", "inspect", *ids).stdout)
        assert {tag for img in images for tag in img["RepoTags"]} == wanted[node]
        for img in images:
            assert set(img) >= {"Id", "RepoTags", "RepoDigests"}
            assert len(img["RepoDigests"]) == 1
            assert re.fullmatch(r"[^@:]+(/[^@:]+)*@sha256:[0-9a-f]{64}", img["RepoDigests"][0])
        assert tool(root, "docker", "ps", "-aq", "--no-trunc").stdout == ""


def test_generated_inventory_mirrors_the_source(ro_sim, source):
    inv = ro_sim.inventory()
    assert ro_sim.inventory_path == sim_inventory_path() == paths.sim_dir() / "inventory.yaml"
    assert inv.name == "sim"
    assert list(inv.nodes) == list(source.nodes) and inv.groups == source.groups
    for name, node in inv.nodes.items():
        assert node.transport == "local" and node.simulation
        assert node.wrapper == [str(paths.node_dir(name) / "enter")]
        assert node.storage == source.nodes[name].storage
        assert (node.hardware, node.fabric_ip, node.rdma) == (source.nodes[name].hardware,
                                                              source.nodes[name].fabric_ip, source.nodes[name].rdma)
    assert inv.hardware(inv.nodes["asusi"]) == source.hardware(source.nodes["asusi"])
    assert ro_sim.inventory_path.read_text().startswith("# SIMULATION")
    # the loader accepts it as a file, as `--inventory <path>` does
    assert Spec(find_root()).inventory(str(ro_sim.inventory_path)).nodes.keys() == source.nodes.keys()


# -- shims ------------------------------------------------------------------------------------


def test_nvidia_smi_idle_then_under_load(sim):
    gb10 = values.HARDWARE["gb10"]
    root = sim.root("asusi")
    idle = tool(root, "nvidia-smi", QUERY, CSV).stdout
    assert idle == (f"0, NVIDIA GB10, P0, {gb10['idle_sm_mhz']}, {gb10['max_sm_mhz']}, 0x0000000000000001, "
                    f"{gb10['idle_power_w']:.2f}, [N/A], [N/A]\n")
    assert CSV_LINE.match(idle.strip())
    assert tool(root, "sim-gpu-load", "--no-wait", "30").stdout == "[sim] asusi: GPU under simulated load for 30 s\n"
    busy = tool(root, "nvidia-smi", QUERY, CSV).stdout
    assert busy == (f"0, NVIDIA GB10, P0, {gb10['max_sm_mhz']}, {gb10['max_sm_mhz']}, 0x0000000000000000, "
                    f"{gb10['load_power_w']:.2f}, [N/A], [N/A]\n")
    assert CSV_LINE.match(busy.strip())
    tool(root, "sim-gpu-load", "0")
    assert tool(root, "nvidia-smi", QUERY, CSV).stdout == idle
    # with a header and units, as plain --format=csv prints them
    out = tool(root, "nvidia-smi", "--query-gpu=index,clocks.sm,power.draw,memory.total", "--format=csv").stdout
    assert out.splitlines() == ["index, clocks.current.sm [MHz], power.draw [W], memory.total [MiB]",
                                f"0, {gb10['idle_sm_mhz']} MHz, {gb10['idle_power_w']:.2f} W, [N/A]"]


def test_sim_gpu_load_runs_like_a_load_and_prints_step_times(sim):
    root = sim.root("reddie")
    enter = str(simnode.enter_path(root.parent))
    load = subprocess.Popen([enter, "sim-gpu-load", "1.5"], env={}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        seen = set()
        while load.poll() is None:  # sampled while it runs, as the clock probe does
            seen.add(tool(root, "nvidia-smi", "--query-gpu=clocks.sm,clocks_event_reasons.active", CSV).stdout)
        out, err = load.communicate(timeout=10)
    finally:
        load.kill()
    assert load.returncode == 0 and err == "[sim] reddie: GPU under simulated load for 1.5 s\n"
    assert "3003, 0x0000000000000000\n" in seen
    assert json.loads(out) == {"step_ms": {"after_idle": [values.STEP_MS] * 5,
                                           "back_to_back": [values.STEP_MS] * int(1500 / values.STEP_MS),
                                           "pause_s": 0.0}}
    assert tool(root, "nvidia-smi", "--query-gpu=clocks.sm", CSV).stdout == "208\n"  # idle again
    sim.fault("reddie", "slow-state")
    slow = json.loads(tool(root, "sim-gpu-load", "0.2").stdout)["step_ms"]
    assert slow["after_idle"][0] / slow["back_to_back"][0] == values.SLOW_AFTER_IDLE_MS / values.STEP_MS
    # a load that is killed stops loading the GPU
    killed = subprocess.Popen([enter, "sim-gpu-load", "60"], env={}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        while "0x0000000000000000" not in tool(root, "nvidia-smi", QUERY, CSV).stdout:
            assert killed.poll() is None
        os.killpg(killed.pid, signal.SIGTERM)  # the command's process group, as a transport's timeout does
        assert killed.wait(timeout=10) in (-signal.SIGTERM, 128 + signal.SIGTERM)
    finally:
        killed.kill()
    assert tool(root, "nvidia-smi", QUERY, CSV).stdout.split(", ")[5] == "0x0000000000000001"


def test_nvidia_smi_gb300_banner_and_errors(ro_sim):
    root = ro_sim.root("station")
    line = tool(root, "nvidia-smi", QUERY, CSV).stdout.strip()
    assert CSV_LINE.match(line)
    assert line.split(", ")[1] == "NVIDIA GB300" and line.split(", ")[7] == str(values.HARDWARE["gb300"][
        "memory_total_mib"])
    banner = tool(root, "nvidia-smi").stdout
    assert banner.startswith("[sim] SPARKFLEET SIMULATION - node station")
    assert "NVIDIA GB300" in banner
    bad = tool(root, "nvidia-smi", "--query-gpu=clocks.bogus", CSV, check=False)
    assert bad.returncode == 2 and 'Field "clocks.bogus" is not a valid field to query.' in bad.stderr
    refused = tool(root, "nvidia-smi", "-lgc", "1980", check=False)
    assert refused.returncode == 2 and "[sim]" in refused.stderr


DCP2_RUN = ["run", "-d", "--name", "sf-dcp2-r1", "--label", "sparkfleet.profile=dcp2", "--label", "sparkfleet.rank=1",
            "--label", "sparkfleet.run=t1", "--restart", "no", "--network", "host", "--ipc", "host", "--shm-size",
            "32g", "--ulimit", "memlock=-1:-1", "--cap-add", "IPC_LOCK", "--device", "/dev/infiniband:/dev/infiniband",
            "--gpus", "all", "-v", "/mnt/models/models--deepseek-ai--DeepSeek-V4.1-Flash:/models/repo:ro",
            "-v", "/nvme/cache:/cache", "-e", "VLLM_HOST_IP=192.168.192.12",
            "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2",
            "/models/repo/snapshots/df42c109f1defefcbfcedbe7d905718a12266e40", "--host", "0.0.0.0", "--port", "8410",
            "--node-rank", "1", "--headless"]  # no --nnodes: not a whole lane rank, so no sim engine starts


def listening_ports(root: Path) -> set[int]:
    """Ports something listens on, in the node's /proc/net/tcp and tcp6 (real sockets)."""
    rows = (cat(root, "/proc/net/tcp") + cat(root, "/proc/net/tcp6")).splitlines()
    return {int(r.split()[1].split(":")[1], 16) for r in rows if len(r.split()) > 3 and r.split()[3] == "0A"}


def test_docker_run_inspect_stop_rm(sim):
    root = sim.root("asusi")
    cid = tool(root, "docker", *DCP2_RUN).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", cid)
    assert tool(root, "docker", "ps", "-aq", "--no-trunc").stdout == cid + "\n"
    [c] = json.loads(tool(root, "docker", "inspect", cid).stdout)
    assert c["Id"] == cid and c["Name"] == "/sf-dcp2-r1"
    assert c["Config"]["Image"] == "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2"
    assert c["Config"]["Labels"] == {"sparkfleet.profile": "dcp2", "sparkfleet.rank": "1", "sparkfleet.run": "t1"}
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", c["Image"])
    assert c["Image"] in tool(root, "docker", "images", "-q", "--no-trunc").stdout.split()
    assert c["State"]["Status"] == "running" and c["State"]["Running"] is True
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", c["State"]["StartedAt"])
    assert c["HostConfig"]["NetworkMode"] == "host" and c["HostConfig"]["PortBindings"] == {}
    assert c["HostConfig"]["DeviceRequests"] == [{"Driver": "", "Count": -1, "DeviceIDs": None,
                                                  "Capabilities": [["gpu"]], "Options": {}}]
    assert c["NetworkSettings"]["Ports"] == {}
    assert c["Config"]["Env"] == ["VLLM_HOST_IP=192.168.192.12",  # the run's -e, then the image's PATH, as dockerd
                                  "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    assert tool(root, "docker", "ps", "--filter", "label=sparkfleet.profile=dcp2", "--format",
                "{{.Names}} {{.Label \"sparkfleet.rank\"}}").stdout == "sf-dcp2-r1 1\n"
    conflict = tool(root, "docker", *DCP2_RUN, check=False)
    assert conflict.returncode == 125 and 'The container name "/sf-dcp2-r1" is already in use' in conflict.stderr
    busy_rm = tool(root, "docker", "rm", "sf-dcp2-r1", check=False)
    assert busy_rm.returncode == 1 and "container is running" in busy_rm.stderr
    assert tool(root, "docker", "stop", "sf-dcp2-r1").stdout == "sf-dcp2-r1\n"
    [c] = json.loads(tool(root, "docker", "inspect", cid).stdout)
    assert c["State"]["Status"] == "exited" and c["State"]["ExitCode"] == values.STOP_EXIT_CODE
    assert tool(root, "docker", "ps", "-q").stdout == ""
    tool(root, "docker", "start", cid[:12])
    (root / shim.STATE / f"logs/{cid}.log").write_text("INFO Starting vLLM API server 0 on http://0.0.0.0:8410\n")
    assert tool(root, "docker", "logs", "sf-dcp2-r1").stdout.startswith("INFO Starting vLLM")
    tool(root, "docker", "rm", "-f", "sf-dcp2-r1")
    assert tool(root, "docker", "ps", "-aq", "--no-trunc").stdout == ""
    missing = tool(root, "docker", "inspect", "sf-dcp2-r1", check=False)
    assert missing.returncode == 1 and missing.stdout == "[]\n" and "No such object: sf-dcp2-r1" in missing.stderr
    nope = tool(root, "docker", "run", "-d", "nvcr.io/nvidia/nope:1", check=False)
    assert nope.returncode == 125 and "Unable to find image 'nvcr.io/nvidia/nope:1' locally" in nope.stderr


def test_docker_published_port_and_missing_bind_source(sim):
    root = sim.root("bluey")
    tool(root, "docker", "run", "-d", "--name", "web", "-p", "8000:8000", "-v", "/srv/missing:/data",
         "nvcr.io/nvidia/pytorch:26.07-py3", "python3", "-m", "http.server")
    [c] = json.loads(tool(root, "docker", "inspect", "web").stdout)
    assert c["HostConfig"]["PortBindings"] == {"8000/tcp": [{"HostIp": "", "HostPort": "8000"}]}
    assert c["NetworkSettings"]["Ports"] == {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "8000"},
                                                          {"HostIp": "::", "HostPort": "8000"}]}
    assert c["HostConfig"]["DeviceRequests"] is None
    assert tool(root, "test", "-d", "/srv/missing").returncode == 0  # dockerd creates a missing bind source, empty (FM-12)


# -- faults -----------------------------------------------------------------------------------


def sandbox_snapshot() -> dict[str, object]:
    return snapshot(paths.nodes_dir())


ST = f"asusi/fs/{shim.STATE}"
GIDS = "asusi/fs/sys/class/infiniband/rocep1s0f0/ports/1"
EXPECTED_CHANGES: dict[str, tuple[dict, set[str]]] = {
    "clock-latch": ({}, {f"{ST}/faults.json"}),
    "slow-state": ({}, {f"{ST}/faults.json"}),
    "low-memory": ({}, {f"{ST}/faults.json", f"{ST}/node/proc/meminfo"}),
    "earlyoom-off": ({}, {f"{ST}/faults.json"}),  # and the node's earlyoom process stops (below)
    "wrong-gid": ({}, {f"{ST}/faults.json"} | {f"{GIDS}/gids/{i}" for i in (2, 3, 4, 5)}
                  | {f"{GIDS}/gid_attrs/{kind}/{i}" for kind in ("types", "ndevs") for i in (4, 5)}),
    "missing-mount-source": ({}, {f"{ST}/faults.json", "asusi/fs/nvme/engram-local", f"{ST}/stash/engram"}),
    "cifs-model": ({}, {f"{ST}/faults.json", f"{ST}/node/etc/mtab"}),
    "port-taken": ({"port": 8410}, {f"{ST}/faults.json", f"{ST}/docker.json", f"{ST}/foreign-8410.pid"}),
    "docker-down": ({}, {f"{ST}/faults.json", f"{ST}/docker.json"}),
    "clock-skew": ({"seconds": -300}, {f"{ST}/faults.json", f"{ST}/node/etc/ld.so.preload",
                                       f"{ST}/node/etc/sparkfleet-sim-clock", "asusi/bin/sim-clock.so"}),
}


@pytest.mark.parametrize("kind", list(EXPECTED_CHANGES))
def test_fault_changes_exactly_what_it_should_and_heal_restores(restored_sim, kind):
    sim = restored_sim  # each kind's heal puts the shared lab back byte for byte (asserted below and after)
    assert all(not sim.faults(n) for n in sim.nodes)
    params, expected = EXPECTED_CHANGES[kind]
    before = sandbox_snapshot()
    recorded = sim.fault("asusi", kind, **params)
    after = sandbox_snapshot()
    assert changed(before, after) == expected
    assert kind in sim.faults("asusi") and sim.faults("asusi")[kind] == recorded
    procs = {c for c, _ in node_procs(sim.root("asusi")).values()}
    assert ("earlyoom" in procs) == (kind != "earlyoom-off")
    assert (8410 in listening_ports(sim.root("asusi"))) == (kind == "port-taken")
    assert sim.heal("asusi", kind) == [("asusi", kind)]
    assert sandbox_snapshot() == before  # byte for byte, modes and symlinks included
    assert "earlyoom" in {c for c, _ in node_procs(sim.root("asusi")).values()}
    assert 8410 not in listening_ports(sim.root("asusi"))
    assert sim.heal("asusi", kind) == []


def test_fault_effects_as_the_helpers_see_them(sim):
    asusi = sim.root("asusi")
    sim.fault("asusi", "clock-latch")
    assert tool(asusi, "nvidia-smi", QUERY, CSV).stdout.split(", ")[3] == str(values.HARDWARE["gb10"]["idle_sm_mhz"])
    tool(asusi, "sim-gpu-load", "--no-wait", "30")
    cells = tool(asusi, "nvidia-smi", QUERY, CSV).stdout.strip().split(", ")
    assert 630 <= int(cells[3]) <= 950 and cells[4] == "3003" and cells[5] == "0x0000000000000000"
    sim.fault("asusi", "low-memory")
    assert meminfo(asusi)["MemAvailable"] < 100 * GIB_KB
    sim.fault("bluey", "low-memory", gib=2)
    assert meminfo(sim.root("bluey"))["MemAvailable"] == 2 * GIB_KB
    sim.fault("asusi", "earlyoom-off")
    assert "earlyoom" not in {c for c, _ in node_procs(asusi).values()}
    assert "EARLYOOM_ARGS" in cat(asusi, "/etc/default/earlyoom")
    sim.fault("asusi", "wrong-gid")
    table = gid_table(asusi)
    assert roce_v2_ipv4_index(table) == 5
    assert ipaddress.IPv6Address(table[3][0]).ipv4_mapped is None and table[3][1] == "RoCE v2"
    sim.fault("asusi", "missing-mount-source", what="cache")
    assert tool(asusi, "test", "-e", "/nvme/cache", check=False).returncode == 1
    assert tool(asusi, "test", "-d", "/nvme/engram-local").returncode == 0
    sim.fault("reddie", "cifs-model")
    rows = [r.split() for r in cat(sim.root("reddie"), "/etc/mtab").splitlines()]
    assert [r[2] for r in rows if r[1] == "/nvme/hf"] == ["cifs"]
    sim.fault("asusi", "cifs-model")
    rows = [r.split() for r in cat(asusi, "/etc/mtab").splitlines()]
    assert [r[2] for r in rows if r[1] == "/mnt/models"] == ["cifs"]
    sim.fault("spark4", "port-taken")
    spark4 = sim.root("spark4")
    assert 8000 in listening_ports(spark4)
    [c] = json.loads(tool(spark4, "docker", "inspect", *tool(spark4, "docker", "ps", "-q").stdout.split()).stdout)
    assert c["State"]["Running"] and not any(k.startswith("sparkfleet.") for k in c["Config"]["Labels"])
    assert c["HostConfig"]["PortBindings"] == {"8000/tcp": [{"HostIp": "", "HostPort": "8000"}]}
    sim.fault("spark4", "docker-down")
    down = tool(spark4, "docker", "ps", check=False)
    assert down.returncode == 1 and down.stderr.strip() == (
        "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?")


def test_heal_all_restores_every_node(sim):
    before = sandbox_snapshot()
    sim.fault("asusi", "clock-latch", mhz=700)
    sim.fault("asusi", "wrong-gid")
    sim.fault("reddie", "port-taken")
    sim.fault("reddie", "missing-mount-source")
    sim.fault("station", "low-memory")
    sim.fault("bluey", "unreachable")
    assert sandbox_snapshot() != before
    assert sorted(sim.heal()) == sorted([("asusi", "clock-latch"), ("asusi", "wrong-gid"), ("reddie", "port-taken"),
                                         ("reddie", "missing-mount-source"), ("station", "low-memory"),
                                         ("bluey", "unreachable")])
    assert sandbox_snapshot() == before
    assert all(not sim.faults(n) for n in sim.nodes)


def test_unreachable_local_node_fails_like_an_unreachable_host(sim):
    root = paths.node_root("bluey")
    before = sandbox_snapshot()
    sim.fault("bluey", "unreachable")
    assert not sim.reachable("bluey")
    # the node's wrapper answers as ssh does for a host with no route (exit 255), whatever the command
    fails = tool(root, "nvidia-smi", QUERY, CSV, check=False)
    assert fails.returncode == 255 and fails.stderr == "ssh: connect to host bluey port 22: No route to host\n"
    assert sim.faults("bluey") == {"unreachable": {}}
    sim.fault("bluey", "low-memory")  # other faults still apply to the node
    sim.heal("bluey", "low-memory")
    sim.heal("bluey")
    assert sim.reachable("bluey") and tool(root, "hostname").stdout == "bluey\n"
    assert sandbox_snapshot() == before


def test_fault_refusals(sim):
    sim.fault("asusi", "clock-latch")
    with pytest.raises(lab.UserError, match="already on"):
        sim.fault("asusi", "clock-latch")
    with pytest.raises(lab.UserError, match="no RoCE port"):
        sim.fault("station", "wrong-gid")
    with pytest.raises(lab.UserError, match="does not take --port"):
        sim.fault("asusi", "low-memory", port=1)


# -- the command line -------------------------------------------------------------------------


def test_cli_up_status_fault_heal_down(state, capsys):
    assert main(["sim", "up"]) == 0
    out = capsys.readouterr().out
    assert out and all("[sim]" in line for line in out.splitlines())
    assert main(["sim", "up"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already exists" in err and "--force" in err
    assert main(["sim", "fault", "nosuch", "clock-latch"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "sparkfleet: unknown node 'nosuch' (simulated nodes: reddie, asusi, bluey, spark4, station)"
    assert main(["sim", "fault", "asusi", "meltdown"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "clock-latch" in err and "unreachable" in err
    assert main(["sim", "fault", "asusi", "port-taken", "--port", "8410"]) == 0
    assert capsys.readouterr().out.startswith("[sim] fault port-taken injected on asusi (port=8410)")
    assert main(["sim", "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["simulation"] is True and status["transport"] == "local"
    assert status["nodes"]["asusi"]["faults"]["port-taken"]["port"] == 8410
    assert main(["sim", "status"]) == 0
    table = capsys.readouterr().out
    assert "SIMULATION" in table.splitlines()[0] and "port-taken port=8410" in table
    assert main(["sim", "heal", "port-taken"]) == 0  # a kind alone heals it on every node
    assert capsys.readouterr().out == "[sim] healed port-taken on asusi\n"
    assert main(["sim", "up", "--force"]) == 0
    capsys.readouterr()
    assert main(["sim", "down"]) == 0
    assert capsys.readouterr().out == "[sim] simulated lab stopped and removed\n"
    assert not paths.sim_dir().exists()
    assert main(["sim", "down"]) == 0  # idempotent
    assert main(["sim", "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1]) == {"simulation": True, "exists": False}
    assert main(["sim", "fault", "asusi", "clock-latch"]) == 2


def test_up_accepts_an_inventory_file_and_force(state, tmp_path):
    src = find_root() / "inventories/lab.yaml"
    two = tmp_path / "two.yaml"
    text = src.read_text()
    two.write_text(text.replace("  sparks: [reddie, asusi, bluey, spark4]", "  sparks: [reddie, asusi]"))
    data = Spec(find_root()).inventory(str(two))
    assert data.groups["sparks"] == ["reddie", "asusi"]
    lab.up(str(two), docker=DOCKER)
    with pytest.raises(lab.UserError, match="already exists"):
        lab.up(str(two), docker=DOCKER)
    s = lab.up("lab", force=True, docker=DOCKER)
    assert s.manifest["source_inventory"].endswith("inventories/lab.yaml")
    lab.down()
    assert lab.current() is None


# -- ssh mode ---------------------------------------------------------------------------------


def need_sshd() -> None:
    """Skip only on a developer machine without OpenSSH; under CI the test must run (and fail if it cannot)."""
    if (not os.path.exists("/usr/sbin/sshd") or not shutil.which("ssh")) and not os.environ.get("CI"):
        pytest.skip("OpenSSH server/client not installed (apt-get install openssh-server); CI unset")


def test_ssh_mode_sshd_inside_each_node_pinned_keys(state):
    need_sshd()
    sim = lab.up("lab", transport="ssh", docker=DOCKER)
    try:
        inv = sim.inventory()
        known_hosts = state / "known_hosts"
        assert paths.known_hosts_path() == known_hosts
        for name, n in inv.nodes.items():
            assert n.transport == "ssh" and n.wrapper is None
            assert f"{sshd.host_entry(n.ssh.host, n.ssh.port)} ssh-ed25519 " in known_hosts.read_text()
            assert sim.status()["nodes"][name]["sshd"]["pid"]
        if os.geteuid() == 0:  # each node in its own network namespace, reached on its management address
            assert [n.ssh.host for n in inv.nodes.values()] == [netlab.mgmt_ip(i) for i in range(5)]
            # the names are fixed: a `sim down` under another state dir must leave this lab's network alone
            spaces = sorted(netlab.ours())
            assert spaces == sorted([netlab.FABRIC_NS, *(netlab.netns_name(name) for name in inv.nodes)])
            with pytest.MonkeyPatch.context() as elsewhere:
                elsewhere.setenv("SPARKFLEET_STATE", str(state / "elsewhere"))
                assert lab.down() is False
            assert sorted(netlab.ours()) == spaces

        def ssh(node_name: str, command: str, kh: Path = known_hosts) -> subprocess.CompletedProcess:
            n = inv.nodes[node_name]
            return subprocess.run(
                ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o",
                 f"UserKnownHostsFile={kh}", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5",
                 "-i", n.ssh.key, "-p", str(n.ssh.port), f"{n.ssh.user}@{n.ssh.host}", command],
                capture_output=True, text=True, timeout=30)

        r = ssh("asusi", f"hostname; command -v nvidia-smi; nvidia-smi {QUERY} {CSV}; cat /etc/hostname")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "asusi" and lines[1] == "/usr/local/bin/nvidia-smi" and lines[3] == "asusi"
        assert CSV_LINE.match(lines[2]) and lines[2].startswith("0, NVIDIA GB10, ")
        assert ssh("station", "hostname").stdout == "station\n"
        if os.geteuid() == 0:  # the fabric: asusi reaches reddie's fabric IP on its own fabric interface
            fab = inv.nodes["reddie"].fabric_ip
            r = ssh("asusi", f"ip -br addr show {inv.nodes['asusi'].rdma.fabric_iface}; "
                             f"python3 -c 'import socket; s=socket.create_connection((\"{fab}\", 22), 3); "
                             "print(s.recv(4).decode())'")
            assert inv.nodes["asusi"].fabric_ip in r.stdout and "SSH-" in r.stdout, r.stderr
        # bluey's sshd presents its own key: a known_hosts that pins asusi's key for bluey's address is refused
        asusi_key = sshd.public_key(paths.node_root("asusi") / shim.STATE / "ssh/ssh_host_ed25519_key")
        n = inv.nodes["bluey"]
        bad_kh = state / "bad_known_hosts"
        bad_kh.write_text(f"{sshd.host_entry(n.ssh.host, n.ssh.port)} {asusi_key}\n")
        refused = ssh("bluey", "true", bad_kh)
        assert refused.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in refused.stderr

        if os.geteuid() == 0:  # link faults change the node's real fabric link, and heal puts it back
            iface = inv.nodes["bluey"].rdma.fabric_iface
            before = snapshot(paths.node_root("bluey") / shim.STATE / "node")
            sysfs = snapshot(paths.node_root("bluey") / "sys")
            sim.fault("bluey", "slow-link", rate="20mbit")
            assert "tbf" in ssh("bluey", f"tc qdisc show dev {iface}").stdout
            assert "rate 20Mbit" in ssh("bluey", f"tc qdisc show dev {iface}").stdout
            sim.fault("bluey", "mtu-mismatch")
            assert ssh("bluey", f"cat /sys/class/net/{iface}/mtu").stdout == "1500\n"
            assert "mtu 1500" in ssh("bluey", f"ip link show dev {iface}").stdout
            sim.fault("bluey", "driver-drift", driver="575.51.03")
            assert ssh("bluey", "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout == "575.51.03\n"
            assert "Driver Version: 575.51.03" in ssh("bluey", "nvidia-smi").stdout
            assert sorted(sim.heal("bluey")) == [("bluey", "driver-drift"), ("bluey", "mtu-mismatch"),
                                                 ("bluey", "slow-link")]
            assert "tbf" not in ssh("bluey", f"tc qdisc show dev {iface}").stdout
            assert "mtu 9000" in ssh("bluey", f"ip link show dev {iface}").stdout
            assert snapshot(paths.node_root("bluey") / "sys") == sysfs
            assert snapshot(paths.node_root("bluey") / shim.STATE / "node") == before
            with pytest.raises(lab.UserError, match="--rate fast"):
                sim.fault("bluey", "slow-link", rate="fast")
        sim.fault("asusi", "unreachable")
        assert not sim.reachable("asusi")
        assert ssh("asusi", "true").returncode == 255
        sim.heal("asusi")
        assert sim.reachable("asusi")
        assert ssh("asusi", "hostname").stdout == "asusi\n"  # same address, same pinned key
    finally:
        lab.down()
    assert "sparkfleet-sim:" not in known_hosts.read_text()
    assert not paths.sim_dir().exists()
    assert not [ns for ns in netlab.ours()]


def _engine_argv(root: Path, *flags: str, env: tuple[str, ...] = (), binds: tuple[str, ...] = (),
                 active: dict | None = None) -> list[str]:
    c = {"Config": {"Labels": {"sparkfleet.profile": "dcp2"}, "Env": list(env),
                    "Cmd": ["/models/repo", "--port", "8410", *flags]}, "HostConfig": {"Binds": list(binds)}}
    return shim.engine_argv(root, c, sandbox.engine_state() | {"python": "python3"}, active or {})


def test_slow_boot_takes_its_factor_to_the_engine(tmp_path):
    """slow-boot's --factor reaches the rank as --slow-boot-factor; without it the engine's default (10) holds;
    a factor below 1 (a faster boot) is refused."""
    from sparkfleet.sim import faults

    root = _gb10_root(tmp_path)
    a = _engine_argv(root, active={"slow-boot": {"factor": 100.0}})
    assert a[a.index("--fault") + 1] == "slow-boot" and a[a.index("--slow-boot-factor") + 1] == "100.0"
    a = _engine_argv(root, active={"slow-boot": {}})
    assert "slow-boot" in a and "--slow-boot-factor" not in a
    assert faults.check_params("slow-boot", {"factor": 3.0}) == {"factor": 3.0}
    with pytest.raises(lab.UserError, match=r"slow-boot --factor 0.5: expected a number of at least 1"):
        faults.APPLY["slow-boot"](root, {"factor": 0.5})


def _gb10_root(tmp_path: Path) -> Path:
    """A node tree with a GB10's state and /proc/meminfo (the inventory's 121 GiB, INV-10)."""
    root = tmp_path / "R"
    inv = Spec(find_root()).inventory("lab")
    shim.save(root, "node.json", sandbox.node_state(inv, inv.nodes["asusi"], 1) | {"netns": False})
    shim.save(root, "gpu.json", sandbox.gpu_state(inv.nodes["asusi"]))
    shim.save(root, "faults.json", {"faults": {}})
    shim.render(root)
    return root


def test_the_sim_engine_takes_its_moe_line_from_the_launch_not_the_profile(tmp_path):
    """The MoE backend line comes from the launch's --moe-backend (HLT-21's kernel for b12x), whatever the
    profile expects: a lane whose flag changed under an unchanged expectation prints another line."""
    root = _gb10_root(tmp_path)
    a = _engine_argv(root, "--moe-backend", "b12x")
    assert a[a.index("--moe-backend") + 1] == "B12X_MXFP4_MXFP8"
    a = _engine_argv(root, "--moe-backend", "marlin")
    assert a[a.index("--moe-backend") + 1] == "MARLIN"
    assert "--moe-backend" not in _engine_argv(root)
    assert "lanes" not in sandbox.engine_state()  # nothing per profile reaches the engine


def test_the_sim_engine_prints_the_vllm_version_the_image_declares(tmp_path):
    """A profile's image.engine_version becomes its image's label in the lab's docker state; a rank of that
    image gets it as --vllm-version (an image declaring none: the engine's default). The lane's vLLM
    environment reaches the engine as its flags."""
    dcp2 = Spec(find_root()).profile("dcp2").profile
    old = dcp2.model_copy(update={"image": dcp2.image.model_copy(update={"engine_version": "0.11.1"})})
    other = dcp2.model_copy(update={"image": dcp2.image.model_copy(update={"ref": "vllm/vllm-openai:v0.20.0",
                                                                           "engine_version": "0.20.0"})})
    docker = sandbox.docker_state([old, other, dcp2])  # dcp2 names old's image again, declaring nothing
    assert [(i["RepoTags"], i["Config"]["Labels"]) for i in docker["images"]] == [
        ([dcp2.image.ref], {shim.engine.ENGINE_VERSION_LABEL: "0.11.1"}),
        (["vllm/vllm-openai:v0.20.0"], {shim.engine.ENGINE_VERSION_LABEL: "0.20.0"})]
    root = _gb10_root(tmp_path)
    shim.save(root, "docker.json", docker)

    def argv(image: dict | None, env: tuple[str, ...] = ()) -> list[str]:
        c = {"Config": {"Labels": {"sparkfleet.profile": "dcp2"}, "Env": list(env), "Cmd": ["/m", "--port", "8410"]},
             "HostConfig": {"Binds": []}, "Image": image["Id"] if image else "sha256:" + "0" * 64}
        return shim.engine_argv(root, c, sandbox.engine_state() | {"python": "python3"}, {})

    for image, version in zip(docker["images"], ("0.11.1", "0.20.0"), strict=True):
        a = argv(image)
        assert a[a.index("--vllm-version") + 1] == version
    assert "--vllm-version" not in argv(None)
    assert "--vllm-version" not in argv(sandbox.image_record("plain:1", []))
    a = argv(None, ("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=30", "VLLM_RINGBUFFER_WARNING_INTERVAL=10"))
    assert a[a.index("--execute-model-timeout") + 1] == "30" and a[a.index("--ringbuffer-warning-interval") + 1] == "10"
    assert "--execute-model-timeout" not in argv(None)


def test_the_sim_engine_sizes_kv_from_the_launch_not_the_profile(tmp_path):
    """KV tokens from --kv-cache-memory-bytes and the DCP size (the seeds' pairs reproduce exactly, HLT-20);
    a changed budget under an unchanged expectation gives another number, so `expect` fails for real."""
    root = _gb10_root(tmp_path)

    def kv(*flags: str) -> int:
        a = _engine_argv(root, *flags)
        return int(a[a.index("--kv-tokens") + 1])

    def budget(*flags: str) -> int:  # what the engine prints as "Available KV cache memory"
        a = _engine_argv(root, *flags)
        return int(a[a.index("--kv-memory-bytes") + 1])

    assert kv("--kv-cache-memory-bytes", str(8 * 2**30)) == 1_263_118  # dcp1 (OQ-05)
    assert kv("--kv-cache-memory-bytes", str(6 * 2**30), "--decode-context-parallel-size", "2") == 1_888_800  # dcp2
    assert kv("--kv-cache-memory-bytes", str(6 * 2**30), "--decode-context-parallel-size", "4") == 3_777_600
    assert kv("--kv-cache-memory-bytes", str(5 * 2**30), "--decode-context-parallel-size", "2") < 1_888_800
    # sized by memory utilisation: boot 10's published pair (gmu 0.80 on 121 GiB, 81.58 GiB weights) comes back,
    # the node's MemTotal and the flag move it, and a budget the weights eat leaves no KV at all
    assert kv("--gpu-memory-utilization", "0.80") == 1_070_168
    assert kv("--gpu-memory-utilization", "0.78") < 1_070_168 < kv("--gpu-memory-utilization", "0.85")
    assert kv("--gpu-memory-utilization", "0.80", "--kv-cache-memory-bytes", str(8 * 2**30)) == 1_263_118
    assert kv("--gpu-memory-utilization", "0.70") < 0
    # the budget named in "Available KV cache memory" is the launch's, not one derived from a token count
    assert budget("--kv-cache-memory-bytes", str(8 * 2**30)) == 8 * 2**30
    assert budget("--kv-cache-memory-bytes", str(6 * 2**30), "--decode-context-parallel-size", "2") == 6 * 2**30
    # boot 10's budget is what its 1,070,168 tokens cost plus what vLLM keeps back (about 6.79 GiB)
    per_token, reserved = Fraction(*values.KV_BYTES_PER_TOKEN), Fraction(*values.KV_RESERVED_BYTES)
    assert 0 <= budget("--gpu-memory-utilization", "0.80") - (reserved + 1_070_168 * per_token) < per_token + 1
    assert budget("--gpu-memory-utilization", "0.70") < 0
    meminfo = shim.bound_source(root, "/proc/meminfo")
    meminfo.write_text(meminfo.read_text().replace("MemTotal:       126877696 kB", "MemTotal:       125829120 kB"))
    assert kv("--gpu-memory-utilization", "0.80") < 1_070_168  # 1 GiB less MemTotal on this node


def test_the_pin_hot_rehome_line_comes_from_the_hook_in_the_launch(tmp_path):
    """`rehome done layers=40` (HLT-27; 40 MoE layers, INV-74) only when the launch carries the hook (LCH-G4):
    PIN_HOOK and its sitecustomize.py bound over the image's."""
    root = _gb10_root(tmp_path)
    hook = ("/h/sitecustomize.py:/usr/lib/python3.12/sitecustomize.py:ro", "/h:/w:ro")
    a = _engine_argv(root, env=("PIN_HOOK=/w/pin_hot_experts_hook.py",), binds=hook)
    assert a[a.index("--rehome-layers") + 1] == "40"
    assert "--rehome-layers" not in _engine_argv(root, binds=hook)
    assert "--rehome-layers" not in _engine_argv(root, env=("PIN_HOOK=/w/pin_hot_experts_hook.py",), binds=hook[1:])


def test_up_without_bubblewrap_says_what_is_missing_and_creates_nothing(state, monkeypatch, capsys):
    monkeypatch.setattr(simnode, "BWRAP_CANDIDATES", ())
    monkeypatch.setattr(simnode.shutil, "which", lambda name: None)
    assert main(["sim", "up"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bubblewrap (apt-get install bubblewrap)" in err
    assert "nothing was created" in err
    assert not paths.sim_dir().exists() and not netlab.ours()


def _mounts_and_processes() -> tuple[list[str], set[str]]:
    mounts = Path("/proc/mounts").read_text().splitlines()
    procs = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                procs.add(Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                pass
    return mounts, procs


def test_down_leaves_no_mount_namespace_process_or_directory(state):
    mounts, _ = _mounts_and_processes()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    sim = lab.up("lab", docker=DOCKER)
    nodes_dir = paths.nodes_dir()
    _, during = _mounts_and_processes()
    assert any(str(nodes_dir) in c for c in during)  # the nodes' inits run
    tool(sim.root("asusi"), "docker", "run", "-d", "--name", "x", "nvcr.io/nvidia/pytorch:26.07-py3", "sleep")
    lab.down()
    after_mounts, after = _mounts_and_processes()
    assert after_mounts == mounts
    assert not any(str(nodes_dir) in c for c in after)  # no node init (its bwrap names the node's dir)
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == netns
    assert not paths.sim_dir().exists()
    assert sorted(p.name for p in state.iterdir()) in ([], ["known_hosts"])
