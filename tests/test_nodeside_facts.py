"""The node-side facts helper, run as nodes run it (python3 + JSON on stdin) against hand-built sandboxes.

Every sandbox follows docs/sim-layout.md; the nvidia-smi, docker and ibdev2netdev on PATH are this
test's own small scripts, which log their argv so the exact commands the helper runs are checked too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkfleet.fleet.nodefacts import NodeFacts
from tests.noderoot import argv_in_root

HELPER = Path(__file__).resolve().parent.parent / "sparkfleet" / "fleet" / "nodeside" / "facts.py"


def _system_python3() -> str:
    """The interpreter `python3` on PATH really is (a pyenv shim needs bash on PATH; the tests narrow PATH)."""
    found = shutil.which("python3")
    if found is None:
        return sys.executable
    p = subprocess.run([found, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True, timeout=30)
    return p.stdout.strip() or sys.executable


PYTHON3 = _system_python3()

MEM_TOTAL_KB = 126_701_056  # a GB10's MemTotal
MEM_AVAILABLE_KB = 118_442_112
GPU_QUERY = ("--query-gpu=index,name,pstate,clocks.sm,clocks.max.sm,clocks_event_reasons.active,power.draw,"
             "memory.total,memory.used")
DAEMON_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"

IMG_VLLM = "sha256:" + "a" * 64
IMG_GLM = "sha256:" + "b" * 64  # dangling: not in `docker images`, only reachable from its container
IMG_OTHER = "sha256:" + "c" * 64
DIGEST_VLLM = "aidendle94/sparkrun-vllm-dsv41-gb10@sha256:" + "d" * 64
DIGEST_GLM = "zai/glm@sha256:" + "e" * 64
REVISION = "df42c109f1defefcbfcedbe7d905718a12266e40"


def write(path: Path, text: str | bytes, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


def script(bin_dir: Path, name: str, body: str) -> None:
    """A fake command: a Python script that logs its argv to <bin>/<name>.log, then runs `body`."""
    log = bin_dir / f"{name}.log"
    write(bin_dir / name, f"#!{sys.executable}\nimport json, sys\n"
          f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n{body}\n", 0o755)


def calls(bin_dir: Path, name: str) -> list[list[str]]:
    log = bin_dir / f"{name}.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def container(cid: str, name: str, image_ref: str, image_id: str, status: str, **extra) -> dict:
    return {"Id": cid, "Name": "/" + name, "Image": image_id,
            "Config": {"Image": image_ref, "Labels": extra.get("labels")},
            "State": {"Status": status, "StartedAt": extra.get("started", "0001-01-01T00:00:00Z")},
            "HostConfig": {"NetworkMode": extra.get("network", "default"),
                           "PortBindings": extra.get("bindings", {}),
                           "DeviceRequests": extra.get("devices")},
            "NetworkSettings": {"Ports": extra.get("ports", {})}}


CONTAINERS = [
    container("1" * 64, "sf-dcp2-r0", "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2", IMG_VLLM, "running",
              labels={"sparkfleet.profile": "dcp2", "sparkfleet.rank": "0", "sparkfleet.run": "r1"},
              started="2026-10-18T09:00:01.5Z", network="host",
              devices=[{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}]),
    container("2" * 64, "glm-lane", "zai/glm:5.3", IMG_GLM, "exited", started="2026-10-01T10:00:00Z",
              network="bridge", bindings={"30001/tcp": [{"HostIp": "", "HostPort": "30001"}]},
              ports={"30001/tcp": [{"HostIp": "0.0.0.0", "HostPort": "30001"}, {"HostIp": "::", "HostPort": "30001"}],
                     "8080/tcp": None}),
]
IMAGES = [
    {"Id": IMG_VLLM, "RepoTags": ["aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2"], "RepoDigests": [DIGEST_VLLM]},
    {"Id": IMG_GLM, "RepoTags": [], "RepoDigests": [DIGEST_GLM]},
    {"Id": IMG_OTHER, "RepoTags": ["busybox:1", "busybox:latest"], "RepoDigests": []},
]

DOCKER_OK = f"""
data = {{"containers": {json.dumps(CONTAINERS)!r}, "images": {json.dumps(IMAGES)!r}}}
containers = json.loads(data["containers"]); images = json.loads(data["images"])
a = sys.argv[1:]
if a[:1] == ["ps"]:
    print("\\n".join(c["Id"] for c in containers))
