"""Each rank's Engram rows: parsed from `Engram DISK mode: layer L rows [start, end)` lines, checked, stored.

A rank's ranges come from its boot log (ENG-13). Ranges that overlap between ranks, a rank
or layer with no range, rows no rank holds, and ranges identical across ranks (the seeds' rank-offset
bug, where every rank read rank 0's rows, FM-03/ENG-12) are reported as findings. Harvested ranges
are stored per checkpoint and TP size under the state dir, where fleet mode finds them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sparkfleet.findings import Finding
from sparkfleet.root import state_dir
from sparkfleet.schema.errors import UserError
from sparkfleet.schema.profile import Profile

LINE = re.compile(r"Engram DISK mode: layer (\d+) rows \[(\d+), (\d+)\)")
# Rank markers vLLM and torchrun put in front of worker lines: "(VllmWorker rank=1 pid=..)", "[rank1]:",
# "rank 2 ...", "TP2" is not one (it is the size, not the rank).
RANK = re.compile(r"\brank[ =:_-]?(\d+)\b", re.IGNORECASE)
SCHEMA = "sparkfleet.engram-ranges/1"

Ranges = dict[int, tuple[int, int]]  # layer -> [start, end)


@dataclass
class Harvest:
    """Every rank's ranges for one checkpoint and TP layout."""

    tp: int | None
    ranks: dict[int, Ranges]
    nodes: dict[int, str] = field(default_factory=dict)
    profile: str | None = None
    repo_dir: str | None = None
    revision: str | None = None
    tensor_pattern: str | None = None
    sources: dict[int, str] = field(default_factory=dict)  # rank -> where its lines came from
    harvested_at: str | None = None

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "profile": self.profile,
                "checkpoint": {"repo_dir": self.repo_dir, "revision": self.revision},
                "tp": self.tp, "tensor_pattern": self.tensor_pattern, "harvested_at": self.harvested_at,
                "ranks": {str(r): {"node": self.nodes.get(r), "source": self.sources.get(r),
                                   "layers": {str(k): list(v) for k, v in sorted(layers.items())}}
                          for r, layers in sorted(self.ranks.items())}}

    @classmethod
    def from_dict(cls, d: dict, where: str) -> Harvest:
        if d.get("schema") != SCHEMA or not isinstance(d.get("ranks"), dict):
            raise UserError(f"{where}: not a harvested Engram ranges file (schema {SCHEMA})")
        ranks: dict[int, Ranges] = {}
        nodes: dict[int, str] = {}
        try:
            for r, entry in d["ranks"].items():
                ranks[int(r)] = {int(k): (int(v[0]), int(v[1])) for k, v in entry["layers"].items()}
                if entry.get("node"):
                    nodes[int(r)] = entry["node"]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise UserError(f"{where}: malformed ranks entry: {exc}") from None
        ck = d.get("checkpoint") or {}
        return cls(tp=d.get("tp"), ranks=ranks, nodes=nodes, profile=d.get("profile"), repo_dir=ck.get("repo_dir"),
                   revision=ck.get("revision"), tensor_pattern=d.get("tensor_pattern"),
                   harvested_at=d.get("harvested_at"))


def _half(r: tuple[int, int]) -> str:
    return f"[{r[0]}, {r[1]})"


def parse_lines(text: str) -> list[tuple[int | None, int, tuple[int, int], int]]:
    """(rank marker or None, layer, (start, end), line number) for every Engram DISK mode line."""
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        m = LINE.search(line)
        if not m:
            continue
        r = RANK.search(line[: m.start()])
        out.append((int(r.group(1)) if r else None, int(m.group(1)), (int(m.group(2)), int(m.group(3))), no))
    return out


