"""What a run carries from step to step: the lane, the fleet, the transport and what was seen."""

from __future__ import annotations

import hashlib
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from sparkfleet.engines.base import Launch
from sparkfleet.engines.logs import LogFacts
from sparkfleet.engram.fleet import copy_dirs
from sparkfleet.findings import Finding
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.fleet.op import Executor, executor_for, placeholder, shown_as
from sparkfleet.fleet.transport import Result, Transport
from sparkfleet.gates.result import GateResult
from sparkfleet.opsdir import Spec
from sparkfleet.patches import manifest as pm
from sparkfleet.placement import endpoint
from sparkfleet.plan import Plan
from sparkfleet.runner.events import Events
from sparkfleet.runner.record import LaunchRecord, Record
from sparkfleet.schema.inventory import Inventory, Node
from sparkfleet.schema.load import Loaded
from sparkfleet.schema.playbook import Playbook
from sparkfleet.slurm.ops import places as slurm_places


@dataclass
class RunOptions:
    dry_run: bool = False
    dry_reads: bool = False  # --dry-run=facts: read-only commands (facts, the lane's containers) run
    verbose: bool = False  # -v: a `command` event for every command as it runs
    save_as: str | None = None  # write a restore point after a successful up
    keep: bool = False  # down --keep: stop containers but keep them (the Station's candidate lanes)
    stop_on_gate_failure: bool = True  # False: up --keep-on-gate-failure (the lane stays up, said loudly)
    force: bool = False  # restore: go on despite drifted pins
    boot_budget_s: float | None = None  # overrides the profile's expect.boot_budget_s
    stall_s: float | None = None  # up --stall-after: overrides the profile's expect.stall_s (runner/progress.py)
    poll_s: float = 1.0
    endpoint: str | None = None  # the head's API base URL, when the default guess is wrong
    restore_point: dict | None = None  # restore: the recorded pins
    stop_timeout_s: float = 60.0
    no_probe: bool = False  # up --no-probe: the clock probe step is skipped (and the record says so)
    probe_seconds: float | None = None  # up --probe-seconds: how long the probe's load runs (None: its default)
    gate_args: dict = field(default_factory=dict)  # overrides the playbook's gates step args (only, soak_minutes)
    fabric_probe: bool = True  # up --no-fabric-probe: skip the measured fabric probe
    limit: tuple[str, ...] = ()  # down --limit NODE,...: only these nodes of the lane are touched
    drain_on_fail: bool = False  # up --drain-on-fail (launcher: slurm): a node preflight fails is drained
    accept_unknown: bool = False  # up --accept-unknown: go on past checks a node's unread facts left unknown


@dataclass
class Started:
    """A container this run started."""

    node: str
    rank: int
    container: str  # name
    id: str


@dataclass
class RunContext:
    spec: Spec
    loaded: Loaded
    inventory: Inventory
    playbook: Playbook
    plan: Plan
    transport: Transport
    record: Record
    events: Events
    options: RunOptions
    state_dir: Path
    facts: dict[str, NodeFacts | Result] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)  # the preflight's verdicts (the probe's replace the clock's)
    gid_index: dict[str, int] = field(default_factory=dict)
    started: list[Started] = field(default_factory=list)
    would_start: list[Started] = field(default_factory=list)  # ranks a launch showed, not started (--dry-run)
    log_facts: dict[int, LogFacts] = field(default_factory=dict)
    logs_tail: dict[int, list[str]] = field(default_factory=dict)
    engram_manifests: dict[str, str] = field(default_factory=dict)  # rank -> sha256 of its copy's manifest
    launches: list[LaunchRecord] = field(default_factory=list)  # each rank's launch as this run renders it
    facts_after_load: dict[str, NodeFacts | Result] = field(default_factory=dict)
    gate_results: list[GateResult] = field(default_factory=list)
    caches_dropped: dict | None = None  # node -> True, or why the drop failed
    slurm_job: dict | None = None  # launcher: slurm: this run's job once submitted (the record holds the same)
    rendered: bool = False  # the launches are bound and recorded (ctx.launches); restore adopts its own
    tunnel: str | None = None  # the head's base URL once decided (an SSH local forward stays open till the end)
    closers: ExitStack = field(default_factory=ExitStack)  # what the run opened (tunnels): closed at its end
    executor: Executor = field(init=False)  # the one place this run's node commands run (or are shown)

    def __post_init__(self) -> None:
        nodes = {**self.inventory.nodes, **slurm_places(self.inventory)}  # launcher: slurm's controller
        self.executor = executor_for(nodes, transport=self.transport, dry_run=self.options.dry_run,
                                     reads=self.options.dry_reads, show=shown_as(self.events.emit),
                                     on_run=shown_as(lambda _would, **line: self.events.emit("command", **line))
                                     if self.options.verbose else None)

    @property
    def profile(self):
        return self.loaded.profile

    @property
    def nodes(self) -> list[Node]:
        """The lane's nodes in rank order (only those of --limit when given)."""
        return [r.node for r in self.plan.ranks if not self.options.limit or r.node.name in self.options.limit]

    @property
    def head(self) -> Node:
        return self.plan.ranks[0].node

    def node(self, name: str) -> Node:
        return self.inventory.nodes[name]

    @property
    def lane_shown_only(self) -> bool:
        """The lane was shown, not started (--dry-run, decided by the executor): the steps that need it live
        (wait_ready, expect, gates) show their node commands and say what they would do."""
        return self.executor.dry_run and not self.started

    def would(self, launches: list[Launch]) -> None:
        """Ranks a launch showed and did not start (--dry-run): the later steps show their commands for them,
        each container id a named placeholder."""
        self.would_start += [Started(x.node, x.rank, x.container, placeholder(f"id of rank {x.rank}'s container "
                                                                              f"on {x.node}")) for x in launches]

    def endpoint(self) -> str:
        """The head's OpenAI-compatible base URL as seen from this machine: --endpoint; else, for a head
        that binds its API to loopback (`host: 127.0.0.1`) behind SSH, a local port forward over the
        head's pinned connection (opened once, closed when the run ends); else the head's address."""
        if self.options.endpoint:
            return self.options.endpoint.rstrip("/")
        # here, not at the top: `restore --list` and every verb's --help import this module, and the
        # transports (paramiko) would cost them a half second of start-up
        from sparkfleet.fleet.connect import api_base

        if self.tunnel is None and self.profile.port is not None:  # the executor shows it under --dry-run
            self.tunnel = self.closers.enter_context(api_base(
                self.head, self.profile.port, self.profile.host, self.executor,
                on_tunnel=lambda url: self.events.emit("message", text=f"{self.head.name} serves on 127.0.0.1:"
                                                       f"{self.profile.port} only: reaching it through an SSH "
                                                       f"tunnel at {url}")))
        return self.tunnel or endpoint(self.head, self.profile.port)

    def close(self) -> None:
        """Close what the run opened (SSH tunnels)."""
        self.closers.close()

    def engram_dirs(self) -> dict[str, tuple[int, str]]:
        """node -> (rank, node-local Engram copy dir) for the ranks that read a node-local copy."""

        return copy_dirs(self.profile, self.inventory, self.plan.ranks, self.spec.root / "templates")

    def patch_manifest_sha256(self) -> str | None:
        """sha256 of the lane's patch-set manifest file (a restore pin), None without one."""
        name = self.profile.patches
        path = pm.set_dir(self.spec.root, name) / pm.MANIFEST if name else None
        return hashlib.sha256(path.read_bytes()).hexdigest() if path and path.is_file() else None