elif a[:1] == ["inspect"]:
    print(json.dumps([c for c in containers if c["Id"] in a[1:]]))
elif a[:1] == ["images"]:
    print("\\n".join(i["Id"] for i in images if i["Id"] != {IMG_GLM!r}))
elif a[:2] == ["image", "inspect"]:
    print(json.dumps([i for i in images if i["Id"] in a[2:]]))
elif a == ["version", "--format", "{{{{.Server.Version}}}}"]:
    print("28.3.3")
else:
    sys.exit(9)
"""

DOCKER_DOWN = f"sys.stderr.write({DAEMON_DOWN!r} + '\\n'); sys.exit(1)"

# with no arguments nvidia-smi prints its banner (the versions part reads it), else the query's CSV
NVIDIA_SMI = """if sys.argv[1:]:
    print("0, NVIDIA GB10, P0, 2405, 3003, 0x0000000000000004, 35.20, [N/A], [N/A]")
else:
    print("| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |")"""
IBDEV2NETDEV = """print("rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)\\nroceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)")"""

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:20DA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 0
   1: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4343 1 0 100 0 0 10 0
   2: 0BC0A8C0:20DA 0DC0A8C0:D431 01 00000000:00000000 00:00000000 00000000     0        0 4545 1 0 100 0 0 10 0
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when
   0: 00000000000000000000000000000000:736F 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0 100 0 0 10 0
"""  # noqa: E501

MOUNTS = """\
/dev/nvme0n1p2 / ext4 rw,relatime 0 0
/dev/nvme1n1 /nvme xfs rw,noatime 0 0
192.168.192.11:/nvme/hf /mnt/models nfs4 ro,vers=4.2,hard,_netdev 0 0
//milo-ark/models /mnt/ark cifs rw,vers=3.1.1 0 0
tmpfs /run tmpfs rw,nosuid 0 0
/dev/sdb1 /mnt/with\\040space ext4 rw 0 0
"""

FE80 = "fe80:0000:0000:0000:4cbb:58ff:fe9d:2d3a"
V4_GID = "0000:0000:0000:0000:0000:ffff:c0a8:c00b"  # ::ffff:192.168.192.11
V6_GID = "2001:0db8:0000:0000:0000:0000:0000:0011"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def build_sandbox(root: Path, *, earlyoom_argv: list[str] | None, defaults: str | None) -> None:
    write(root / "etc/hostname", "reddie\n")
    write(root / "proc/meminfo", f"MemTotal:       {MEM_TOTAL_KB} kB\nMemFree:          812344 kB\n"
          f"MemAvailable:   {MEM_AVAILABLE_KB} kB\nBuffers:            1024 kB\nSwapCached:            0 kB\n"
          "SwapTotal:      16777212 kB\nSwapFree:       16000000 kB\nHugePages_Total:       0\n")
    write(root / "proc/uptime", "93784.52 1480000.10\n")
    write(root / "proc/1/comm", "systemd\n")
    write(root / "proc/1/cmdline", b"/sbin/init\0")
    if earlyoom_argv is not None:
        write(root / "proc/812/comm", "earlyoom\n")
        write(root / "proc/812/cmdline", b"\0".join(a.encode() for a in earlyoom_argv) + b"\0")
    if defaults is not None:
        write(root / "etc/default/earlyoom", defaults)
    # a serving process owning the :8410 socket
    write(root / "proc/900/comm", "vllm\n")
    (root / "proc/900/fd").mkdir(parents=True)
    os.symlink("socket:[4242]", root / "proc/900/fd/7")
    os.symlink("/dev/null", root / "proc/900/fd/0")
    write(root / "proc/net/tcp", TCP)
    write(root / "proc/net/tcp6", TCP6)
    write(root / "etc/mtab", MOUNTS)
    # RDMA: port 1 of the fabric HCA; index 3 is RoCE v2 but IPv6, the IPv4 RoCE v2 entry is 5
    port = root / "sys/class/infiniband/rocep1s0f0/ports/1"
    write(port / "state", "4: ACTIVE\n")
    for i, gid, kind, ndev in ((0, FE80, "IB/RoCE v1", "enp1s0f0np0"), (1, FE80, "RoCE v2", "enp1s0f0np0"),
                               (2, V4_GID, "IB/RoCE v1", "enp1s0f0np0"), (3, V6_GID, "RoCE v2", "enp1s0f0np0"),
                               (4, ZERO_GID, None, None), (5, V4_GID, "RoCE v2", "enp1s0f0np0")):
        write(port / f"gids/{i}", gid + "\n")
        if kind is not None:
            write(port / f"gid_attrs/types/{i}", kind + "\n")
            write(port / f"gid_attrs/ndevs/{i}", ndev + "\n")
    (port / "gid_attrs/types/4").mkdir()  # unreadable (the kernel answers EINVAL for unused entries)
    (port / "gids/6").mkdir()  # an entry that cannot be read at all
    # the second function: down, no ndevs in sysfs, so its netdev comes from ibdev2netdev
    port2 = root / "sys/class/infiniband/roceP2p1s0f0/ports/1"
    write(port2 / "state", "1: DOWN\n")
    write(port2 / "gids/0", FE80 + "\n")
    write(port2 / "gid_attrs/types/0", "IB/RoCE v1\n")
    # storage
    (root / f"mnt/models/models--deepseek-ai--DeepSeek-V4.1-Flash/snapshots/{REVISION}").mkdir(parents=True)
    write(root / "nvme/cache/marker", "x")
    (root / "mnt/ark/snapshot").mkdir(parents=True)


