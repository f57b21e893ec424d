"""The simulated lab: sandbox layout, shim output shapes (docs/sim-layout.md), faults and heal, ssh mode."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.root import find_root
from sparkfleet.sim import lab, paths, sshd, values
from sparkfleet.spec.load import Spec

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
    return tmp_path


@pytest.fixture
def sim(state):
    s = lab.up("lab")
    yield s
    lab.down()


@pytest.fixture(scope="module")
def shared_state(tmp_path_factory):
    """One simulated lab for the tests that only read it (building one takes most of a second)."""
    state_dir = tmp_path_factory.mktemp("shared-sim")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state_dir))
        lab.up("lab")
    yield state_dir
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state_dir))
        lab.down()


@pytest.fixture
def ro_sim(shared_state, monkeypatch):
    """The shared lab, read-only: tests using it must not change it."""
    monkeypatch.setenv("SPARKFLEET_STATE", str(shared_state))
    s = lab.current()
    assert s is not None
    before = snapshot(paths.nodes_dir())
    yield s
    assert snapshot(paths.nodes_dir()) == before, "a read-only test changed the shared simulated lab"


@pytest.fixture(scope="module")
def source():
    return Spec(find_root()).inventory("lab")


def tool(root: Path, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a shim as a node-side helper would: found on PATH, sandbox from $SPARKFLEET_SIM_ROOT."""
    # the node's PATH (as the sim's sshd sets it): the shims, then the system's dirs (python3 is /usr/bin's)
    env = {**os.environ, "SPARKFLEET_SIM_ROOT": str(root),
           "PATH": f"{root / 'bin'}:{sshd.SYSTEM_PATH}:{os.environ['PATH']}"}
    proc = subprocess.run([name, *args], env=env, capture_output=True, text=True, timeout=30)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def meminfo(root: Path) -> dict[str, int]:
    out = {}
    for line in (root / "proc/meminfo").read_text().splitlines():
        key, value = line.split(":")
        out[key] = int(value.split()[0])
    return out


def gid_table(root: Path, hca: str = "rocep1s0f0") -> dict[int, tuple[str, str | None]]:
    base = root / f"sys/class/infiniband/{hca}/ports/1"
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


def snapshot(top: Path) -> dict[str, object]:
    """Every path under `top` with its content (bytes), symlink target or 'dir', plus its mode."""
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
            else:
                out[rel] = (p.read_bytes(), p.stat().st_mode)
    return out


def changed(before: dict, after: dict) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


# -- the sandbox layout -----------------------------------------------------------------------


def test_up_builds_one_sandbox_per_node_with_the_contract_layout(ro_sim, source):
    assert sorted(p.name for p in paths.nodes_dir().iterdir()) == sorted(source.nodes)
    asusi = ro_sim.root("asusi")
    # the top level: contract dirs plus exactly the absolute storage paths the inventory and lanes use
    assert {p.name for p in asusi.iterdir()} == {
        "bin", "etc", "home", "proc", "state", "sys",
        "mnt",  # /mnt/models (model root, NFS)
        "nvme",  # /nvme/engram-local, /nvme/cache
        "var",  # /var/lib/sparkfleet/patches (patch_root)
        "opt", "DeepSeek-V4.1-Flash-1017-EXL3-3.5bpw",  # tf1017's recipe_dir and model_dir
    }
    assert {p.name for p in (asusi / "proc").iterdir()} == {"meminfo", "uptime", "mounts", "net", "sys", "1034",
                                                           "1187"}
    assert {p.name for p in (ro_sim.root("reddie") / "proc").iterdir()} == {
        "meminfo", "uptime", "mounts", "net", "sys", "812", "1034", "1187"}  # the head also runs rpcbind for NFS
    assert (asusi / "proc/sys/vm/drop_caches").read_text() == "0\n"
    assert {p.name for p in (asusi / "state").iterdir()} == {
        "node.json", "gpu.json", "docker.json", "faults.json", "engine.json", "logs", "stash", ".lock"}
    assert sorted(p.name for p in (asusi / "bin").iterdir()) == ["docker", "ibdev2netdev", "ip", "nvidia-smi",
                                                                 "sim-gpu-load", "sysctl"]
    for shim in (asusi / "bin").iterdir():
        assert os.access(shim, os.X_OK)
        assert shim.read_text().startswith("#!/usr/bin/env python3\n")
    assert (asusi / "etc/hostname").read_text() == "asusi\n"
    assert json.loads((asusi / "state/faults.json").read_text()) == {"faults": {}}
    up, idle = (float(x) for x in (asusi / "proc/uptime").read_text().split())
    assert up > 0 and idle > up


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
    first = (ro_sim.root("asusi") / "proc/meminfo").read_text().splitlines()[0]
    assert first == f"MemTotal:       {121 * GIB_KB:>8} kB"


