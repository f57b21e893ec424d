"""The inventory: nodes, groups and hardware classes (what the lab is, not what runs on it)."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sparkfleet.schema.base import FieldError, Strict

NAME = r"^[a-z0-9][a-z0-9_-]*$"


class HardwareClass(Strict):
    """Per-class defaults; the lab inventory may override any of them."""

    gpu_memory_gib: float | None = None
    host_memory_gib: float | None = None  # separate host RAM (GB300 Grace); None = unified
    sms: int | None = None
    earlyoom_percent: float | None = None
    min_mem_available_gib: float | None = None  # per rank at launch, after dropping caches
    clock_latch_mhz: tuple[int, int] | None = None
    clock_latch_fraction: float | None = None  # below this fraction of max SM clock under load = latched
    slow_state_ratio: float | None = None  # after-idle / back-to-back step time above this = warn
    host_floor_gib: float | None = None  # pin-hot hook floor at re-home time
    fabric_speed_gbps: float | None = None  # expected fabric link rate; below it warns (None: not judged)
    fabric_probe_ratio: float | None = None  # a probed link this many times off the median fails (default 2)


# From the seeds (INV-10/12/13/15, INV-50, HLT-03/13) and DESIGN.md OQ-11.
DEFAULT_HARDWARE: dict[str, HardwareClass] = {
    "gb10": HardwareClass(
        gpu_memory_gib=121, sms=48, earlyoom_percent=2, min_mem_available_gib=100,
        clock_latch_mhz=(630, 950), clock_latch_fraction=0.5, slow_state_ratio=1.25,
        fabric_speed_gbps=200,  # ConnectX-7 on GB10: NVIDIA's multi-Spark playbooks validate 200G (issue 15)
    ),
    "gb300": HardwareClass(gpu_memory_gib=250.7, host_memory_gib=494, host_floor_gib=10),
}


class Hop(Strict):
    """One jump host on the way to a node (ProxyJump), resolved: its host key is checked like a node's."""

    host: str
    user: str = "root"
    port: int = Field(22, ge=1, le=65535)
    key: str | None = None

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


class Ssh(Strict):
    """How to reach a node. Values not set here come from the SSH config (fleet/sshconfig.py), as ssh does."""

    host: str = ""  # address, or a Host of the SSH config (its HostName then applies, as with `ssh host`)
    alias: str | None = None  # a Host that must be in the SSH config (its HostName, User, Port, ...)
    user: str = "root"
    port: int = Field(22, ge=1, le=65535)
    key: str | None = None  # path of the private key; None = agent / default keys
    proxy_jump: str | None = None  # OpenSSH ProxyJump: [user@]host[:port][,...] (Hosts allowed), or none
    jump: list[Hop] = Field(default_factory=list)  # the resolved hops, first hop first

    @model_validator(mode="after")
    def _named(self) -> Ssh:
        if not self.host and not self.alias:
            raise FieldError("host", "set host (an address or an SSH config Host) or alias")
        return self


class Rdma(Strict):
    hcas: list[str] = Field(min_length=1)
    fabric_iface: str
    gid_index: Literal["auto"] | int = "auto"
    rail2_iface: str | None = None  # the second port, where runtime rail-2 aliases go


class NfsExport(Strict):
    path: str
    options: str
    threads: int | None = None


class NfsMount(Strict):
    source: str  # host:/path
    path: str
    options: str


class Storage(Strict):
    model_root: str  # where HF repo dirs are on this node (local NVMe, or the NFS mount)
    model_local: bool = False  # True on the node that holds the checkpoint on its own NVMe
    nfs_export: NfsExport | None = None
    nfs_mount: NfsMount | None = None
    engram_local_dir: str | None = None
    cache_dir: str
    patch_root: str = "/var/lib/sparkfleet/patches"

    @field_validator("model_root", "engram_local_dir", "cache_dir", "patch_root")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("must be an absolute path")
        return v


# a Slurm name (partition, account, QOS, reservation): it goes into an `#SBATCH` line, which sbatch reads
# without a shell, so spaces, quotes and newlines are refused here rather than quoted there
SLURM_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# sbatch --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch(1) "-t, --time"), or UNLIMITED
SLURM_TIME = r"^(UNLIMITED|INFINITE|unlimited|infinite|\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2})$"