def make_bin(tmp: Path, name: str, *, docker: str | None, nvidia: bool = True) -> Path:
    bin_dir = tmp / name
    bin_dir.mkdir()
    if nvidia:
        script(bin_dir, "nvidia-smi", NVIDIA_SMI)
    if docker is not None:
        script(bin_dir, "docker", docker)
    script(bin_dir, "ibdev2netdev", IBDEV2NETDEV)
    return bin_dir


def run_helper(request: dict, *, root: Path | None, path: str) -> tuple[dict, float]:
    """The helper as a node runs it; with `root`, that directory is the node's whole filesystem."""
    env = dict(os.environ)
    env["PATH"] = path
    argv = [PYTHON3, str(HELPER)]
    if root is not None:
        hostname = (root / "etc/hostname").read_text().strip() if (root / "etc/hostname").is_file() else None
        argv = argv_in_root(root, argv, extra=[Path(d) for d in path.split(":") if d.startswith(str(root.parent))],
                            hostname=hostname)
    start = time.monotonic()
    p = subprocess.run(argv, input=json.dumps(request), capture_output=True, text=True, env=env, timeout=60)
    elapsed = time.monotonic() - start
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("\n") == 1, "one JSON document, one line"
    return json.loads(p.stdout), elapsed


PATHS = [
    "/mnt/models/models--deepseek-ai--DeepSeek-V4.1-Flash",
    f"/nvme/engram-local/{REVISION}",  # missing
    "/nvme/cache/marker",  # a file
    "/mnt/ark/snapshot",
]


@pytest.fixture
def lab(tmp_path: Path) -> dict:
    root = tmp_path / "reddie"
    build_sandbox(root, earlyoom_argv=["/usr/bin/earlyoom", "-r", "3600", "-m", "2"],
                  defaults='# set by the lab\nEARLYOOM_ARGS="-r 3600 -m 5"\n')
    bin_dir = make_bin(tmp_path, "bin", docker=DOCKER_OK)
    data, _ = run_helper({"node": "reddie", "paths": PATHS}, root=root, path=str(bin_dir))
    return {"root": root, "bin": bin_dir, "data": data, "facts": NodeFacts.model_validate(data)}


def test_validates_and_identifies_node(lab: dict) -> None:
    f = lab["facts"]
    assert f.node == "reddie" and f.hostname == "reddie"
    assert f.simulated is False  # the helper never says so; gather sets it from the inventory
    assert f.helper_version == "1"
    assert f.uptime_s == pytest.approx(93784.52)
    assert f.errors == []


def test_meminfo_in_bytes(lab: dict) -> None:
    m = lab["facts"].meminfo
    assert m.mem_total_bytes == 129_741_881_344  # 126,701,056 kB
    assert m.mem_available_bytes == 121_284_722_688
    assert m.swap_total_bytes == 16_777_212 * 1024
    assert m.swap_free_bytes == 16_000_000 * 1024


