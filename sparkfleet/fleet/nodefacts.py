"""Node facts: the JSON document the node-side helper `nodeside/facts.py` prints, one per node.

Validated here, at the boundary; checks (pure functions over these models) never re-check them.
Fields a node cannot report are None, and the helper lists why in `errors` (e.g. "nvidia-smi: not
found"), so a check can say "unknown" instead of guessing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Facts(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemInfo(_Facts):
    mem_total_bytes: int
    mem_available_bytes: int
    swap_total_bytes: int = 0
    swap_free_bytes: int = 0


class Gpu(_Facts):
    index: int
    name: str
    pstate: str | None = None
    sm_clock_mhz: int | None = None  # clocks.sm
    max_sm_clock_mhz: int | None = None  # clocks.max.sm
    clock_event_reasons: int | None = None  # clocks_event_reasons.active, as an integer bitmask
    power_draw_w: float | None = None
    memory_total_mib: int | None = None  # [N/A] on GB10 (unified memory)
    memory_used_mib: int | None = None


class EarlyOom(_Facts):
    running: bool
    pid: int | None = None
    argv: list[str] = Field(default_factory=list)  # of the running process
    default_args: str | None = None  # EARLYOOM_ARGS from /etc/default/earlyoom
    mem_term_percent: float | None = None  # -m (SIGTERM threshold), from argv, else defaults, else 10
    sigterm_threshold_bytes: int | None = None  # mem_term_percent of MemTotal


class Container(_Facts):
    id: str
    name: str
    image: str  # as the container was created (ref)
    image_id: str | None = None  # sha256:... of the local image
    image_digests: list[str] = Field(default_factory=list)  # repo@sha256:... (RepoDigests)
    state: str  # running | exited | created | ...
    started_at: str | None = None
    finished_at: str | None = None  # when it ended (dockerd's FinishedAt), on the node's clock
    exit_code: int | None = None  # of a container that is not running
    labels: dict[str, str] = Field(default_factory=dict)
    host_ports: list[int] = Field(default_factory=list)  # published ports; host networking shows none
    network_mode: str | None = None
    gpus: bool = False  # requested GPUs (DeviceRequests)


class Image(_Facts):
    ref: str  # repo:tag
    id: str
    digests: list[str] = Field(default_factory=list)


class Docker(_Facts):
    available: bool
    error: str | None = None
    containers: list[Container] = Field(default_factory=list)
    images: list[Image] = Field(default_factory=list)


class Listener(_Facts):
    port: int
    address: str
    pid: int | None = None
    process: str | None = None


class Gid(_Facts):
    index: int
    gid: str
    type: str | None = None  # "RoCE v2", "RoCE v1", "IB/RoCE v1"
    ipv4: str | None = None  # set when the GID is an IPv4-mapped address
    netdev: str | None = None


class RdmaPort(_Facts):
    hca: str
    port: int
    state: str | None = None
    netdev: str | None = None
    gids: list[Gid] = Field(default_factory=list)
    link_layer: str | None = None  # "Ethernet" (RoCE) or "InfiniBand"
    phys_state: str | None = None  # "LinkUp", "Disabled", ...
    rate: str | None = None  # "200 Gb/sec (4X HDR)"
    counters: dict[str, int] = Field(default_factory=dict)  # ports/N/counters/* the node has

    @property
    def roce_v2_ipv4_index(self) -> int | None:
        """The GID index NCCL/b12x need: the first RoCE v2 entry carrying an IPv4 address."""
        for g in self.gids:
            if g.type == "RoCE v2" and g.ipv4:
                return g.index
        return None


class NetLink(_Facts):
    """A network interface as /sys/class/net shows it (the fabric interfaces the request named)."""

    name: str
    exists: bool
    operstate: str | None = None  # up | down | lowerlayerdown | unknown ...
    carrier: int | None = None  # 1 link detected, 0 none; None when the kernel will not say (down)
    speed_mbps: int | None = None  # None: unknown (down, or a virtual device)
    mtu: int | None = None
    counters: dict[str, int] = Field(default_factory=dict)  # statistics/* error counters, and carrier_changes


class Versions(_Facts):
    """The stack that must agree across a lane's ranks (checks/drift.py)."""

    kernel: str | None = None
    driver: str | None = None  # NVIDIA driver, from nvidia-smi's banner
    cuda: str | None = None
    docker: str | None = None  # server version


class Mount(_Facts):
    target: str
    source: str
    fstype: str
    options: str = ""


class PathInfo(_Facts):
    path: str
    exists: bool
    is_dir: bool = False
    mount: Mount | None = None  # the mount the path lives on
    free_bytes: int | None = None
    total_bytes: int | None = None


class NodeFacts(_Facts):
    node: str
    hostname: str
    simulated: bool = False  # the node's inventory entry says it is simulated (set by gather, not the helper)
    collected_at: float  # unix time on the node
    uptime_s: float | None = None
    helper_version: str
    meminfo: MemInfo | None = None
    gpus: list[Gpu] = Field(default_factory=list)
    earlyoom: EarlyOom | None = None
    docker: Docker | None = None
    listening: list[Listener] = Field(default_factory=list)
    rdma: list[RdmaPort] = Field(default_factory=list)
    mounts: list[Mount] = Field(default_factory=list)  # nfs/nfs4/cifs/smb3 and the asked paths' mounts
    paths: dict[str, PathInfo] = Field(default_factory=dict)  # every path the request asked about
    links: dict[str, NetLink] = Field(default_factory=dict)  # every interface the request named
    versions: Versions | None = None
    hashes: dict[str, str | None] = Field(default_factory=dict)  # sha256 of each asked file, None if unreadable
    errors: list[str] = Field(default_factory=list)  # what could not be read, and why
    # set by the controller, not the helper: its own clock when this document arrived (clock skew)
    received_at: float | None = None

    def booted_at(self) -> float | None:
        """When the node booted, on its own clock: the helper's time less the uptime it read in the same run."""
        return None if self.uptime_s is None else self.collected_at - self.uptime_s


class FactsRequest(_Facts):
    """What the controller asks the helper to look at (sent on stdin as JSON)."""

    node: str
    paths: list[str] = Field(default_factory=list)  # model dir, Engram/cache dirs, every -v source
    interfaces: list[str] = Field(default_factory=list)  # the node's fabric interfaces (inventory rdma)
    hash_paths: list[str] = Field(default_factory=list)  # the lane's patch files on this node