def test_mounts_nfs4_on_workers_local_nvme_on_head_and_station(ro_sim, source):
    for node in ("asusi", "bluey", "spark4"):
        rows = [line.split() for line in (ro_sim.root(node) / "proc/mounts").read_text().splitlines()]
        nfs = [r for r in rows if r[1] == "/mnt/models"]
        assert len(nfs) == 1
        src, target, fstype, opts, dump, passno = nfs[0]
        assert (src, fstype, dump, passno) == ("192.168.192.11:/nvme/hf", "nfs4", "0", "0")
        assert source.nodes[node].storage.nfs_mount.source == src
        assert f"clientaddr={source.nodes[node].fabric_ip}" in opts and "addr=192.168.192.11" in opts
    reddie = [line.split() for line in (ro_sim.root("reddie") / "proc/mounts").read_text().splitlines()]
    assert not [r for r in reddie if r[2] in ("nfs", "nfs4", "cifs")]
    assert ["/dev/nvme0n1p2", "/", "ext4"] == [r for r in reddie if r[1] == "/"][0][:3]  # /nvme/hf lies on it
    station = [line.split() for line in (ro_sim.root("station") / "proc/mounts").read_text().splitlines()]
    assert [r[:3] for r in station if r[1] == "/models"] == [["/dev/md0", "/models", "xfs"]]  # INV-53


def test_earlyoom_process_and_config(ro_sim):
    for node in SPARKS:
        root = ro_sim.root(node)
        assert (root / "proc/1187/comm").read_text() == "earlyoom\n"
        assert (root / "proc/1187/cmdline").read_bytes() == b"/usr/bin/earlyoom\0-m\x002\0-r\x003600\0"
        assert 'EARLYOOM_ARGS="-m 2 -r 3600"\n' in (root / "etc/default/earlyoom").read_text()  # 2 % (INV-13)
    station = ro_sim.root("station")  # no earlyoom percentage for GB300 in the seeds: Debian's defaults
    assert (station / "proc/1187/cmdline").read_bytes() == b"/usr/bin/earlyoom\0-r\x003600\0"


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