def test_earlyoom_running_argv_wins_over_defaults(lab: dict) -> None:
    e = lab["facts"].earlyoom
    assert e.running and e.pid == 812
    assert e.argv == ["/usr/bin/earlyoom", "-r", "3600", "-m", "2"]
    assert e.default_args == "-r 3600 -m 5"
    assert e.mem_term_percent == 2.0
    # 2% of 129,741,881,344 bytes = 2,594,837,626.88 -> whole bytes, rounded down
    assert e.sigterm_threshold_bytes == 2_594_837_626


def test_gpu_fields(lab: dict) -> None:
    (g,) = lab["facts"].gpus
    assert (g.index, g.name, g.pstate) == (0, "NVIDIA GB10", "P0")
    assert (g.sm_clock_mhz, g.max_sm_clock_mhz) == (2405, 3003)
    assert g.clock_event_reasons == 4  # 0x0000000000000004, SwPowerCap
    assert g.power_draw_w == 35.2
    assert g.memory_total_mib is None and g.memory_used_mib is None  # [N/A] on unified memory
    assert sorted(calls(lab["bin"], "nvidia-smi")) == [[], [GPU_QUERY, "--format=csv,noheader,nounits"]]


def test_rdma_picks_roce_v2_ipv4_not_index_3(lab: dict) -> None:
    ports = {p.hca: p for p in lab["facts"].rdma}
    assert sorted(ports) == ["roceP2p1s0f0", "rocep1s0f0"]
    p1, p2 = ports["rocep1s0f0"], ports["roceP2p1s0f0"]
    assert (p1.hca, p1.port, p1.state, p1.netdev) == ("rocep1s0f0", 1, "ACTIVE", "enp1s0f0np0")
    assert [g.index for g in p1.gids] == [0, 1, 2, 3, 5]  # all-zero 4 and unreadable 6 skipped
    by_index = {g.index: g for g in p1.gids}
    assert by_index[2].ipv4 == "192.168.192.11" and by_index[2].type == "IB/RoCE v1"
    assert by_index[3].type == "RoCE v2" and by_index[3].ipv4 is None
    assert p1.roce_v2_ipv4_index == 5
    assert by_index[5].netdev == "enp1s0f0np0" and by_index[5].gid == V4_GID
    assert (p2.hca, p2.state, p2.netdev) == ("roceP2p1s0f0", "DOWN", "enP2p1s0f0np0")  # from ibdev2netdev
    assert p2.roce_v2_ipv4_index is None


def test_docker_containers_and_images(lab: dict) -> None:
    d = lab["facts"].docker
    assert d.available and d.error is None
    r0, glm = d.containers
    assert r0.id == "1" * 64 and r0.name == "sf-dcp2-r0"
    assert r0.image == "aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2" and r0.image_id == IMG_VLLM
    assert r0.image_digests == [DIGEST_VLLM]
    assert r0.labels == {"sparkfleet.profile": "dcp2", "sparkfleet.rank": "0", "sparkfleet.run": "r1"}
    assert (r0.state, r0.started_at, r0.network_mode, r0.gpus, r0.host_ports) == (
        "running", "2026-10-18T09:00:01.5Z", "host", True, [])
    assert glm.name == "glm-lane" and glm.labels == {} and glm.gpus is False
    assert glm.host_ports == [30001] and glm.network_mode == "bridge" and glm.state == "exited"
    assert glm.image_digests == [DIGEST_GLM]  # resolved although the image is not in `docker images`
    assert [(i.ref, i.id, i.digests) for i in d.images] == [
        ("aidendle94/sparkrun-vllm-dsv41-gb10:production-1.2", IMG_VLLM, [DIGEST_VLLM]),
        ("busybox:1", IMG_OTHER, []), ("busybox:latest", IMG_OTHER, []),
    ]
    argv = calls(lab["bin"], "docker")
    assert argv[0] == ["ps", "-aq", "--no-trunc"]
    assert argv[1] == ["inspect", "1" * 64, "2" * 64]
    assert argv[2] == ["images", "-q", "--no-trunc"]
    assert argv[3] == ["image", "inspect", IMG_VLLM, IMG_OTHER, IMG_GLM]


def test_listening_ports_with_owner(lab: dict) -> None:
    got = [(x.port, x.address, x.pid, x.process) for x in lab["facts"].listening]
    assert got == [(8001, "127.0.0.1", None, None), (8410, "0.0.0.0", 900, "vllm"), (29551, "::", None, None)]


