"""`sparkfleet engram-local`: node-local, verified sparse copies of each rank's Engram rows.

    sparkfleet engram-local --profile P [--node N] [--whole-shards]     # fleet mode: every rank's node
    sparkfleet engram-local harvest --profile P [--from NODE=FILE ...]   # ranks' rows from their boot logs
    sparkfleet engram-local copy --source CKPT --dest DIR --ranges FILE  # one copy on this machine
    sparkfleet engram-local verify --dest DIR [--source CKPT]            # re-check a copy

`copy` here and on the nodes is the same code (sparkfleet/fleet/nodeside/engram_copy.py).
With --json every command prints JSON lines (progress, then the result as the last line).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from sparkfleet.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_dry_run,
    add_inventory,
    add_json,
    add_root,
    err,
    fleet_inventory,
    out,
    print_findings,
    spec,
)
from sparkfleet.engram import ranges as rng
from sparkfleet.findings import Finding, failed
from sparkfleet.fleet.nodeside import engram_copy as ec
from sparkfleet.schema.errors import UserError

ORDER = 40

EPILOG = """examples:
  sparkfleet engram-local harvest --profile 1017g                  # from each rank's container log
  sparkfleet engram-local harvest --profile 1017g --from asusi=asusi.log --from bluey=bluey.log ...
  sparkfleet engram-local --profile 1017g                          # copy on every rank's node, then check
  sparkfleet engram-local --profile tf1017 --whole-shards --source /nvme/hf/DeepSeek-V4.1-Flash-1017
  sparkfleet engram-local copy --source CKPT --dest /nvme/engram-local/REV --ranges rank1.log \\
      --tensors 'model.layers.{layer}.engram.*'
  sparkfleet engram-local verify --dest /nvme/engram-local/REV --source CKPT
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engram-local", help="node-local, verified sparse copies of each rank's Engram rows",
                       description="Copy each rank's Engram rows to its node's NVMe as sparse files at the "
                       "original offsets, verified, with a manifest; then say which ranks will read NFS. "
                       "Without a subcommand this is fleet mode (--profile).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(p)
    add_inventory(p)
    add_json(p)
    p.add_argument("--profile", "-p", help="lane whose ranks get copies (fleet mode)")
    p.add_argument("--node", help="only this node's rank")
    p.add_argument("--whole-shards", action="store_true",
                   help="copy the lane's engram.shards whole (TensorFold lanes, copy_engram.sh in the seeds)")
    p.add_argument("--ranges", metavar="FILE", help="harvested ranges (default: the stored harvest for the lane)")
    p.add_argument("--tensors", metavar="PATTERN", help="Engram tensor names, a glob with {layer} "
                   "(default: the profile's engram.tensor_pattern)")
    p.add_argument("--source", metavar="DIR", help="checkpoint dir on the nodes (default: the lane's snapshot)")
    p.add_argument("--dest", metavar="DIR", help="copy dir on the nodes (default: <engram_local_dir>/<revision>)")
    p.add_argument("--no-verify", action="store_true", help="skip the read-back verification")
    p.add_argument("--force", action="store_true", help="copy again even when a matching copy exists")
    add_dry_run(p, "print each rank's copy command and request; run none and open no connection")
    p.set_defaults(func=run_fleet)
    s = p.add_subparsers(dest="engram_cmd", metavar="{harvest,copy,verify}", parser_class=type(p))

    def quiet_json(q: argparse.ArgumentParser) -> None:
        # SUPPRESS: a subcommand's default must not undo `engram-local --json copy ...`
        q.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON lines for scripts")

    h = s.add_parser("harvest", help="each rank's rows from its `Engram DISK mode` boot lines",
                     description="Read each rank's `Engram DISK mode: layer L rows [start, end)` lines (from its "
                     "container log, or files), report overlaps, gaps and identical ranges (FM-03), and store "
                     "them for the lane's checkpoint and TP size.",
                     epilog="examples:\n  sparkfleet engram-local harvest --profile 1017g\n"
                     "  sparkfleet engram-local harvest --profile 1017g --from 0=reddie.log --from 1=asusi.log ...\n"
                     "  sparkfleet engram-local harvest --profile 1017g --ranges all-ranks.log",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    h.add_argument("--root", metavar="DIR", default=argparse.SUPPRESS, help="ops directory")
    h.add_argument("--inventory", "-i", metavar="NAME|FILE", default=argparse.SUPPRESS, help="inventory")
    h.add_argument("--profile", "-p", required=True, help="lane whose ranks to harvest")
    quiet_json(h)
    h.add_argument("--from", dest="from_files", action="append", default=[], metavar="NODE=FILE",
                   help="a rank's log lines from a file (NODE is a node name or a rank number); repeat per rank")
    h.add_argument("--ranges", metavar="FILE", default=argparse.SUPPRESS,
                   help="all ranks' lines in one file, each with a rank marker (rank=N, [rankN])")
    h.add_argument("--container", metavar="NAME", help="container whose log to read; {rank} is replaced "
                   "(default: sparkfleet's sf-<profile>-r{rank})")
    h.add_argument("--out", metavar="FILE", help="store here instead of the state dir")
    h.set_defaults(func=run_harvest)

    c = s.add_parser("copy", help="one rank's copy on this machine",
                     description="Copy one rank's Engram rows from a checkpoint dir into DIR: sparse shards of "
                     "the same names and sizes, verified by reading back, resumable, manifest last.",
                     epilog="examples:\n  sparkfleet engram-local copy --source /mnt/models/REPO/snapshots/REV "
                     "--dest /nvme/engram-local/REV \\\n"
                     "      --ranges rank1.log --tensors 'model.layers.{layer}.engram.*'\n"
                     "  sparkfleet engram-local copy --source CKPT --dest DIR --range 1:0:96000000 "
                     "--range 14:0:96000000 --tensors ...\n"
                     "  sparkfleet engram-local copy --source CKPT --dest DIR --whole-shards --shards 47,48",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--source", required=True, metavar="DIR", help="the checkpoint (snapshot) directory")
    c.add_argument("--dest", required=True, metavar="DIR", help="where the copy goes")
    c.add_argument("--ranges", metavar="FILE", default=argparse.SUPPRESS,
                   help="the rank's `Engram DISK mode` lines, or a harvested ranges file (with --rank)")
    c.add_argument("--range", dest="range_args", action="append", default=[], metavar="LAYER:START:END",
                   help="a layer's rows directly; repeat per layer")
    c.add_argument("--rank", type=int, help="which rank of a harvested ranges file")
    c.add_argument("--tp", type=int, help="TP size, recorded in the manifest")
    c.add_argument("--tensors", metavar="PATTERN", default=argparse.SUPPRESS,
                   help="Engram tensor names, a glob with {layer}")
    c.add_argument("--shards", metavar="N,N", default="", help="only these shard numbers (e.g. 47,48)")
    c.add_argument("--layers", metavar="N,N", default="", help="--whole-shards: the Engram layers, for the format")
    c.add_argument("--whole-shards", action="store_true", default=argparse.SUPPRESS,
                   help="copy the --shards whole instead of rows")
    c.add_argument("--revision", help="checkpoint revision (default: from a .../snapshots/<rev> path)")
    c.add_argument("--no-verify", action="store_true", default=argparse.SUPPRESS, help="skip the read-back")
    c.add_argument("--force", action="store_true", default=argparse.SUPPRESS, help="copy again from scratch")
    c.add_argument("--chunk-mb", type=float, default=ec.DEFAULT_CHUNK / ec.MiB, help="chunk size (default 4)")
    quiet_json(c)
    c.set_defaults(func=run_copy)

    v = s.add_parser("verify", help="re-check a copy against its manifest (and the source)",
                     description="Read every chunk of a copy back from disk and compare it with the manifest's "
                     "hashes (and with the source when given); names the first bad row of each tensor.",
                     epilog="example:\n  sparkfleet engram-local verify --dest /nvme/engram-local/REV --source CKPT",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("--dest", required=True, metavar="DIR")
    v.add_argument("--source", metavar="DIR", default=argparse.SUPPRESS, help="compare with the checkpoint too")
    quiet_json(v)
    v.set_defaults(func=run_verify)


# -- output -------------------------------------------------------------------------------------------
def _line(data: dict) -> None:
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


class Bars:
    """Progress: JSON lines for the controller (--json), else one rich bar per copy for people."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.tasks: dict[str, TaskID] = {}
        self.progress = None if as_json else Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
            TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=False)

    def __enter__(self) -> Bars:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, key: str, label: str, event: dict, extra: dict | None = None) -> None:
        if self.as_json:
            _line({**(extra or {}), **event})
            return
        assert self.progress is not None
        total = event.get("bytes_total")
        done = event.get("bytes_done")
        if event.get("event") in ("done", "verify"):
            done = total
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(label, total=total or None, completed=done or 0)
        elif total is not None:
            self.progress.update(self.tasks[key], total=total, completed=done or 0)


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / ec.MiB:,.1f} MiB"


def _engram_error(exc: ec.EngramError) -> int:
    """Bad input: one line, exit 2 (UserError); a fault during the copy: one line, exit 1."""
    if exc.code == 2:
        raise UserError(str(exc)) from None
    err.print(f"sparkfleet: {exc}", markup=False)
    return EXIT_FAIL


# -- copy / verify on this machine ------------------------------------------------------------------
def run_copy(args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    whole = getattr(args, "whole_shards", False)
    ranges: rng.Ranges = {}
    harvest = None
    rank = args.rank
    if getattr(args, "ranges", None):
        ranges, harvest = rng.ranges_for_rank(Path(args.ranges), rank)
        if harvest is not None and rank is None:
            rank = next(iter(harvest.ranks))
    try:
        for text in args.range_args:
            layer, pair = ec.parse_range(text)
            ranges[layer] = pair
        request = {
            "op": "copy", "source": args.source, "dest": args.dest,
            "ranges": {str(k): list(v) for k, v in ranges.items()},
            "tensors": getattr(args, "tensors", None) or (harvest.tensor_pattern if harvest else None),
            "shards": ec.number_list(args.shards, "--shards"), "layers": ec.number_list(args.layers, "--layers"),
            "whole_shards": whole, "revision": args.revision,
            "tp": args.tp or (harvest.tp if harvest else None), "rank": rank,
            "verify": not getattr(args, "no_verify", False), "force": getattr(args, "force", False),
            "chunk_bytes": int(args.chunk_mb * ec.MiB),
            "window_bytes": max(ec.DEFAULT_WINDOW, int(args.chunk_mb * ec.MiB)),
        }
        if not whole and not ranges:
            raise UserError("give the rank's rows: --ranges FILE (its `Engram DISK mode` lines or a harvested "
                            "file) or --range LAYER:START:END per layer")
        with Bars(as_json) as bars:
            summary = ec.handle(request, progress=lambda e: bars.update("copy", f"copy → {args.dest}", e))
    except ec.EngramError as exc:
        if as_json:
            _line({"event": "error", "message": str(exc), "code": exc.code})
        return _engram_error(exc)
    if not as_json:
        if summary["already_complete"]:
            out.print(f"already complete: {summary['manifest']} matches this source and these ranges "
                      "(--force copies again)", markup=False)
        else:
            rate = f", {summary['rate_mb_s']} MiB/s" if summary.get("rate_mb_s") else ""
            out.print(f"copied {_mib(summary['bytes_copied'])} in {summary['chunks_copied']} chunks "
                      f"({summary['chunks_skipped']} already done{rate}), "
                      f"{'verified' if summary['verified'] else 'NOT verified'}, format {summary['format']}; "
                      f"manifest {summary['manifest']}", markup=False)
    return EXIT_OK


def run_verify(args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    source = getattr(args, "source", None)
    try:
        with Bars(as_json) as bars:
            result = ec.verify(args.dest, source, progress=lambda e: bars.update("verify", f"verify {args.dest}", e))
    except ec.EngramError as exc:
        if as_json:
            _line({"event": "error", "message": str(exc), "code": exc.code})
        return _engram_error(exc)
    if not as_json:
        print_verify(result)
    return EXIT_OK if result["ok"] else EXIT_FAIL


def print_verify(result: dict) -> None:
    if result["ok"]:
        out.print(f"ok: {_mib(result['bytes_checked'])} of {result['dest']} match the manifest"
                  + (" and the source" if result.get("source") else ""), markup=False)
        return
    for p in result["problems"]:
        where = p.get("tensor") or "(file)"
        if p.get("row") is not None:
            where += f" row {p['row']}"
        elif p.get("rows"):
            where += f" rows [{p['rows'][0]}, {p['rows'][1]})"
        at = f" at byte {p['offset']}" if p.get("offset") is not None else ""
        out.print(f"BAD  {p['file']}: {where}{at}: {p['problem']}", markup=False)


# -- harvest --------------------------------------------------------------------------------------------
def _rank_of(key: str, ranks: list) -> int:
    if key.isdigit():
        if int(key) not in {r.rank for r in ranks}:
            raise UserError(f"--from {key}=...: the lane has ranks {', '.join(str(r.rank) for r in ranks)}")
        return int(key)
    for r in ranks:
        if r.node.name == key:
            return r.rank
    raise UserError(f"--from {key}=...: {key!r} is neither a rank nor a node of the lane "
                    f"({', '.join(f'{r.rank} {r.node.name}' for r in ranks)})")


def _lane(args: argparse.Namespace) -> tuple[Any, Any, list]:
    from sparkfleet.placement import place

    sp = spec(args)
    loaded = sp.profile(args.profile)
    inventory = fleet_inventory(sp, getattr(args, "inventory", None))
    if loaded.profile.abstract:
        raise UserError(f"{args.profile} is a base for other lanes (abstract: true), not a lane")
    return loaded, inventory, place(loaded, inventory)


def _logs(profile: Any, ranks: list, container: str | None) -> tuple[dict[int, str], list[Finding]]:
    """Each rank's Engram DISK mode lines from its container's log on its node."""
    from sparkfleet.engines.base import container_name
    from sparkfleet.fleet.connect import transport_for
    from sparkfleet.fleet.op import run_commands
    from sparkfleet.fleet.ops import EngramLines, on

    transport = transport_for([r.node for r in ranks])
    texts: dict[int, str] = {}
    findings: list[Finding] = []

    def name(r: Any) -> str:
        return container.replace("{rank}", str(r.rank)) if container else container_name(profile, r.rank)

    lines = {r.node.name: EngramLines(name(r)) for r in ranks}
    try:
        results = run_commands(transport, [r.node for r in ranks], on("read each rank's Engram lines", lines, 60.0))
        for r in ranks:
            result = results[r.node.name]
            if result.ok:
                texts[r.rank] = result.stdout
            else:
                findings.append(Finding("engram-ranges", "fail", f"rank {r.rank}: cannot read its log: "
                                        f"{result.message}", "check the node, or give --from NODE=FILE",
                                        node=r.node.name))
    finally:
        transport.close()
    return texts, findings


def run_harvest(args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    loaded, _, ranks = _lane(args)
    profile = loaded.profile
    e = profile.engram
    nodes = {r.rank: r.node.name for r in ranks}
    per_rank: dict[int, rng.Ranges] = {}
    sources: dict[int, str] = {}
    findings: list[Finding] = []
    if getattr(args, "ranges", None):
        path = Path(args.ranges)
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            raise UserError(f"--ranges {path}: cannot read: {exc.strerror or exc}") from None
        got = rng.read_ranges_file(path) if text.lstrip().startswith("{") else None
        per_rank = got.ranks if isinstance(got, rng.Harvest) else rng.by_rank(text, str(path))
        sources = {r: str(path) for r in per_rank}
    elif args.from_files:
        for item in args.from_files:
            key, sep, file = item.partition("=")
            if not sep or not file:
                raise UserError(f"--from {item!r}: expected NODE=FILE")
            rank = _rank_of(key, ranks)
            try:
                text = Path(file).read_text(errors="replace")
            except OSError as exc:
                raise UserError(f"--from {item}: cannot read {file}: {exc.strerror or exc}") from None
            per_rank[rank] = rng.one_rank(text, file)
            sources[rank] = file
    else:
        texts, findings = _logs(profile, ranks, args.container)
        for rank, text in texts.items():
            if rng.LINE.search(text):
                per_rank[rank] = rng.one_rank(text, f"{nodes[rank]}:docker logs")
                sources[rank] = f"{nodes[rank]}:docker logs"
    findings += rng.report(per_rank, tp=profile.tp, layers=e.layers if e else None, nodes=nodes,
                           optional=e.nfs_ranks if e else None)
    model = profile.model
    harvest = rng.Harvest(tp=profile.tp, ranks=per_rank, nodes={r: nodes[r] for r in per_rank},
                          profile=profile.name, repo_dir=model.repo_dir if model else None,
                          revision=model.revision if model else None,
                          tensor_pattern=e.tensor_pattern if e else None, sources=sources)
    stored = None
    if not failed(findings):
        stored = Path(args.out) if args.out else rng.store_path(profile)
        rng.save(harvest, stored)
    if as_json:
        _line({"event": "harvest", **harvest.as_dict(), "stored": str(stored) if stored else None,
               "findings": [f.as_dict() for f in findings]})
        return EXIT_OK if stored else EXIT_FAIL
    from sparkfleet.cli.tables import Column, render

    rows = [[str(rank), nodes.get(rank, "?"), str(layer), f"[{start:,}, {end:,})", f"{end - start:,}",
             sources.get(rank, "")]
            for rank in sorted(per_rank) for layer, (start, end) in sorted(per_rank[rank].items())]
    render([Column(c) for c in ("rank", "node", "layer", "rows", "count")] + [Column("from", wrap=True)], rows,
           title=f"Engram rows of {profile.name} (TP{profile.tp})")
    print_findings(findings)
    if stored:
        out.print(f"stored {stored}", markup=False)
        return EXIT_OK
    err.print("sparkfleet: ranges not stored: fix the failures above and harvest again", markup=False)
    return EXIT_FAIL


# -- fleet mode -------------------------------------------------------------------------------------------
def run_fleet(args: argparse.Namespace) -> int:
    if getattr(args, "engram_cmd", None) is None and not args.profile:
        raise UserError("engram-local: give --profile LANE (fleet mode) or a subcommand: harvest, copy, verify")
    from sparkfleet.engram import fleet
    from sparkfleet.fleet.connect import transport_for

    as_json = args.json
    loaded, _, ranks = _lane(args)
    profile = loaded.profile
    harvest = None
    if not args.whole_shards:
        harvest, _ = rng.load_for(profile, Path(args.ranges) if args.ranges else None)
    e = profile.engram
    pattern = args.tensors or (e.tensor_pattern if e else None) or (harvest.tensor_pattern if harvest else None)
    jobs, findings = fleet.plan_jobs(profile, ranks, harvest=harvest, pattern=pattern, whole_shards=args.whole_shards,
                                     verify=not args.no_verify, node=args.node, source=args.source, dest=args.dest,
                                     force=args.force)
    results: dict = {}
    answers: dict = {}
    if getattr(args, "dry_run", None):  # the copies change the nodes: shown, never run (also with =facts)
        from sparkfleet.cli.common import executor

        ex = executor(args, [j.node for j in jobs])
        try:
            ex.drive(fleet.copy_ops(jobs))
        finally:
            ex.transport.close()
        if not as_json:
            for f in findings:
                out.print(f"{f.status}: {f.message}", markup=False, soft_wrap=True)
        return EXIT_OK
    if jobs:
        transport = transport_for([j.node for j in jobs])
        try:
            with Bars(as_json) as bars:
                results = fleet.run_copies(transport, jobs, on_progress=lambda j, ev: bars.update(
                    j.node.name, f"rank {j.rank} {j.node.name}", ev, {"node": j.node.name, "rank": j.rank}))
            answers = fleet.statuses(transport, jobs)
        finally:
            transport.close()
    copies = []
    for j in jobs:
        result, event = results[j.rank]
        row = {"rank": j.rank, "node": j.node.name, "source": j.source, "dest": j.dest, "ok": result.ok,
               "result": event if event and event.get("event") == "done" else None,
               "error": None if result.ok else ((event or {}).get("message") or result.message)}
        copies.append(row)
        if not result.ok:
            findings.append(Finding("engram-copy", "fail", f"rank {j.rank} ({j.node.name}): the copy failed: "
                                    f"{row['error']}", "fix the cause and run again: the copy resumes",
                                    node=j.node.name, where=j.dest))
    findings += fleet.check(profile, jobs, answers, args.whole_shards, harvest) if jobs else []
    nfs = sorted({r.rank for r in ranks if (args.node is None or r.node.name == args.node)}
                 - {j.rank for j in jobs if not any(f.status == "fail" and f.node == j.node.name for f in findings)})
    if as_json:
        _line({"event": "summary", "profile": profile.name, "copies": copies,
               "findings": [f.as_dict() for f in findings], "nfs_ranks": nfs})
        return EXIT_FAIL if failed(findings) else EXIT_OK
    from rich.text import Text

    from sparkfleet.cli.tables import Column, render

    rows = []
    for c in copies:
        ev = c["result"] or {}
        outcome = (Text("failed", style="red") if not c["ok"] else "already complete" if ev.get("already_complete")
                   else "resumed" if ev.get("chunks_skipped") else "copied")
        rate = f"{ev['rate_mb_s']} MiB/s" if ev.get("rate_mb_s") else ""
        rows.append([str(c["rank"]), c["node"], outcome, _mib(ev.get("bytes_copied")) if ev else "-", rate, c["dest"]])
    render([Column(c) for c in ("rank", "node", "outcome", "copied", "rate")] + [Column("dest", wrap=True)], rows,
           title=f"engram-local {profile.name}")
    print_findings(findings)
    if nfs:
        out.print(f"[yellow]ranks reading Engram rows over NFS at launch:[/] {', '.join(map(str, nfs))}")
    else:
        out.print("[green]every rank reads node-local Engram rows[/]")
    return EXIT_FAIL if failed(findings) else EXIT_OK
