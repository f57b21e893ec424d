"""Building one node's sandbox from the inventory and the shipped profiles (docs/sim-layout.md).

The controller writes the node's state files (state/node.json: what the node *is*; gpu.json, docker.json,
faults.json: what it is doing), creates the storage directories the lanes use, copies the shims into
bin/, and lets `shim.render` derive proc/, sys/ and etc/ from the state. Faults later change only
state and re-render, which is why healing restores the healthy files byte for byte.
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
import posixpath
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import sparkfleet
from sparkfleet.engines.registry import engine_for
from sparkfleet.engram.safetensors import make_checkpoint
from sparkfleet.opsdir import Spec
from sparkfleet.schema.errors import SpecError
from sparkfleet.schema.inventory import Inventory, Node
from sparkfleet.schema.profile import Profile
from sparkfleet.sim import image, llama, shim, tfbuild, values, vllmlab
from sparkfleet.sim.node import home_dir, python_roots
from sparkfleet.sim.paths import inside

SHIM_NAMES = ("nvidia-smi", "docker", "ibdev2netdev", "sim-gpu-load", "ip", "sysctl", "earlyoom", "sim-node-init",
              "sim-fault", "sim-nvidia-runtime", "nvidia-container-runtime-hook")
DAEMON_TOOLS = ("sim-nvidia-runtime", "nvidia-container-runtime-hook")  # only beside a real dockerd
KIB_PER_GIB = 1024 * 1024


@dataclass
class Lanes:
    """What the shipped profiles need on the nodes: repo dirs, other paths, images (by node)."""
    profiles: list[Profile] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # profiles that did not load (named in `sim up`'s output)


_LANES_CACHE: dict[tuple, Lanes] = {}


def load_lanes(spec: Spec) -> Lanes:
    """Every shipped profile, merged; cached while no profile file changes (parsing them is most of `sim up`)."""
    files = sorted((spec.root / "profiles").glob("*.yaml"))
    key = (str(spec.root), tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files))
    if key not in _LANES_CACHE:
        _LANES_CACHE.clear()
        _LANES_CACHE[key] = _load_lanes(spec)
    return _LANES_CACHE[key]


def _load_lanes(spec: Spec) -> Lanes:
    lanes = Lanes()
    for name in spec.profile_names():
        try:
            lanes.profiles.append(spec.profile(name).profile)
        except SpecError as exc:
            lanes.skipped.append(f"{name}: {exc}")
    return lanes


def profiles_for(inv: Inventory, node: Node, lanes: Lanes) -> list[Profile]:
    """The lanes that would run on this node: their group (or explicit ranks) includes it."""
    out = []
    for p in lanes.profiles:
        members = set(p.ranks or []) | set(inv.groups.get(p.group or "", []))
        if node.name in members:
            out.append(p)
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _netdev(node: Node, i: int, hca: str) -> str:
    """HCA i's netdev: the fabric interface, the rail-2 interface, else the mlx5 naming (rocepXsYfZ -> enpXsYfZnp0)."""
    assert node.rdma is not None
    if i == 0:
        return node.rdma.fabric_iface
    if i == 1 and node.rdma.rail2_iface:
        return node.rdma.rail2_iface
    return "en" + hca.removeprefix("roce") + "np0"


def _link_local(mac: str) -> str:
    """fe80:: address from the MAC by modified EUI-64, as the kernel derives it."""
    b = bytearray(int(x, 16) for x in mac.split(":"))
    b[0] ^= 0x02
    eui = bytes(b[:3]) + b"\xff\xfe" + bytes(b[3:])
    return str(ipaddress.IPv6Address(b"\xfe\x80" + b"\x00" * 6 + eui))


