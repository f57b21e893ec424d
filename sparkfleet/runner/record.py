"""Run records: what ran, what was seen and how it ended, one JSON file per run in the state dir.

Secrets never reach a record: values of env vars whose names look secret, and the API key itself,
are replaced before anything is written.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sparkfleet.redact import REDACTED, SECRET_NAME, redact
from sparkfleet.schema.errors import UserError

__all__ = ["REDACTED", "SECRET_NAME", "Record", "RunRecord", "list_runs", "new_run_id", "read_record", "redact"]

# 1: the record as a free-form dict (before the typed model); 2: typed, with per-rank launches and pins;
# 3: every key the runner and watch write is declared (RecordData forbids others), one validation on write;
# 4: a Slurm lane's job and the nodes drained for it (slurm_job, slurm_drained)
SCHEMA_VERSION = 4


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


class _Open(BaseModel):
    """A part of the record with typed known fields; other keys (step data others add) are kept as they are."""

    model_config = ConfigDict(extra="allow")


class FindingRecord(_Open):
    check: str
    status: str = "ok"
    node: str | None = None
    message: str = ""


class GateRecord(_Open):
    name: str
    status: str


class GatesRecord(_Open):
    results: list[GateRecord] = Field(default_factory=list)


class PatchNodeRecord(_Open):
    ok: bool = False
    missing: list[str] = Field(default_factory=list)
    wrong: list[str] = Field(default_factory=list)


class PatchesRecord(_Open):
    set: str = ""
    manifest_sha256: str | None = None
    nodes: dict[str, PatchNodeRecord] = Field(default_factory=dict)


class NodeSlice(_Open):
    """The inventory facts that shaped one rank's launch (what `restore` compares against today's)."""

    address: str | None = None  # SSH host
    fabric_ip: str | None = None
    hcas: list[str] = Field(default_factory=list)
    fabric_iface: str | None = None
    gid_index: int | str | None = None  # the resolved index (an int) once facts resolved `auto`
    storage: dict[str, Any] = Field(default_factory=dict)  # model_root, engram_local_dir, cache_dir, patch_root...
    hostname: str | None = None  # the node's own name for itself, from its facts


class PatchFileRecord(_Open):
    source: str
    sha256: str | None = None
    target: str


class LaunchRecord(_Open):
    """One rank's launch exactly as it ran: `restore` relaunches this, not a fresh render."""

    node: str
    rank: int
    role: str = ""
    wave: int = 0
    container: str = ""
    argv: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)  # secret values are redacted; their names stay
    script: str = ""
    files: dict[str, str] = Field(default_factory=dict)  # rendered files (TensorFold's config.env)
    ready_check: str = ""  # the launch's ready check (engines.base.Launch), run again on restore
    container_options: list[str] = Field(default_factory=list)  # docker options before the image
    image_ref: str | None = None
    image_digest: str | None = None
    image_id: str | None = None  # the node's local image id for image_ref when the lane started
    patch_set: str | None = None
    patch_files: list[PatchFileRecord] = Field(default_factory=list)
    engram_dir: str | None = None
    engram_manifest_sha256: str | None = None
    inventory: NodeSlice | None = None


Doc = dict[str, Any]  # a part whose shape its own module defines (facts: NodeFacts; a probe: its verdict)


class PinsRecord(_Open):
    drift: list[str] = Field(default_factory=list)
    today: list[str] = Field(default_factory=list)


class SlurmJobRecord(_Open):
    """The Slurm job a lane ran as (launcher: slurm): what `down` cancels and `status` shows."""

    job_id: str
    name: str  # sbatch --job-name (naming.slurm_job_name)
    comment: str  # the run label (sparkfleet.run=<run id>): with the name, how the lane finds its own jobs
    nodes: list[str] = Field(default_factory=list)  # head first
    het: bool = False
    submitted_at: float | None = None
    running_at: float | None = None  # when squeue first said RUNNING
    state: str | None = None  # the last state seen (squeue %T / scontrol JobState)
    reason: str | None = None  # Slurm's reason with it (a pending job's, or why it ended)
    batch_host: str | None = None  # the node whose /tmp holds the job's output
    output: str | None = None  # the job's output file there (scontrol StdOut)
    script: str = ""  # the sbatch script as submitted


# The parts below type what the runner and watch write; every field has a default, so a record an older
# sparkfleet wrote without one still reads (restore and diff read old points).
class SilenceRecord(_Open):
    """One judgement of a head that logged nothing for a while (runner/progress.py Silence)."""

    kind: str | None = None  # working | stalled | unknown
    silent_s: float | None = None
    window_s: float | None = None  # how long apart the two CPU samples were
    cpu_s: dict[str, float | None] = Field(default_factory=dict)  # rank -> CPU seconds between them (None: not read)