def test_paths_mounts_and_space(lab: dict) -> None:
    f = lab["facts"]
    assert list(f.paths) == PATHS
    model = f.paths[PATHS[0]]
    assert model.exists and model.is_dir
    assert (model.mount.fstype, model.mount.source, model.mount.target) == ("nfs4", "192.168.192.11:/nvme/hf",
                                                                            "/mnt/models")
    missing = f.paths[PATHS[1]]
    assert not missing.exists and not missing.is_dir
    assert missing.mount.target == "/nvme" and missing.mount.fstype == "xfs"
    st = os.statvfs(lab["root"])  # the sandbox's filesystem answers for every path inside it
    assert missing.total_bytes == st.f_blocks * st.f_frsize and missing.free_bytes > 0
    marker = f.paths[PATHS[2]]
    assert marker.exists and not marker.is_dir and marker.mount.target == "/nvme"
    ark = f.paths[PATHS[3]]
    assert ark.mount.fstype == "cifs" and ark.mount.source == "//milo-ark/models"
    # network mounts always, plus the mounts the asked paths live on; tmpfs and / are left out
    assert [(m.target, m.fstype) for m in f.mounts] == [("/mnt/models", "nfs4"), ("/mnt/ark", "cifs"),
                                                         ("/nvme", "xfs")]


def test_broken_docker_reports_rest(tmp_path: Path) -> None:
    root = tmp_path / "asusi"
    build_sandbox(root, earlyoom_argv=None, defaults='EARLYOOM_ARGS="-r 3600 -m 5"\n')
    bin_dir = make_bin(tmp_path, "bin", docker=DOCKER_DOWN)
    data, _ = run_helper({"node": "asusi", "paths": ["/nvme", "/mnt/with space/x"]}, root=root, path=str(bin_dir))
    f = NodeFacts.model_validate(data)
    assert f.docker.available is False and f.docker.error == DAEMON_DOWN
    assert f.errors == [f"docker: {DAEMON_DOWN}"]
    assert calls(bin_dir, "docker") == [["ps", "-aq", "--no-trunc"]]  # nothing else tried
    # the rest still reports; earlyoom is not running, so the defaults file gives the percent
    assert f.meminfo.mem_total_bytes == MEM_TOTAL_KB * 1024 and len(f.gpus) == 1 and f.rdma
    assert f.earlyoom.running is False and f.earlyoom.mem_term_percent == 5.0
    assert f.earlyoom.sigterm_threshold_bytes == MEM_TOTAL_KB * 1024 * 5 // 100
    assert f.paths["/nvme"].exists and f.paths["/nvme"].mount.fstype == "xfs"
    assert f.paths["/mnt/with space/x"].mount.target == "/mnt/with space"  # \040 in /proc/mounts


def test_missing_tools_and_files(tmp_path: Path) -> None:
    root = tmp_path / "bare"
    write(root / "proc/meminfo", "MemTotal: 1000 kB\n")  # no MemAvailable line
    bin_dir = tmp_path / "empty-bin"
    bin_dir.mkdir()
    data, _ = run_helper({"node": "bare", "paths": ["/models"]}, root=root, path=str(bin_dir))
    f = NodeFacts.model_validate(data)
    assert f.meminfo is None and f.gpus == [] and f.rdma == [] and f.listening == []
    assert f.docker.available is False and f.docker.error == "not found"
    assert "meminfo: no MemAvailable line" in f.errors
    assert "nvidia-smi: not found" in f.errors and "docker: not found" in f.errors
    assert any(e.startswith("uptime:") for e in f.errors) and any(e.startswith("mounts:") for e in f.errors)
    assert f.earlyoom.running is False and f.earlyoom.mem_term_percent == 10.0  # earlyoom's built-in default
    assert f.earlyoom.sigterm_threshold_bytes is None  # no MemTotal we trust
    assert f.paths["/models"].exists is False and f.paths["/models"].mount is None


def test_nvidia_smi_failure_is_an_error_line(tmp_path: Path) -> None:
    root = tmp_path / "n"
    build_sandbox(root, earlyoom_argv=None, defaults=None)
    bin_dir = make_bin(tmp_path, "bin", docker=DOCKER_OK, nvidia=False)
    script(bin_dir, "nvidia-smi", "print('NVIDIA-SMI has failed because it couldn\\'t communicate with the "
           "NVIDIA driver.'); sys.exit(9)")
    data, _ = run_helper({"node": "n"}, root=root, path=str(bin_dir))
    f = NodeFacts.model_validate(data)
    assert f.gpus == []
    assert f.errors == ["nvidia-smi: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."]
    assert f.earlyoom.mem_term_percent == 10.0 and f.earlyoom.default_args is None