def node_state(inv: Inventory, node: Node, ordinal: int) -> dict:
    """state/node.json: the static facts the shims render from."""
    hw = inv.hardware(node)
    sim = values.HARDWARE[node.hardware]
    total_gib = hw.host_memory_gib or hw.gpu_memory_gib
    assert total_gib is not None, f"hardware class {node.hardware} has no memory size"
    total_kb = round(total_gib * KIB_PER_GIB)
    earlyoom_args = (["-m", _num(hw.earlyoom_percent)] + sim["earlyoom_args_default"]
                     if hw.earlyoom_percent is not None else list(sim["earlyoom_args_default"]))
    st = node.storage
    mounts = [list(m) for m in values.BASE_MOUNTS]
    if st.model_local and node.hardware in values.LOCAL_MODEL_MOUNT:
        dev, fstype, opts = values.LOCAL_MODEL_MOUNT[node.hardware]
        mounts.append([dev, st.model_root, fstype, opts])
    if st.nfs_mount:
        server = st.nfs_mount.source.split(":", 1)[0]
        mode = "ro" if "ro" in st.nfs_mount.options.split(",") else "rw"
        opts = f"{mode},relatime," + values.NFS4_OPTIONS.format(client=node.fabric_ip or "0.0.0.0", server=server)
        mounts.append([st.nfs_mount.source, st.nfs_mount.path, "nfs4", opts])
    rdma = []
    if node.rdma:
        last = node.fabric_ip.split(".")[-1] if node.fabric_ip else str(ordinal)
        for i, hca in enumerate(node.rdma.hcas):
            mac = f"{values.MAC_PREFIX}:{ordinal:02x}:{i:02x}:00"
            ipv4 = node.fabric_ip if i == 0 else None
            rdma.append({"hca": hca, "port": 1, "netdev": _netdev(node, i, hca), "mac": mac,
                         "link_local": _link_local(mac), "ipv4": ipv4,
                         "ipv6_global": f"{values.IPV6_GLOBAL_PREFIX}::{last}" if ipv4 else None,
                         "state": "4: ACTIVE", "rate": values.PORT_RATE})
    uptime = sim["uptime_s"]
    return {
        "simulated": True,
        "node": node.name,
        "hostname": node.name,
        "hardware": node.hardware,
        "meminfo": {"total_kb": total_kb, "available_kb": total_kb - round(sim["used_gib"] * KIB_PER_GIB),
                    "swap_kb": round(sim["swap_gib"] * KIB_PER_GIB),
                    "cached_kb": round(values.MEM_CACHED_GIB * KIB_PER_GIB),
                    "buffers_kb": values.MEM_BUFFERS_MIB * 1024},
        "uptime": shim.uptime_state(uptime, sim["cpus"] * values.IDLE_FRACTION),
        "mounts": mounts,
        "storage": st.model_dump(mode="json"),
        "cifs": {"source": values.CIFS_SOURCE, "options": values.CIFS_OPTIONS},
        "earlyoom": {"default_args": " ".join(earlyoom_args)},
        "rdma": rdma,
        "sim": {"gid_table_size": values.GID_TABLE_SIZE, "container_pid_base": values.CONTAINER_PID_BASE,
                "container_comm": values.CONTAINER_COMM, "stop_exit_code": values.STOP_EXIT_CODE,
                "kill_exit_code": values.KILL_EXIT_CODE, "docker_version": values.DOCKER_SERVER_VERSION},
    }