def one_rank(text: str, where: str) -> Ranges:
    """One rank's ranges from its log lines; the same layer with two different ranges is an error
    (that is several ranks' logs in one file: harvest them with their ranks instead)."""
    found: Ranges = {}
    for _, layer, rng, no in parse_lines(text):
        start, end = rng
        if start >= end:
            raise UserError(f"{where}:{no}: layer {layer} rows [{start}, {end}) is empty")
        if layer in found and found[layer] != rng:
            raise UserError(f"{where}:{no}: layer {layer} has rows {_half(rng)} here and {_half(found[layer])} "
                            "earlier: these are several ranks' lines; give one rank's log, or harvest them")
        found[layer] = rng
    if not found:
        raise UserError(f"{where}: no 'Engram DISK mode: layer L rows [start, end)' lines")
    return found


def by_rank(text: str, where: str) -> dict[int, Ranges]:
    """Lines of several ranks in one file, each carrying a rank marker ("rank=1", "[rank1]:")."""
    out: dict[int, Ranges] = {}
    for rank, layer, rng, no in parse_lines(text):
        if rank is None:
            raise UserError(f"{where}:{no}: an Engram DISK mode line without a rank marker (rank=N, [rankN]); "
                            "give each rank's log with --from NODE=FILE")
        if rng[0] >= rng[1]:
            raise UserError(f"{where}:{no}: layer {layer} rows {_half(rng)} is empty")
        have = out.setdefault(rank, {})
        if layer in have and have[layer] != rng:
            raise UserError(f"{where}:{no}: rank {rank} layer {layer} has rows {_half(rng)} here and "
                            f"{_half(have[layer])} earlier")
        have[layer] = rng
    if not out:
        raise UserError(f"{where}: no 'Engram DISK mode: layer L rows [start, end)' lines")
    return out


