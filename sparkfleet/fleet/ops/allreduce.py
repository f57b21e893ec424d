"""`check --nccl` and up's nccl step: an NCCL all-reduce across the lane's ranks, inside the lane's own image,
and NCCL's real transport read from what each rank printed.

Each rank's node runs one `docker run --rm` of the profile's image with the profile's container
options (host network, GPUs, /dev/infiniband, memlock ...), the NCCL variables of that rank's own
launch (NCCL_IB_HCA, NCCL_SOCKET_IFNAME and the lane's NCCL set) with the node's resolved GID index,
NCCL_DEBUG=INFO, and `nodeside/nccl_allreduce.py` mounted read-only. Rank 0's fabric IP is the
rendezvous. `commands` renders each rank's command (pure), `AllReduceRank` is one rank's run, and
`allreduce_ops` ships the script and runs every rank at once.

What a rank printed is read as an `NcclTranscript`: which network its NCCL chose, from its NCCL_DEBUG=INFO
lines. NCCL falls back from RDMA to TCP sockets without an error: the only sign is in its INFO lines
(vLLM's docs: look for `[send] via NET/IB/GDRDMA`, not `via NET/Socket`, REFERENCE.md). The lines
read here, in NCCL's own formats (NCCL logging docs, docs.nvidia.com/deeplearning/nccl/user-guide/
docs/troubleshooting/logging.html; src/transport/net_socket.cc and net_ib.cc), as an H200 printed
them (docs/receipts/nccl-allreduce-h200-world1.txt):

    host:pid:tid [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:192.168.192.11<0>
    host:pid:tid [0] NCCL INFO NET/IB : No device found.
    host:pid:tid [0] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.2<0>
    host:pid:tid [0] NCCL INFO Using network IB            (or: Using network Socket)
    host:pid:tid [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
    host:pid:tid [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0

checks/nccl.py judges the transcripts (a rank of an RDMA lane on sockets fails).
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field

from sparkfleet.engines.base import Launch, groups
from sparkfleet.fleet import ship  # the module, not its names: ship imports fleet/ops first (see helper_ops below)
from sparkfleet.fleet.op import OpGen
from sparkfleet.fleet.ops.base import Op, on
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

_INFO = re.compile(r"NCCL INFO (.*)$")
_NETWORK = re.compile(r"^Using network (\S+)")
_VIA = re.compile(r"^Channel \S+ : .*? via (\S+)")
_IB_USING = re.compile(r"^NET/IB : Using (.*?)(?:;|$)")
_SOCKET_USING = re.compile(r"^NET/Socket : Using (.*)$")
_VERSION = re.compile(r"^NCCL version (\S+)")
_WARN = re.compile(r"NCCL WARN (.*)$")
RESULT_KEY = "sparkfleet_nccl"


@dataclass
class NcclTranscript:
    """What one rank's output says about NCCL's choices."""

    network: str | None = None  # "IB" | "Socket" | a plugin's name, from "Using network X"
    via: Counter = field(default_factory=Counter)  # "NET/IB/0/GDRDMA" -> channels, "P2P/IPC", ...
    ib_devices: str | None = None  # what NET/IB said it uses ("[0]rocep1s0f0:1/RoCE [RO]")
    socket_ifaces: str | None = None
    version: str | None = None
    warnings: list[str] = field(default_factory=list)
    result: dict | None = None  # the script's JSON document

    @property
    def on_socket(self) -> bool:
        return self.network == "Socket" or any(v.startswith("NET/Socket") for v in self.via)

    @property
    def on_rdma(self) -> bool:
        return self.network == "IB" or any(v.startswith("NET/IB") for v in self.via)

    @property
    def gdrdma(self) -> bool:
        return any(v.startswith("NET/IB") and "GDRDMA" in v for v in self.via)

    def describe(self) -> str:
        parts = [f"network {self.network or '?'}"]
        if self.via:
            parts.append("channels " + ", ".join(f"{k} x{n}" for k, n in sorted(self.via.items())))
        if self.ib_devices:
            parts.append(f"NET/IB {self.ib_devices.strip()}")
        if self.socket_ifaces and self.on_socket:
            parts.append(f"NET/Socket {self.socket_ifaces.strip()}")
        if self.version:
            parts.append(f"NCCL {self.version}")
        return "; ".join(parts)


def parse(text: str) -> NcclTranscript:
    """One rank's combined output (NCCL's lines and the script's JSON line)."""
    t = NcclTranscript()
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("{") and RESULT_KEY in line:
            try:
                doc = json.loads(line)
            except ValueError:
                doc = None
            if isinstance(doc, dict) and isinstance(doc.get(RESULT_KEY), dict):
                t.result = doc[RESULT_KEY]
            continue
        w = _WARN.search(line)
        if w:
            t.warnings.append(w.group(1).strip())
            continue
        m = _INFO.search(line)
        if not m:
            continue
        msg = m.group(1).strip()
        if (x := _NETWORK.match(msg)) is not None:
            t.network = x.group(1)
        elif (x := _VIA.match(msg)) is not None:
            t.via[x.group(1)] += 1
        elif (x := _IB_USING.match(msg)) is not None:
            t.ib_devices = x.group(1)
        elif (x := _SOCKET_USING.match(msg)) is not None:
            t.socket_ifaces = x.group(1)
        elif (x := _VERSION.match(msg)) is not None:
            t.version = x.group(1)
    return t


def transcript(result: object | None) -> NcclTranscript:
    """What a rank's run printed (a fleet Result: its stdout, then its stderr), read; nothing for no result."""
    if result is None:
        return parse("")
    return parse(getattr(result, "stdout", "") + "\n" + getattr(result, "stderr", ""))


@dataclass(frozen=True)
class AllReduceRank(Op[NcclTranscript]):
    """Run one rank's all-reduce (its command, rendered by `commands`; it starts a container).
    Its answer: the transport NCCL chose and the script's result line, from stdout and stderr together."""

    script: str
    changes = True

    def command(self) -> str:
        return self.script

    def parse(self, result: Result) -> NcclTranscript:
        return transcript(result)


@dataclass
class RankRun:
    rank: int
    node: str
    command: str
    result: Result | None = None
    transcript: NcclTranscript | None = None  # what NCCL printed, as the operation read it (AllReduceRank.parse)

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
        mount = '-v "$HOME"/' + shlex.quote(ship.remote_path(HELPER).removeprefix("~/") + f":{IN_CONTAINER}:ro")
        at = argv.index(profile.image.pinned)
        cmd = " ".join(shlex.quote(a) for a in argv[:at]) + " " + mount + " " + \
            " ".join(shlex.quote(a) for a in argv[at:])
        out.append(RankRun(r.rank, r.node.name, cmd + " 2>&1"))
    return out


def allreduce_ops(ranks: list[Rank], runs: list[RankRun], timeout_s: float = 300.0) -> OpGen[list[RankRun]]:
    """Verify (or ship) the script, then start every rank at once (they meet at rank 0) and wait for all, as
    the node commands it yields; each RankRun's result (None where it was not run: --dry-run)."""
    nodes = [r.node for r in ranks]
    # ship.helper_ops read here, not bound at import: ship -> fleet.ops -> allreduce -> ship, so a process that
    # imports ship first finds its names unbound while this module loads
    shipped = yield from ship.helper_ops(HELPER, nodes, run=False)
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
