"""SGLang: one `docker run` per rank with `sglang.launch_server`; several nodes join by dist-init-addr."""

from __future__ import annotations

from sparkfleet.engines.base import LaneContext, Launch, env_from_argv, render_launch
from sparkfleet.engines.docker import docker_context

RESERVED_FLAGS = ("--model-path", "--tp", "--nnodes", "--node-rank", "--dist-init-addr", "--host",
                  "--port", "--served-model-name")


class SGLang:
    name = "sglang"

    def launches(self, ctx: LaneContext) -> list[Launch]:
        out = []
        for r in ctx.ranks:
            context = docker_context(ctx, r)
            script, argv = render_launch(ctx, "sglang.sh.j2", context)
            wave = 2 if (r.rank == 0 and len(ctx.ranks) > 1) else 1
            out.append(Launch(r.node.name, r.rank, r.role, wave, context["container_name"], argv,
                              env_from_argv(argv, context["image"]), script))
        return sorted(out, key=lambda launch: (launch.wave, launch.rank))