def read_ranges_file(path: Path) -> Harvest | Ranges:
    """A harvested ranges file (JSON), or log lines of one rank."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UserError(f"{path}: not JSON: {exc}") from None
        return Harvest.from_dict(data, str(path))
    return one_rank(text, str(path))


def ranges_for_rank(path: Path, rank: int | None) -> tuple[Ranges, Harvest | None]:
    """The rows one copy needs, from --ranges FILE (and --rank for a harvested file of several ranks)."""
    got = read_ranges_file(path)
    if isinstance(got, Harvest):
        if rank is None:
            if len(got.ranks) != 1:
                raise UserError(f"{path} holds ranks {', '.join(map(str, sorted(got.ranks)))}: pick one with --rank")
            rank = next(iter(got.ranks))
        if rank not in got.ranks:
            raise UserError(f"{path}: no ranges for rank {rank} (ranks: {', '.join(map(str, sorted(got.ranks)))})")
        return got.ranks[rank], got
    return got, None


# -- report -------------------------------------------------------------------------------------------
def _fmt(rng: tuple[int, int]) -> str:
    return f"[{rng[0]:,}, {rng[1]:,})"


def report(ranks: dict[int, Ranges], *, tp: int | None = None, layers: list[int] | None = None,
           nodes: dict[int, str] | None = None, optional: list[int] | None = None) -> list[Finding]:
    """Findings over all ranks' ranges: missing ranks/layers, identical, overlapping, unowned rows.

    `optional` ranks (the profile's engram.nfs_ranks) read NFS anyway: a missing one is a warning."""
    nodes = nodes or {}
    optional = optional or []
    findings: list[Finding] = []
    expect_ranks = list(range(tp)) if tp else sorted(ranks)
    all_layers = sorted(set(layers or []) | {layer for r in ranks.values() for layer in r})
    for r in expect_ranks:
        if r not in ranks:
            findings.append(Finding("engram-ranges", "warn" if r in optional else "fail",
                                    f"rank {r} has no Engram DISK mode lines: its rows are not covered"
                                    + (" (it reads NFS by the profile's engram.nfs_ranks)" if r in optional else ""),
                                    "boot once without local rows and harvest again", node=nodes.get(r)))
            continue
        for layer in all_layers:
            if layer not in ranks[r]:
                findings.append(Finding("engram-ranges", "fail", f"rank {r} has no range for layer {layer}",
                                        "check that rank's boot log for the layer's Engram DISK mode line",
                                        node=nodes.get(r)))
    for layer in all_layers:
        have = {r: ranks[r][layer] for r in sorted(ranks) if layer in ranks[r]}
        if len(have) > 1 and len(set(have.values())) == 1:
            same = _fmt(next(iter(have.values())))
            findings.append(Finding(
                "engram-rank-offset", "fail", f"layer {layer}: every rank ({', '.join(map(str, have))}) has the same "
                f"rows {same}", "the disk reader ignored the rank's row offset (docs/failure-modes.md FM-03; "
                "ENG-12): fix the engine, boot again and harvest again", observed=same))
            continue
        items = sorted(have.items(), key=lambda kv: kv[1])
        bad = False
        for i, (ra, a) in enumerate(items):
            for rb, b in items[i + 1:]:
                if b[0] >= a[1]:
                    break
                bad = True
                if a == b:
                    findings.append(Finding("engram-rank-offset", "fail",
                                            f"layer {layer}: ranks {ra} and {rb} have the same rows {_fmt(a)}",
                                            "one of them ignored its row offset (docs/failure-modes.md FM-03)"))
                else:
                    findings.append(Finding("engram-ranges", "fail",
                                            f"layer {layer}: ranks {ra} {_fmt(a)} and {rb} {_fmt(b)} overlap "
                                            f"on rows {_fmt((max(a[0], b[0]), min(a[1], b[1])))}",
                                            "each rank owns its own rows; harvest from one boot of one layout"))
        if bad or not items:
            continue
        edge = 0
        for r, (start, end) in items:
            if start > edge:
                findings.append(Finding("engram-ranges", "warn", f"layer {layer}: rows {_fmt((edge, start))} "
                                        f"belong to no rank (before rank {r})",
                                        "expected when the table is not split evenly; else harvest again"))
            edge = max(edge, end)
        if len(items) == len(expect_ranks):
            findings.append(Finding("engram-ranges", "ok", f"layer {layer}: {len(items)} ranks, rows "
                                    + ", ".join(f"r{r} {_fmt(v)}" for r, v in items)))
    return findings


# -- storage ------------------------------------------------------------------------------------------
def _key(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def store_path(profile: Profile) -> Path:
    """Where the harvested ranges of this lane's checkpoint and TP size live."""
    model = profile.model
    if model is None:
        raise UserError(f"profile {profile.name!r} has no model: cannot key its Engram ranges")
    return state_dir() / "engram-ranges" / f"{_key(model.revision or model.repo_dir)}-tp{profile.tp}.json"


def save(h: Harvest, path: Path) -> None:
    h.harvested_at = h.harvested_at or datetime.now(UTC).isoformat(timespec="seconds")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(h.as_dict(), indent=1) + "\n")
    tmp.replace(path)


def load_for(profile: Profile, explicit: Path | None = None) -> tuple[Harvest, Path]:
    """The lane's harvested ranges: --ranges FILE, else the stored harvest for its checkpoint and TP."""
    path = explicit or store_path(profile)
    if not path.is_file():
        raise UserError(f"no harvested Engram ranges for {profile.name} ({path}): run "
                        f"`sparkfleet engram-local harvest --profile {profile.name}` after a boot without local "
                        "rows, or pass --ranges FILE")
    got = read_ranges_file(path)
    if not isinstance(got, Harvest):
        raise UserError(f"{path}: fleet mode needs every rank's ranges: a harvested file "
                        "(`sparkfleet engram-local harvest`), not one rank's lines")
    if got.tp is not None and got.tp != profile.tp:
        raise UserError(f"{path}: ranges harvested at TP{got.tp}, the lane runs TP{profile.tp} "
                        "(TP3 needs its own ranges, ENG-20)")
    return got, path


def stored(profile: Profile) -> Harvest | None:
    """The lane's stored harvest when there is one for its checkpoint and TP size (`up`, the exporter);
    None when none was harvested. A file that is there but unreadable is a UserError naming it."""
    if profile.model is None:
        return None
    path = store_path(profile)
    return load_for(profile, path)[0] if path.is_file() else None