def _load_helper_module():
    spec = importlib.util.spec_from_file_location("sparkfleet_nodeside_facts", HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("argv", "expected"), [
    (["-m", "2"], (2.0, None)),
    (["-m2"], (2.0, None)),
    (["-m", "3,1", "-s", "100"], (3.0, None)),
    (["-r", "3600", "-m", "2.5"], (2.5, None)),
    (["-dm", "4"], (4.0, None)),  # clustered short options, as getopt reads them
    (["--prefer", "-m 9", "-m", "2"], (2.0, None)),  # --prefer's value is not an option
    (["-m", "5", "-m", "2"], (2.0, None)),  # the last one given wins
    (["-M", "2097152,1048576"], (None, 2097152.0)),
    (["-r", "60", "-n"], (None, None)),
])
def test_earlyoom_option_forms(argv: list[str], expected: tuple) -> None:
    assert _load_helper_module().earlyoom_limits(argv) == expected


def test_earlyoom_size_limit_lower_than_percent(tmp_path: Path) -> None:
    root = tmp_path / "m"
    # -M 2 GiB (in KiB) is below 10% of 121 GiB, so it is the SIGTERM limit
    build_sandbox(root, earlyoom_argv=["/usr/bin/earlyoom", "-m", "10", "-M", "2097152"], defaults=None)
    data, _ = run_helper({"node": "m"}, root=root, path=str(make_bin(tmp_path, "bin", docker=DOCKER_OK)))
    e = NodeFacts.model_validate(data).earlyoom
    assert e.sigterm_threshold_bytes == 2 * 2**30
    assert e.mem_term_percent == pytest.approx(100 * 2097152 / MEM_TOTAL_KB)


def test_bad_request_exits_2() -> None:
    p = subprocess.run([PYTHON3, str(HELPER)], input="{not json", capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stdout == "" and "not JSON" in p.stderr


def test_real_machine_without_sim_root() -> None:
    """This machine as a node: valid facts, not simulated; on a box without a GPU, nvidia-smi is an error."""
    data, elapsed = run_helper({"node": "here", "paths": ["/", "/nonexistent/sparkfleet/x"]}, root=None,
                               path=os.environ.get("PATH", os.defpath))
    f = NodeFacts.model_validate(data)
    assert f.simulated is False and f.node == "here"
    with open("/proc/meminfo") as fh:
        total_kb = int(next(line for line in fh if line.startswith("MemTotal:")).split()[1])
    assert f.meminfo.mem_total_bytes == total_kb * 1024
    if shutil.which("nvidia-smi") is None:
        assert "nvidia-smi: not found" in f.errors and f.gpus == []
    else:
        assert f.gpus or any(e.startswith("nvidia-smi:") for e in f.errors)
    assert f.paths["/"].exists and f.paths["/"].mount is not None and f.paths["/"].total_bytes > 0
    missing = f.paths["/nonexistent/sparkfleet/x"]
    assert not missing.exists and missing.free_bytes is not None  # measured on / instead
    assert elapsed < 5.0, f"the helper took {elapsed:.2f}s"


def test_a_part_that_breaks_is_an_error_line(tmp_path: Path) -> None:
    root = tmp_path / "odd"
    build_sandbox(root, earlyoom_argv=None, defaults=None)
    # a docker whose inspect output has an unexpected shape (State as a string)
    odd = ("a = sys.argv[1:]\nif a[:1] == ['ps']: print('f' * 64)\n"
           "elif a[:1] == ['inspect']: print(json.dumps([{'Id': 'f' * 64, 'State': 'running'}]))\n"
           "else: print('[]' if a[:1] == ['image'] else '')")
    data, _ = run_helper({"node": "odd", "paths": ["/nvme"]}, root=root,
                         path=str(make_bin(tmp_path, "bin", docker=odd)))
    f = NodeFacts.model_validate(data)
    assert f.docker is None
    assert [e for e in f.errors if e.startswith("docker:")] == [
        "docker: helper failed: AttributeError: 'str' object has no attribute 'get'"]
    assert f.meminfo is not None and f.gpus and f.paths["/nvme"].exists  # the rest still reports