def test_listeners_in_proc_net_tcp(ro_sim):
    tcp = (ro_sim.root("reddie") / "proc/net/tcp").read_text().splitlines()
    assert tcp[0].split()[:4] == ["sl", "local_address", "rem_address", "st"]
    listening = {int(r.split()[1].split(":")[1], 16) for r in tcp[1:] if r.split()[3] == "0A"}
    assert listening == {22, 111, 2049}  # sshd, rpcbind and nfsd on the NFS head
    six = (ro_sim.root("asusi") / "proc/net/tcp6").read_text().splitlines()
    assert [r.split()[1] for r in six[1:]] == ["0" * 32 + ":0016"]
    inode = (ro_sim.root("asusi") / "proc/net/tcp").read_text().splitlines()[1].split()[9]
    assert os.readlink(ro_sim.root("asusi") / "proc/1034/fd/3") == f"socket:[{inode}]"


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
    assert ro_sim.inventory_path == paths.sim_inventory_path() == paths.sim_dir() / "inventory.yaml"
    assert inv.name == "sim"
    assert list(inv.nodes) == list(source.nodes) and inv.groups == source.groups
    for name, node in inv.nodes.items():
        assert node.transport == "local"
        assert node.sim_root == str(paths.node_root(name))
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
    env = {**os.environ, "SPARKFLEET_SIM_ROOT": str(root), "PATH": f"{root / 'bin'}:{sshd.SYSTEM_PATH}"}
    load = subprocess.Popen(["sim-gpu-load", "1.5"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
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
    killed = subprocess.Popen(["sim-gpu-load", "60"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        while "0x0000000000000000" not in tool(root, "nvidia-smi", QUERY, CSV).stdout:
            assert killed.poll() is None
        killed.terminate()
        assert killed.wait(timeout=10) == 128 + 15
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
    rows = (root / "proc/net/tcp").read_text().splitlines()[1:]
    return {int(r.split()[1].split(":")[1], 16) for r in rows if r.split()[3] == "0A"}


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
    assert c["Config"]["Env"] == ["VLLM_HOST_IP=192.168.192.12"]
    assert 8410 in listening_ports(root)  # a host-network server listens on its own --port
    pid = c["State"]["Pid"]
    assert (root / f"proc/{pid}/cmdline").read_bytes().split(b"\0")[-3:] == [b"1", b"--headless", b""]
    assert tool(root, "docker", "ps", "--filter", "label=sparkfleet.profile=dcp2", "--format",
                "{{.Names}} {{.Label \"sparkfleet.rank\"}}").stdout == "sf-dcp2-r1 1\n"
    conflict = tool(root, "docker", *DCP2_RUN, check=False)
    assert conflict.returncode == 125 and 'The container name "/sf-dcp2-r1" is already in use' in conflict.stderr
    busy_rm = tool(root, "docker", "rm", "sf-dcp2-r1", check=False)
    assert busy_rm.returncode == 1 and "container is running" in busy_rm.stderr
    assert tool(root, "docker", "stop", "sf-dcp2-r1").stdout == "sf-dcp2-r1\n"
    [c] = json.loads(tool(root, "docker", "inspect", cid).stdout)
    assert c["State"]["Status"] == "exited" and c["State"]["ExitCode"] == values.STOP_EXIT_CODE
    assert 8410 not in listening_ports(root) and not (root / f"proc/{pid}").exists()
    assert tool(root, "docker", "ps", "-q").stdout == ""
    tool(root, "docker", "start", cid[:12])
    assert 8410 in listening_ports(root)
    (root / f"state/logs/{cid}.log").write_text("INFO Starting vLLM API server 0 on http://0.0.0.0:8410\n")
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
    assert 8000 in listening_ports(root)
    assert (root / "srv/missing").is_dir()  # dockerd creates a missing bind source, empty (FM-12)


# -- faults -----------------------------------------------------------------------------------


def sandbox_snapshot() -> dict[str, object]:
    return snapshot(paths.nodes_dir())


GIDS = "asusi/sys/class/infiniband/rocep1s0f0/ports/1"
EXPECTED_CHANGES: dict[str, tuple[dict, set[str]]] = {
    "clock-latch": ({}, {"asusi/state/faults.json"}),
    "slow-state": ({}, {"asusi/state/faults.json"}),
    "low-memory": ({}, {"asusi/state/faults.json", "asusi/proc/meminfo"}),
    "earlyoom-off": ({}, {"asusi/state/faults.json", "asusi/proc/1187", "asusi/proc/1187/comm",
                          "asusi/proc/1187/cmdline"}),
    "wrong-gid": ({}, {"asusi/state/faults.json"} | {f"{GIDS}/gids/{i}" for i in (2, 3, 4, 5)}
                  | {f"{GIDS}/gid_attrs/{kind}/{i}" for kind in ("types", "ndevs") for i in (4, 5)}),
    "missing-mount-source": ({}, {"asusi/state/faults.json", "asusi/nvme/engram-local",
                                  "asusi/state/stash/engram"}),
    "cifs-model": ({}, {"asusi/state/faults.json", "asusi/proc/mounts"}),
    "port-taken": ({"port": 8410}, {"asusi/state/faults.json", "asusi/state/docker.json", "asusi/proc/net/tcp",
                                    "asusi/proc/net/tcp6"}
                   | {f"asusi/proc/{pid}{sub}" for pid in (values.FOREIGN_PID, values.FOREIGN_PID + 1)
                      for sub in ("", "/comm", "/cmdline")}
                   | {f"asusi/proc/{values.FOREIGN_PID + 1}/fd{n}" for n in ("", "/3", "/4")}),
    "docker-down": ({}, {"asusi/state/faults.json", "asusi/state/docker.json"}),
}


@pytest.mark.parametrize("kind", list(EXPECTED_CHANGES))
def test_fault_changes_exactly_what_it_should_and_heal_restores(sim, kind):
    params, expected = EXPECTED_CHANGES[kind]
    before = sandbox_snapshot()
    recorded = sim.fault("asusi", kind, **params)
    after = sandbox_snapshot()
    assert changed(before, after) == expected
    assert kind in sim.faults("asusi") and sim.faults("asusi")[kind] == recorded
    assert sim.heal("asusi", kind) == [("asusi", kind)]
    assert sandbox_snapshot() == before  # byte for byte, modes and symlinks included
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
    assert not any((p / "comm").is_file() and (p / "comm").read_text() == "earlyoom\n"
                   for p in (asusi / "proc").iterdir())
    assert (asusi / "etc/default/earlyoom").is_file()
    sim.fault("asusi", "wrong-gid")
    table = gid_table(asusi)
    assert roce_v2_ipv4_index(table) == 5
    assert ipaddress.IPv6Address(table[3][0]).ipv4_mapped is None and table[3][1] == "RoCE v2"
    sim.fault("asusi", "missing-mount-source", what="cache")
    assert not (asusi / "nvme/cache").exists() and (asusi / "nvme/engram-local").is_dir()
    sim.fault("reddie", "cifs-model")
    rows = [r.split() for r in (sim.root("reddie") / "proc/mounts").read_text().splitlines()]
    assert [r[2] for r in rows if r[1] == "/nvme/hf"] == ["cifs"]
    sim.fault("asusi", "cifs-model")
    rows = [r.split() for r in (asusi / "proc/mounts").read_text().splitlines()]
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
    assert not root.exists() and not sim.reachable("bluey")
    # every path under R is gone, so a local transport cannot even start a command there (cwd=R fails);
    # a shim reached some other way answers like an unreachable host
    with pytest.raises(FileNotFoundError):
        subprocess.run(["true"], cwd=root)
    parked = paths.parked_root("bluey") / "bin/nvidia-smi"
    env = {**os.environ, "SPARKFLEET_SIM_ROOT": str(root), "SPARKFLEET_NODE": "bluey"}
    fails = subprocess.run([str(parked), QUERY, CSV], env=env, capture_output=True, text=True)
    assert fails.returncode == 255 and fails.stderr == "ssh: connect to host bluey port 22: No route to host\n"
    assert sim.faults("bluey") == {"unreachable": {}}
    sim.fault("bluey", "low-memory")  # other faults still apply to the parked sandbox
    sim.heal("bluey", "low-memory")
    sim.heal("bluey")
    assert sim.reachable("bluey") and sandbox_snapshot() == before


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
    assert out and all(line.startswith("[sim]") for line in out.splitlines())
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
    lab.up(str(two))
    with pytest.raises(lab.UserError, match="already exists"):
        lab.up(str(two))
    s = lab.up("lab", force=True)
    assert s.manifest["source_inventory"].endswith("inventories/lab.yaml")
    lab.down()
    assert lab.current() is None


# -- ssh mode ---------------------------------------------------------------------------------


def need_sshd() -> None:
    """Skip only on a developer machine without OpenSSH; under CI the test must run (and fail if it cannot)."""
    if (not os.path.exists("/usr/sbin/sshd") or not shutil.which("ssh")) and not os.environ.get("CI"):
        pytest.skip("OpenSSH server/client not installed (apt-get install openssh-server); CI unset")


def test_ssh_mode_real_sshd_pinned_keys_and_environment(state):
    need_sshd()
    sim = lab.up("lab", transport="ssh")
    try:
        inv = sim.inventory()
        known_hosts = state / "known_hosts"
        assert paths.known_hosts_path() == known_hosts
        pids = {}
        for name, node in inv.nodes.items():
            assert node.transport == "ssh" and node.ssh.host == "127.0.0.1"
            assert f"[127.0.0.1]:{node.ssh.port} ssh-ed25519 " in known_hosts.read_text()
            pids[name] = sim.status()["nodes"][name]["sshd"]["pid"]
            assert pids[name] and sshd.alive(pids[name])

        def ssh(node_name: str, command: str) -> subprocess.CompletedProcess:
            n = inv.nodes[node_name]
            return subprocess.run(
                ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o",
                 f"UserKnownHostsFile={known_hosts}", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5",
                 "-i", n.ssh.key, "-p", str(n.ssh.port), f"{n.ssh.user}@{n.ssh.host}", command],
                capture_output=True, text=True, timeout=30)

        r = ssh("asusi", 'echo "$SPARKFLEET_NODE $SPARKFLEET_SIM_ROOT $HOME"; command -v nvidia-smi; '
                         f"nvidia-smi {QUERY} {CSV}")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        root = paths.node_root("asusi")
        assert lines[0] == f"asusi {root} {root / 'home'}"
        assert lines[1] == str(root / "bin/nvidia-smi")
        assert CSV_LINE.match(lines[2]) and lines[2].startswith("0, NVIDIA GB10, ")
        assert ssh("station", "echo $SPARKFLEET_NODE").stdout == "station\n"
        # bluey's sshd presents its own key: a known_hosts that pins asusi's key for bluey's port is refused
        asusi_key = sshd.public_key(paths.ssh_dir() / "asusi/ssh_host_ed25519_key")
        n = inv.nodes["bluey"]
        bad_kh = state / "bad_known_hosts"
        bad_kh.write_text(f"[127.0.0.1]:{n.ssh.port} {asusi_key}\n")
        refused = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o",
                                  f"UserKnownHostsFile={bad_kh}", "-i", n.ssh.key, "-p", str(n.ssh.port),
                                  f"{n.ssh.user}@127.0.0.1", "true"], capture_output=True, text=True, timeout=30)
        assert refused.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in refused.stderr

        sim.fault("asusi", "unreachable")
        assert not sshd.alive(pids["asusi"]) and not sim.reachable("asusi")
        assert ssh("asusi", "true").returncode == 255
        sim.heal("asusi")
        assert sim.reachable("asusi")
        assert ssh("asusi", "echo $SPARKFLEET_NODE").stdout == "asusi\n"  # same port, same pinned key
        pids["asusi"] = sim.sshd_pid("asusi")
    finally:
        lab.down()
    assert not any(sshd.alive(p) for p in pids.values())
    assert "sparkfleet-sim:" not in known_hosts.read_text()
    assert not paths.sim_dir().exists()