class Slurm(Strict):
    """The lane runs as one Slurm job (launcher: slurm). sbatch/squeue/scancel run on the controller with
    `conf` as SLURM_CONF, or on `login` over SSH when it is set."""

    conf: str | None = None  # slurm.conf the controller's Slurm commands read (SLURM_CONF); None: Slurm's own
    partition: str | None = None  # None: the cluster's default partition
    account: str | None = None
    qos: str | None = None
    time: str | None = None  # the job's time limit (sbatch --time)
    reservation: str | None = None
    login: Ssh | None = None  # a login node the Slurm commands run on, over SSH
    ssh: bool = True  # False: compute nodes cannot be reached over SSH (preflight and status go through srun)
    # a submitted job still pending this long is cancelled and `up` fails naming Slurm's reason (squeue %r)
    pending_s: float = Field(300.0, gt=0)

    @field_validator("conf")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("must be an absolute path (the slurm.conf the Slurm commands read)")
        return v

    @field_validator("partition", "account", "qos", "reservation")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not re.match(SLURM_NAME, v):
            raise ValueError(f"{v!r} is not a Slurm name (letters, digits, '.', '_', '-')")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not re.match(SLURM_TIME, v):
            raise ValueError(f"{v!r} is not a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS "
                             "or UNLIMITED; sbatch --time)")
        return v



class Node(Strict):
    name: str = Field(pattern=NAME)
    ssh: Ssh
    fabric_ip: str | None = None
    hardware: Literal["gb10", "gb300"]
    rdma: Rdma | None = None
    storage: Storage
    rail2_alias: str | None = None  # runtime alias (CIDR) added on rail2_iface by rail-2 lanes
    # local: run on this machine; srun: through Slurm (set by the inventory when slurm.ssh is false)
    transport: Literal["ssh", "local", "srun"] = "ssh"
    # local transport: the argv each command runs under (a script that enters a container or namespace);
    # the command follows it as `bash -c COMMAND`. None: run directly on this machine.
    wrapper: list[str] | None = None
    slurm: Slurm | None = None  # transport srun: the inventory's slurm: section (set with it, not written)
    simulation: bool = False  # a node of an inventory `sparkfleet sim up` wrote: output about it is tagged [sim]

    @field_validator("fabric_ip")
    @classmethod
    def _ip(cls, v: str | None) -> str | None:
        if v is not None:
            ipaddress.ip_address(v)
        return v

    @field_validator("rail2_alias")
    @classmethod
    def _cidr(cls, v: str | None) -> str | None:
        if v is not None:
            ipaddress.ip_interface(v)
        return v


class Inventory(Strict):
    name: str = "inventory"
    example: bool = False  # True when addresses/HCAs/interfaces are examples the user must set
    fabric_subnet: str | None = None
    ssh_config: str | None = None  # OpenSSH client config (default: $SPARKFLEET_SSH_CONFIG, ~/.ssh/config)
    # nodes whose clocks differ by more than this warn: vLLM stamps its log lines to the second, so a
    # larger skew puts the ranks' lines (and the run record's events) out of order
    max_clock_skew_s: float = Field(1.0, gt=0)
    hardware_classes: dict[str, HardwareClass] = Field(default_factory=dict)
    launcher: Literal["ssh", "slurm"] = "ssh"  # how ranks are started: docker over SSH, or one Slurm job
    slurm: Slurm | None = None
    nodes: dict[str, Node]
    groups: dict[str, list[str]]

    @model_validator(mode="before")
    @classmethod
    def _names(cls, data: object) -> object:
        # node names come from their keys; saying them twice is allowed only if they agree
        if isinstance(data, dict) and isinstance(data.get("nodes"), dict):
            nodes = {}
            for key, value in data["nodes"].items():
                if isinstance(value, dict):
                    value = {"name": key, **value}
                nodes[key] = value
            data = {**data, "nodes": nodes}
        return data

    @model_validator(mode="after")
    def _launcher(self) -> Inventory:
        if self.launcher == "slurm" and self.slurm is None:
            raise FieldError("launcher", "launcher: slurm needs a slurm: section (at least {} for Slurm's defaults)")
        if self.launcher == "slurm" and self.slurm is not None and not self.slurm.ssh:
            if self.slurm.login is not None:
                raise FieldError("slurm.login", "with slurm.ssh: false the compute nodes are reached by srun run on "
                                 "this machine; srun on a login node is not supported yet: drop login: or allow SSH")
            for node in self.nodes.values():  # compute nodes without SSH: every command goes through srun
                if node.transport == "ssh":
                    node.transport, node.slurm = "srun", self.slurm
        for node in self.nodes.values():
            if node.transport == "srun" and node.slurm is None:
                raise FieldError(f"nodes.{node.name}.transport", "srun is what launcher: slurm with slurm.ssh: false "
                                 "makes of a node's ssh transport; write ssh (or local)")
        return self

    def hardware(self, node: Node) -> HardwareClass:
        """The node's hardware class, with the inventory's overrides applied."""
        base = DEFAULT_HARDWARE[node.hardware]
        over = self.hardware_classes.get(node.hardware)
        if over is None:
            return base
        return base.model_copy(update=over.model_dump(exclude_unset=True))

    def group_nodes(self, group: str) -> list[Node]:
        return [self.nodes[n] for n in self.groups[group]]