class WaitReadyRecord(_Open):
    """How wait_ready polled the head, and the rank it saw fail."""

    poll_s: float | None = None
    polls: int = 0
    poll_started: list[float] = Field(default_factory=list)  # the last 20 polls' start times
    stall_s: float | None = None
    failed_rank: int | None = None
    failed_node: str | None = None
    detected_at: float | None = None
    silent: list[SilenceRecord] | None = None


class StartupRecord(_Open):
    """The lane's startup receipt: seconds from the head's container start (its `docker run` returned, on the
    controller's clock) to the API port first answering, to /health 200, and to the first generated token of
    one streamed request sent as the lane was ready. Each is seen at wait_ready's poll, so it is exact to a poll;
    None where that point was not reached, with the reason for the token in first_token_error."""

    head_started: float | None = None
    port_open_s: float | None = None
    health_s: float | None = None
    ready_s: float | None = None
    first_token_s: float | None = None
    first_token_error: str | None = None


class UnreachableRecord(_Open):
    """A node stop could not ask: its rank may still run there."""

    rank: int | None = None
    kind: str | None = None  # the check that failed there (reach, docker-down, ...)
    why: str = ""
    remedy: str = ""


class IncidentRecord(_Open):
    """What watch saw fail (watch/policy.py's Verdict)."""

    reason: str | None = None
    why: str = ""
    node: str | None = None


class StandDownRecord(_Open):
    """Why watch stood down instead of restarting, and who held the lane's lock."""

    why: str = ""
    holder: dict[str, Any] | None = None  # the lock file's holder (runner/lock.py parse_holder)


class RestartRecord(_Open):
    """The restart watch ran: the playbook's own record is run_id."""

    playbook: str | None = None
    run_id: str | None = None
    outcome: str | None = None
    reason: str = ""
    budget_left: int | None = None  # restarts the policy still allows


class FleetLockRecord(_Open):
    """The nodes whose fleet lock this run took, and the stale locks it took over (runner/lock.py NodeLock)."""

    nodes: list[str] = Field(default_factory=list)
    taken_over: list[FindingRecord] = Field(default_factory=list)


class BuiltTreeRecord(_Open):
    """One rank's built engine as the engine_build step hashed it (enginebuild.tree_digest)."""

    exists: bool = False
    digest: str | None = None


class EngineBuildRecord(_Open):
    """The pinned build the lane served with, and what each rank held (`restore` refuses another build)."""

    digest: str | None = None  # the pin's digest
    pin: str | None = None  # the pin's key
    dir: str | None = None
    nodes: dict[str, BuiltTreeRecord | str] = Field(default_factory=dict)  # node -> its tree, or why not read


class RecordData(BaseModel):
    """Every key a run (the runner's steps) or a watch incident writes; another key is a bug, refused on write."""

    model_config = ConfigDict(extra="forbid")

    # the plan and the preflight
    plan_findings: list[FindingRecord] | None = None
    overrides: Doc | None = None  # -o KEY=VALUE as given: restore reloads the profile with them
    facts: dict[str, Doc] | None = None  # node -> NodeFacts, or {error, message}
    findings: list[FindingRecord] | None = None
    # up --accept-unknown: the unknowns (a facts part a node could not read) the operator chose to go on past
    accepted_unknowns: list[FindingRecord] | None = None
    probe: Doc | None = None  # node -> the clock probe's verdict, or {"skipped": why}
    fabric_probe: Doc | None = None
    nccl: Doc | None = None
    patches: PatchesRecord | None = None
    engine_build: EngineBuildRecord | None = None
    engram: dict[int, str] | None = None  # rank -> node-local | nfs
    engram_manifests: dict[str, str] | None = None  # rank -> sha256 of its copy's manifest
    engram_ranges: str | None = None  # "harvested" when the harvest decided the rows
    rail2: dict[str, str] | None = None  # node -> the runtime alias added
    pins: PinsRecord | None = None
    fleet_lock: FleetLockRecord | None = None
    unreachable: dict[str, UnreachableRecord] | None = None  # stop: node -> it may still run there
    # the launch and what served
    launches: list[LaunchRecord] | None = None
    slurm_job: SlurmJobRecord | None = None  # launcher: slurm: the job the lane ran as (watch: the one that ended)
    slurm_drained: dict[str, str] | None = None  # up --drain-on-fail: node -> the reason Slurm was given
    wait_ready: WaitReadyRecord | None = None
    startup: StartupRecord | None = None
    autotune_shape_changes: list[str] | None = None
    autotune_seeded: list[str] | None = None
    log_facts: dict[str, Doc] | None = None  # rank -> LogFacts.as_dict()
    last_log_lines: dict[str, list[str]] | None = None  # rank (or node) -> its last log lines
    facts_after_load: dict[str, Doc] | None = None
    expect: list[FindingRecord] | None = None
    gates: GatesRecord | None = None
    restore_point: str | None = None
    interrupted_by: str | None = None  # SIGINT | SIGTERM: every container of the run was looked up and stopped
    # a watch incident
    stand_down: StandDownRecord | None = None
    incident: IncidentRecord | None = None
    probes: list[Doc] | None = None
    restart: RestartRecord | None = None
    stopped: dict[str, Any] | None = None  # node -> [{rank, state, finished_at}] or why it could not say
    not_judged: list[str] | None = None  # what watch could not judge, and why (Slurm not asked, memory unread)
    # a record of an older schema: its keys this version no longer names, kept as they were
    legacy: Doc | None = None


