"""`check --nccl`: an NCCL all-reduce across the lane's ranks, inside the lane's own image.

Each rank's node runs one `docker run --rm` of the profile's image with the profile's container
options (host network, GPUs, /dev/infiniband, memlock ...), the NCCL variables of that rank's own
launch (NCCL_IB_HCA, NCCL_SOCKET_IFNAME and the lane's NCCL set) with the node's resolved GID index,
NCCL_DEBUG=INFO, and `nodeside/nccl_allreduce.py` mounted read-only. Rank 0's fabric IP is the
rendezvous. What each rank printed is judged by checks/nccl.py.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sparkfleet.checks.nccl import Transport
from sparkfleet.engines.base import Launch, groups
from sparkfleet.fleet.op import OpGen
from sparkfleet.fleet.ops.base import on
from sparkfleet.fleet.ops.nccl import AllReduceRank
from sparkfleet.fleet.ship import helper_ops, remote_path
from sparkfleet.fleet.transport import Result
from sparkfleet.placement import Rank
from sparkfleet.schema.profile import Profile

HELPER = "nccl_allreduce.py"
IN_CONTAINER = "/opt/sparkfleet/nccl_allreduce.py"
PORT = 29571  # the test's rendezvous (not the lane's master port, which a stale head may still hold)
SIZES = (48 * 1024, 400 * 1024)  # INV-28
# container options of the lane's that make no sense for a one-shot test container
DROP = {"--restart", "--memory", "--memory-swap", "--oom-score-adj", "--name", "-d", "--detach", "--rm",
        "--label", "-p", "--publish"}
ENV_PREFIXES = ("NCCL_", "GLOO_", "UCX_")
WHAT = "NCCL all-reduce in the lane's image"  # the operation, as --dry-run shows it


@dataclass
class RankRun:
    rank: int
    node: str
    command: str
    result: Result | None = None
    transcript: Transport | None = None  # what NCCL printed, as the operation read it (AllReduceRank.parse)

    @property
    def op(self) -> AllReduceRank:
        return AllReduceRank(self.command)


def container_options(profile: Profile) -> list[str]:
    out: list[str] = []
    for g in groups(profile.docker, "repeat"):
        if g and g[0].split("=", 1)[0] not in DROP:
            out += g
    return out


def nccl_env(launch: Launch | None, profile: Profile, gid_index: int | None) -> dict[str, str]:
    """The rank's NCCL variables as its launch has them, with the node's GID index, and INFO logging."""
    env = {k: str(v) for k, v in profile.env.items() if k.startswith(ENV_PREFIXES)}
    if launch is not None:
        env.update({k: v for k, v in launch.env.items() if k.startswith(ENV_PREFIXES)})
    if gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(gid_index)
    env["NCCL_DEBUG"] = "INFO"
    env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    return env


def commands(profile: Profile, ranks: list[Rank], launches: list[Launch], gid_index: dict[str, int],
             run_id: str = "check") -> list[RankRun]:
    """Each rank's shell command (pure; allreduce_ops runs them, or shows them under --dry-run)."""
    if profile.image is None:
        raise ValueError("the lane has no image to run NCCL in")
    head = ranks[0].node
    master = head.fabric_ip or head.ssh.host
    out = []
    for r in ranks:
        launch = next((x for x in launches if x.rank == r.rank), None)
        env = nccl_env(launch, profile, gid_index.get(r.node.name))
        argv = ["docker", "run", "--rm", "--name", f"sf-nccl-{profile.name}-r{r.rank}-{run_id}",
                "--label", f"sparkfleet.nccl={profile.name}", *container_options(profile)]
        for k, v in env.items():
            argv += ["-e", f"{k}={v}"]
        argv += [profile.image.pinned, "python3", IN_CONTAINER, "--rank", str(r.rank), "--world-size",
                 str(len(ranks)), "--master-addr", str(master), "--master-port", str(PORT),
                 "--sizes", ",".join(map(str, SIZES))]
        # the helper's path under the node's home: "$HOME" expands there, the rest is quoted
        mount = '-v "$HOME"/' + shlex.quote(remote_path(HELPER).removeprefix("~/") + f":{IN_CONTAINER}:ro")
        at = argv.index(profile.image.pinned)
        cmd = " ".join(shlex.quote(a) for a in argv[:at]) + " " + mount + " " + \
            " ".join(shlex.quote(a) for a in argv[at:])
        out.append(RankRun(r.rank, r.node.name, cmd + " 2>&1"))
    return out


def allreduce_ops(ranks: list[Rank], runs: list[RankRun], timeout_s: float = 300.0) -> OpGen[list[RankRun]]:
    """Verify (or ship) the script, then start every rank at once (they meet at rank 0) and wait for all, as
    the node commands it yields; each RankRun's result (None where it was not run: --dry-run)."""
    nodes = [r.node for r in ranks]
    shipped = yield from helper_ops(HELPER, nodes, run=False)
    by_node = {x.node: x for x in runs}
    for name, res in shipped.items():
        if not res.ok:
            by_node[name].result = res
    todo = {n: x.op for n, x in by_node.items() if x.result is None}
    results = yield on(WHAT, todo, timeout_s)
    for name, res in (results or {}).items():
        by_node[name].result = res
    for x in runs:
        if x.result is not None:
            x.transcript = x.op.parse(x.result)
    return runs
