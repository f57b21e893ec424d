"""vLLM: one `docker run` per rank; several nodes use mp with workers headless, one node is plain."""

from __future__ import annotations

import copy

from sparkfleet.engines.base import LaneContext, Launch, env_from_argv, groups, render_launch
from sparkfleet.engines.docker import docker_context
from sparkfleet.spec.profile import Profile

# Set from structured profile fields or per node; a profile that puts them in flags/env is refused.
RESERVED_FLAGS = ("--served-model-name", "--host", "--port", "--tensor-parallel-size",
                  "--decode-context-parallel-size", "--nnodes", "--node-rank", "--master-addr",
                  "--master-port", "--headless", "--distributed-executor-backend", "--model")
RESERVED_ENV = ("VLLM_HOST_IP", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "B12X_ROCE_HCA",
                "B12X_ROCE_GID_INDEX", "DSV41_ENGRAM_DIR")


class Vllm:
    name = "vllm"

    def template(self, ctx: LaneContext) -> str:
        return "vllm-multinode.sh.j2" if len(ctx.ranks) > 1 else "vllm-single.sh.j2"

    def launches(self, ctx: LaneContext) -> list[Launch]:
        """Workers first (together, wave 1), then the head (wave 2)."""
        out = []
        template = self.template(ctx)
        for r in ctx.ranks:
            context = docker_context(ctx, r)
            context["args"] = groups(effective_flags(ctx.profile, {x.node.hardware for x in ctx.ranks}))
            context["roce"] = ctx.profile.env.get("VLLM_ENABLE_ROCE_ALLREDUCE") == "1"
            script, argv = render_launch(ctx, template, context)
            wave = 2 if (r.rank == 0 and len(ctx.ranks) > 1) else 1
            out.append(Launch(r.node.name, r.rank, r.role, wave, context["container_name"], argv,
                              env_from_argv(argv, context["image"]), script))
        return sorted(out, key=lambda launch: (launch.wave, launch.rank))


def effective_flags(p: Profile, hardware: set[str]) -> dict:
    """The profile's flags, with GB10 capture sizes generated from the rule when none are listed."""
    from sparkfleet.spec.rules import capture_sizes, required_capture_sizes, speculative

    spec = speculative(p)
    k = spec.get("num_speculative_tokens") if spec else None
    mns = p.flags.get("--max-num-seqs")
    sizes, _ = capture_sizes(p)
    if ("gb10" not in hardware or sizes is not None or not isinstance(k, int) or not isinstance(mns, int)
            or "num_speculative_tokens_per_batch_size" in spec):
        return p.flags
    flags = copy.deepcopy(p.flags)
    cc = flags.get("--compilation-config")
    cc = dict(cc) if isinstance(cc, dict) else {}
    cc["cudagraph_capture_sizes"] = required_capture_sizes(k, mns)
    flags["--compilation-config"] = cc
    return flags