def _uuid(text: str) -> str:
    h = hashlib.sha256(text.encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_state(node: Node) -> dict:
    sim = values.HARDWARE[node.hardware]
    return {
        "driver": sim["driver"], "cuda": sim["cuda"],
        "busy_until": 0,  # set by sim-gpu-load: until then nvidia-smi reads load clocks
        "step_ms": values.STEP_MS, "slow_after_idle_ms": values.SLOW_AFTER_IDLE_MS,
        "gpus": [{
            "index": 0, "name": sim["gpu_name"], "uuid": _uuid(f"sparkfleet-sim gpu {node.name}"), "pstate": "P0",
            "idle_sm_mhz": sim["idle_sm_mhz"], "load_sm_mhz": sim["load_sm_mhz"], "max_sm_mhz": sim["max_sm_mhz"],
            "idle_power_w": sim["idle_power_w"], "load_power_w": sim["load_power_w"],
            "memory_total_mib": sim["memory_total_mib"], "memory_used_mib": sim["memory_used_mib"],
        }],
    }


def image_id(ref: str) -> str:
    return "sha256:" + hashlib.sha256(f"sparkfleet-sim image {ref}".encode()).hexdigest()


def repository(ref: str) -> str:
    """`repo:tag` -> `repo` (a registry port's colon is not a tag)."""
    head, _, last = ref.rpartition("/")
    return (head + "/" if head else "") + last.split(":", 1)[0]


def image_record(ref: str, digests: list[str], engine_version: str | None = None) -> dict:
    """One image as `docker image inspect` shows it; a pinned profile digest is the image's RepoDigest. The
    vLLM version a profile declares for it is its label (shim.engine.ENGINE_VERSION_LABEL)."""
    if not digests:
        digests = ["sha256:" + hashlib.sha256(f"sparkfleet-sim digest {ref}".encode()).hexdigest()]
    labels = {shim.engine.ENGINE_VERSION_LABEL: engine_version} if engine_version else None
    return {"Id": image_id(ref), "RepoTags": [ref], "RepoDigests": [f"{repository(ref)}@{d}" for d in digests],
            "Created": values.IMAGE_CREATED, "Size": values.IMAGE_SIZE, "Architecture": "arm64", "Os": "linux",
            "Config": {"Labels": labels}}


def docker_state(profiles: list[Profile]) -> dict:
    images: dict[str, list[str]] = {}
    versions: dict[str, str] = {}  # ref -> the vLLM version the first profile naming it declares
    for p in profiles:
        if p.image:
            digests = images.setdefault(p.image.ref, [])
            if p.image.digest and p.image.digest not in digests:
                digests.append(p.image.digest)
            if p.image.engine_version:
                versions.setdefault(p.image.ref, p.image.engine_version)
    return {"daemon": "up", "next_seq": 1, "containers": [],
            "images": [image_record(r, d, versions.get(r)) for r, d in images.items()]}


def image_specs(inv: Inventory, node: Node, lanes: Lanes) -> dict[str, dict]:
    """Every image a profile on the node names -> {"entrypoint", "engine_version"}: a vLLM image with
    vLLM's entrypoint, each with the engine version its first profile declares."""
    refs: dict[str, dict] = {}
    for p in profiles_for(inv, node, lanes):
        if p.image:
            entrypoint = engine_for(p.engine).image_entrypoint  # the adapter says what its image runs
            got = refs.setdefault(p.image.ref, {"entrypoint": list(entrypoint) if entrypoint else None})
            got.setdefault("engine_version", p.image.engine_version)
    return refs


def images_archive(refs: dict[str, dict]) -> bytes:
    """The `docker load` archive of image refs -> {"entrypoint", "engine_version"} (sim/image.py archive),
    their tools run by this Python and this sparkfleet. An image is the same bytes, and id, on every node
    that has it."""
    data, _ids = image.archive(refs, sys.executable, str(Path(sparkfleet.__file__).resolve().parent.parent))
    return data


def storage_paths(node: Node, profiles: list[Profile]) -> tuple[list[str], list[str]]:
    """(directories, files) the node holds: the lanes' repo dirs and snapshots, Engram/cache/patch roots,
    TensorFold's recipe and weights dirs, and every bind-mount source the lanes name."""
    st = node.storage
    dirs = [st.model_root, st.cache_dir, st.patch_root] + ([st.engram_local_dir] if st.engram_local_dir else [])
    files: list[str] = []
    for p in profiles:
        if p.model:
            repo = posixpath.join(st.model_root, p.model.repo_dir)
            snapshot = p.model.snapshot or p.model.revision
            dirs.append(posixpath.join(repo, "snapshots", snapshot) if snapshot else repo)
        if p.tensorfold:
            dirs += [p.tensorfold.recipe_dir, p.tensorfold.model_dir]
        for m in p.mounts:
            # a source with a file extension is a file (sitecustomize.py), anything else a directory
            (files if posixpath.splitext(m.source)[1] else dirs).append(m.source)
    return sorted(set(dirs)), sorted(set(files) - set(dirs))


def checkpoint_dir(node: Node, p: Profile) -> str | None:
    """The lane's checkpoint dir on this node (<model_root>/<repo_dir>/snapshots/<snapshot or revision>), where
    the node holds the sim's stand-in checkpoint; None for a lane that reads no Engram rows from a vLLM checkpoint
    (TensorFold's Engram shards come from another checkpoint, ENG-29)."""
    if p.model is None or p.engram is None or p.engram.mode != "disk" or p.tensorfold is not None:
        return None
    repo = posixpath.join(node.storage.model_root, p.model.repo_dir)
    snapshot = p.model.snapshot or p.model.revision
    return posixpath.join(repo, "snapshots", snapshot) if snapshot else repo


def place_checkpoints(root: Path, node: Node, profiles: list[Profile], made: dict[tuple[str, str], Path]) -> None:
    """The stand-in checkpoint (values.ENGRAM_STANDIN_ROWS) in each lane's checkpoint dir on the node. `made`
    (checkpoint dir under the model root, format) -> a dir already written on another node of this lab: its files
    are hard-linked, as a worker's NFS mount shows the head's files (one checkpoint, many nodes)."""
    for p in profiles:
        d = checkpoint_dir(node, p)
        if d is None or p.engram is None:
            continue
        target = inside(root, d)
        if any(target.glob("*.safetensors")):
            continue  # two lanes of one checkpoint: the first lane's format is what the checkpoint holds
        key = (posixpath.relpath(d, node.storage.model_root), p.engram.format)
        if key in made and made[key].is_dir():
            target.mkdir(parents=True, exist_ok=True)
            for f in made[key].iterdir():
                (target / f.name).hardlink_to(f)
            continue
        make_checkpoint(target, rows=values.ENGRAM_STANDIN_ROWS, width=values.ENGRAM_STANDIN_WIDTH,
                        layers=values.ENGRAM_LAYERS, fmt=p.engram.format,
                        seed=int(hashlib.sha256(key[0].encode()).hexdigest()[:8], 16))
        made[key] = target


def engine_state() -> dict:
    """state/engine.json: how the docker shim starts the sim engine for a lane, and the sim's own inputs
    (values.py) it derives the engine's observables from. Nothing here comes from a profile: the engine
    decides KV, MoE, Engram and hook lines from what each launch carries and the node it runs on."""
    return {"python": sys.executable, "package_root": str(Path(sparkfleet.__file__).resolve().parent.parent),
            "python_roots": python_roots(),
            "vllm_build": vllmlab.engine_state(),
            "boot_seconds": values.ENGINE_BOOT_S, "engram_table_rows": values.ENGRAM_TABLE_ROWS,
            "engram_layers": list(values.ENGRAM_LAYERS), "engram_tensor": values.ENGRAM_TENSOR,
            "stop_wait_s": values.ENGINE_STOP_WAIT_S,
            "moe_kernels": dict(values.MOE_KERNELS), "kv_bytes_per_token": list(values.KV_BYTES_PER_TOKEN),
            "kv_reserved_bytes": list(values.KV_RESERVED_BYTES), "gmu_other_bytes": list(values.GMU_OTHER_BYTES),
            "default_gmu": list(values.VLLM_DEFAULT_GMU), "model_gib": list(values.ENGINE_MODEL_GIB),
            "moe_layers": values.MOE_LAYERS, "pin_hook_env": values.PIN_HOOK_ENV,
            "pin_hook_site": values.PIN_HOOK_SITE,
            "autotune": {"gpus": list(values.AUTOTUNE_GPUS), "cache": values.AUTOTUNE_CACHE,
                         "subdir": values.AUTOTUNE_SUBDIR, "hash_flags": list(values.AUTOTUNE_HASH_FLAGS),
                         "configs": values.AUTOTUNE_CONFIGS, "tune_s": values.AUTOTUNE_TUNE_S,
                         "read_s": values.AUTOTUNE_READ_S}}


SHIM_MODULE = "sparkfleet_sim_shim"  # the shim package's name in the node's bin/ zip, imported by each tool's stub
SHIM_ZIP = f"{SHIM_MODULE}.zip"
SHIM_PYTHON = "/usr/bin/python3"  # the node's system Python (the stubs' interpreter)
# Each tool is a three-line stub that imports the shim package from one zip beside it, every module precompiled
# once per lab for the node's Python: a script run directly is compiled on every call (about 35 ms for the
# shim's source here), a module's bytecode is not; zipimport reads a module's .pyc before its .py.
SHIM_STUB = (f"#!{SHIM_PYTHON}\n# sparkfleet simulation: this tool is a stand-in (sparkfleet/sim/shim/)\n"
             f"import sys\nsys.path.insert(0, sys.path[0] + '/{SHIM_ZIP}')\nfrom {SHIM_MODULE} import main\n"
             "sys.exit(main())\n")
_ZIP_CACHE: dict[bytes, bytes] = {}


def shim_sources() -> dict[str, bytes]:
    """The shim package's modules, by file name."""
    pkg = Path(shim.__file__).parent
    return {p.name: p.read_bytes() for p in sorted(pkg.glob("*.py"))}


def shim_zip() -> bytes:
    """The shim package as one zip for the nodes: each module's source and, beside it, its bytecode for the
    node's Python (unchecked-hash pycs: valid wherever the zip goes); sources only when that Python cannot
    compile them (the stubs then compile on import, only slower). Built once per source."""
    sources = shim_sources()
    key = b"".join(name.encode() + b"\0" + data for name, data in sources.items())
    if key not in _ZIP_CACHE:
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in sources.items():
                (Path(tmp) / name).write_bytes(data)
            # one process compiles every module (legacy .pyc next to .py: where zipimport looks)
            compile_all = ("import glob, py_compile, sys\nfor f in glob.glob(sys.argv[1] + '/*.py'):\n"
                           "    py_compile.compile(f, cfile=f + 'c', doraise=True,"
                           " invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)")
            r = subprocess.run([SHIM_PYTHON, "-S", "-c", compile_all, tmp], capture_output=True, text=True)
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
                for name in sources:
                    z.write(Path(tmp) / name, f"{SHIM_MODULE}/{name}")
                    if r.returncode == 0:
                        z.write(Path(tmp) / (name + "c"), f"{SHIM_MODULE}/{name}c")
            _ZIP_CACHE[key] = buf.getvalue()
    return _ZIP_CACHE[key]


def install_shims(bin_dir: Path, *, netns: bool = False, dockerd: bool = False) -> None:
    """The shims, under each tool's name: stubs importing the shim package from its zip (SHIM_ZIP). A node
    with its own network namespace has real links: it gets the real `ip` (no shim); a node with its own
    dockerd gets the real `docker` CLI, and the sim's runtime and hook beside the daemon."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / SHIM_ZIP).write_bytes(shim_zip())
    for name in SHIM_NAMES:
        if (netns and name == "ip") or (dockerd and name == "docker") or (not dockerd and name in DAEMON_TOOLS):
            continue
        target = bin_dir / name
        target.write_text(SHIM_STUB)
        target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def build_node(node_dir: Path, inv: Inventory, node: Node, ordinal: int, lanes: Lanes, *,
               netns: bool = False, checkpoints: dict[tuple[str, str], Path] | None = None,
               dockerd: str | None = None, registry: str | None = None) -> None:
    """Create the node's directory (it must not exist yet): fs/ with the node's paths and state, bin/ with shims.
    `checkpoints`: the lab's stand-in checkpoints already written (place_checkpoints), shared across its nodes.
    `registry`: host:port of the lab's registry, the node's dockerd's Docker Hub mirror (sim/registry.py)."""
    profiles = profiles_for(inv, node, lanes)
    root = node_dir / "fs"
    root.mkdir(parents=True)
    for sub in (home_dir().lstrip("/"), "tmp", "run/sshd", "sys", f"{shim.STATE}/logs", f"{shim.STATE}/stash"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / shim.STATE / ".lock").touch()
    state = node_state(inv, node, ordinal)
    state["netns"] = netns
    if dockerd:  # the node runs a real dockerd; its containers' cgroups go under this parent (sim down removes it)
        state["dockerd"] = {"cgroup_parent": dockerd, **({"registry": registry} if registry else {})}
        (root / "var").mkdir(exist_ok=True)
        (root / "var" / "run").symlink_to("../run")  # as on Debian: the CLI's default socket is /var/run's
        (root / "sys" / "fs" / "cgroup").mkdir(parents=True, exist_ok=True)  # the mount point of the cgroups
    shim.save(root, "node.json", state)
    shim.save(root, "gpu.json", gpu_state(node))
    shim.save(root, "docker.json", docker_state(profiles))
    shim.save(root, "faults.json", {"faults": {}})
    shim.save(root, "engine.json", engine_state())
    dirs, files = storage_paths(node, profiles)
    for d in dirs:
        inside(root, d).mkdir(parents=True, exist_ok=True)
    for f in files:
        path = inside(root, f)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# sparkfleet simulation: placeholder for a file a lane bind-mounts\n")
    for p in profiles:
        if p.model and p.model.revision:
            refs = inside(root, posixpath.join(node.storage.model_root, p.model.repo_dir, "refs", "main"))
            refs.parent.mkdir(parents=True, exist_ok=True)
            refs.write_text(p.model.revision)
    place_checkpoints(root, node, profiles, {} if checkpoints is None else checkpoints)
    for p in profiles:
        if p.tensorfold and p.tensorfold.recipe_dir:  # the recipe's serve script, as a real container runs it
            serve = inside(root, posixpath.join(p.tensorfold.recipe_dir, "scripts", "serve.sh"))
            serve.parent.mkdir(parents=True, exist_ok=True)
            serve.write_text(image.TENSORFOLD_SERVE_SCRIPT)
    llama.place_weights(root, node, profiles)  # the real GGUF where a llama.cpp lane names it (sim/llama.py)
    vllmlab.place_model(root, node, profiles)  # vLLM's real checkpoint where a vLLM lane names it (sim/vllmlab.py)
    install_shims(node_dir / "bin", netns=netns, dockerd=bool(dockerd))
    tfbuild.place(root, node, profiles, node_dir / "bin", home_dir())  # TensorFold's build stand-ins (sim/tfbuild.py)
    shim.render(root)


def remove_tree(path: Path) -> None:
    """rm -rf, quiet when the path is already gone."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