class StepRecord(_Open):
    step: str
    status: str = ""
    summary: str = ""
    elapsed_s: float = 0.0


class Served(_Open):
    """What served: read back by `restore` and `diff`."""

    kv_tokens: int | None = None
    moe_backend_line: str | None = None
    gates: dict[str, str] = Field(default_factory=dict)


class RunRecord(_Open):
    """A run record as written to state/runs/<run_id>.json; `read_record` is the one way to read one."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    playbook: str = ""
    profile: str = ""
    inventory: str = ""
    command: str = ""
    started: float = 0.0
    finished: float | None = None
    outcome: str = "unknown"
    reason: str = ""
    duration_s: float | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    data: RecordData = Field(default_factory=RecordData)
    profile_merged: dict[str, Any] | None = None  # the lane with its bases merged, as it ran
    template_hashes: dict[str, str] | None = None  # sha256 of every template, as they were
    served: Served | None = None
    forced: bool = False  # restore --force went on despite drifted pins
    restored_from: str | None = None  # the restore point this run relaunched


class RecordError(UserError):
    """A record or restore point this sparkfleet cannot read (newer schema, or not a record)."""


def read_record(doc: Any, origin: str = "run record") -> RunRecord:
    """Parse a record dict: schemas 1 (no schema_version) to 3 read; a newer schema is refused, clearly."""
    if not isinstance(doc, dict):
        raise RecordError(f"{origin}: not a run record (expected a JSON object)")
    version = doc.get("schema_version", 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise RecordError(f"{origin}: schema_version {version!r} is newer than this sparkfleet reads "
                          f"({SCHEMA_VERSION}); upgrade sparkfleet to read it")
    if version < SCHEMA_VERSION and isinstance(doc.get("data"), dict):  # older records named other keys too
        data = dict(doc["data"])
        legacy = {k: data.pop(k) for k in list(data) if k not in RecordData.model_fields}
        doc = {**doc, "data": {**data, **({"legacy": legacy} if legacy else {})}}
    try:
        return RunRecord.model_validate({**doc, "schema_version": version})
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        raise RecordError(f"{origin}: {'.'.join(map(str, e['loc']))}: {e['msg']}") from None


@dataclass
class Record:
    run_id: str
    playbook: str
    profile: str
    inventory: str
    command: str
    started: float = field(default_factory=time.time)
    steps: list[dict] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # rendered commands, facts, findings, log facts...
    outcome: str = "running"  # ok | failed | refused | interrupted
    reason: str = ""
    finished: float | None = None
    secret_values: set[str] = field(default_factory=set)
    profile_merged: dict | None = None
    template_hashes: dict[str, str] | None = None
    served: dict | None = None
    forced: bool = False
    restored_from: str | None = None

    def as_dict(self) -> dict:
        """The record as written: checked against the typed model (RunRecord), secrets redacted."""
        d = {"schema_version": SCHEMA_VERSION, "run_id": self.run_id, "playbook": self.playbook,
             "profile": self.profile, "inventory": self.inventory, "command": self.command,
             "started": self.started, "finished": self.finished, "outcome": self.outcome, "reason": self.reason,
             "duration_s": round((self.finished or time.time()) - self.started, 3),
             "steps": self.steps, "data": self.data}
        for key in ("profile_merged", "template_hashes", "served", "restored_from"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.forced:
            d["forced"] = True
        d = json.loads(json.dumps(redact(d, self.secret_values), default=str))
        # a key the model does not declare is a bug in sparkfleet: refused here (tests write records), not kept
        return RunRecord.model_validate(d).model_dump(mode="json", exclude_unset=True)

    def write(self, runs_dir: Path) -> Path:
        """Atomic write: a reader never sees half a record."""
        runs_dir.mkdir(parents=True, exist_ok=True)
        path = runs_dir / f"{self.run_id}.json"
        write_json(path, self.as_dict())
        return path


def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


def load_run(runs_dir: Path, run_id: str) -> RunRecord | None:
    path = runs_dir / f"{run_id}.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except ValueError:
        raise RecordError(f"{path}: not valid JSON") from None
    return read_record(doc, str(path))


def list_runs(runs_dir: Path) -> list[dict]:
    out = []
    for p in sorted(runs_dir.glob("*.json")):
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        out.append({k: d.get(k) for k in ("run_id", "playbook", "profile", "inventory", "outcome", "reason",
                                          "started", "duration_s")})
    return out
