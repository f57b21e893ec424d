"""SGLang: one `docker run` per rank with `sglang.launch_server`; several nodes join by dist-init-addr."""

from __future__ import annotations

from sparkfleet.engines.base import Engine, LaneContext, Launch, render_command
from sparkfleet.engines.base import reserved as reserved_rule
from sparkfleet.engines.container import Bind
from sparkfleet.engines.docker import container_spec, lane_binds, model_host_dir, need, template_context
from sparkfleet.engines.vllm import eager, head_ports, jit_guard

RESERVED_FLAGS = ("--model-path", "--tp", "--nnodes", "--node-rank", "--dist-init-addr", "--host",
                  "--port", "--served-model-name")
RESERVED_ENV = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME")


class SGLang(Engine):
    name = "sglang"
    gid_env = ("NCCL_IB_GID_INDEX",)
    chat_template_flag = "--chat-template"  # sglang/srt/server_args.py
    reserved_flags = RESERVED_FLAGS
    reserved_env = RESERVED_ENV
    lane_rules = (eager, jit_guard, reserved_rule)

    def launches(self, ctx: LaneContext) -> list[Launch]:
        """Workers first (wave 1), then the head (wave 2)."""
        p = ctx.profile
        multi = len(ctx.ranks) > 1
        out = []
        for r in ctx.ranks:
            text, command = render_command(ctx, "sglang.sh.j2", template_context(ctx, r))
            env: dict[str, str | None] = {}
            if multi:
                rdma = r.node.rdma
                if rdma is None:
                    need(None, "rdma", r.node.name)
                assert rdma is not None
                env.update(NCCL_IB_HCA=",".join(rdma.hcas), NCCL_SOCKET_IFNAME=rdma.fabric_iface)
            env.update(p.env)
            spec = container_spec(ctx, r, text, command,
                                  binds=[Bind(model_host_dir(ctx, r), "/models/repo" if multi else "/model", True),
                                         *lane_binds(ctx, r)],
                                  env=env, ports=head_ports(p, r, multi))
            out.append(Launch.of(r, 2 if (r.rank == 0 and multi) else 1, spec))
        return sorted(out, key=lambda launch: (launch.wave, launch.rank))
