"""`sparkfleet support-bundle [--run ID]`: one tar.gz with what a maintainer needs to read a failed boot.

It holds the run record, every rank's last log lines (from the record and, unless --no-fleet, from
the lane's containers now), the facts of the lane's nodes, the merged profile (with the run's -o
overrides) and its plan, sparkfleet's, Python's, the libraries' and the nodes' engine versions, and
a manifest (file, bytes, sha256, what it is, what could not be collected). Secrets are redacted
before anything is written: values of env vars named like a key/token/secret/password (from the
profile, the record and this process's environment), the lane's API key, and token-shaped strings
(`hf_...`, `sk-...`, `Bearer ...`) wherever they appear, logs included.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from sparkfleet.cli.common import EXIT_OK, add_inventory, add_json, add_root, fleet_inventory, out, print_json, spec
from sparkfleet.schema.errors import UserError

ORDER = 70
LOG_LINES = 200
TOKEN_SHAPES = [
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"),
    re.compile(r"(?i)(\bBearer\s+)[^\s'\"]+"),
    re.compile(r"(?i)(--api-key[ =])[^\s'\"]+"),
]
LIBRARIES = ("fabric", "paramiko", "pydantic", "pyyaml", "jinja2", "httpx", "rich", "prometheus-client")

EPILOG = """examples:
  sparkfleet support-bundle                       # the newest run, its lane's nodes and containers now
  sparkfleet support-bundle --run 20261201-093000-a1b2c3 --out /tmp/boot.tar.gz
  sparkfleet support-bundle --no-fleet            # only what is on this machine (no node contacted)
Secrets (API keys, HF tokens, env values named like KEY/TOKEN/SECRET/PASSWORD) are redacted; the manifest
says what the bundle holds and what could not be collected."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("support-bundle", help="one tar.gz of a run for a maintainer: record, logs, facts, "
                       "profile, plan, versions (secrets redacted)",
                       description="Collect a run's record, every rank's last log lines, the facts of the lane's "
                       "nodes, the merged profile and plan, and the versions of sparkfleet, its libraries and the "
                       "nodes' engine stack into one tar.gz with a manifest, secrets redacted.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(p)
    add_inventory(p)
    add_json(p)
    p.add_argument("--run", metavar="ID", help="the run (default: the newest; see `sparkfleet runs`)")
    p.add_argument("--out", "-O", metavar="FILE", help="where to write it (default: ./sparkfleet-support-RUN.tar.gz)")
    p.add_argument("--no-fleet", action="store_true", help="contact no node: no live facts or container logs")
    p.add_argument("--tail", type=int, default=LOG_LINES, metavar="N", help=f"log lines per rank (default {LOG_LINES})")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S", help="per node (default 30)")
    p.set_defaults(func=run)


# -- redaction (pure) -----------------------------------------------------------------------------------
def secret_values(*envs: dict[str, Any]) -> set[str]:
    """Values of env entries whose names look secret (4+ characters: shorter ones are not worth a match)."""
    from sparkfleet.redact import SECRET_NAME

    found = set()
    for env in envs:
        for k, v in (env or {}).items():
            if isinstance(k, str) and SECRET_NAME.search(k) and isinstance(v, str) and len(v) >= 4:
                found.add(v)
    return found


def scrub(value: Any, secrets: set[str]) -> Any:
    """runner.record.redact (secret names and values) plus token-shaped strings, deeply."""
    from sparkfleet.redact import REDACTED, redact

    value = redact(value, secrets)
    if isinstance(value, dict):
        return {k: scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, str):
        for shape in TOKEN_SHAPES:
            value = shape.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, value)
    return value


# -- collecting -----------------------------------------------------------------------------------------
def _newest_run(runs_dir: Path) -> str:
    ids = sorted(p.stem for p in runs_dir.glob("*.json"))
    if not ids:
        raise UserError(f"no run records in {runs_dir} (run `sparkfleet up` first, or see `sparkfleet runs`)")
    return ids[-1]


def _versions() -> dict[str, Any]:
    from importlib import metadata

    from sparkfleet import __version__

    libs = {}
    for name in LIBRARIES:
        try:
            libs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            libs[name] = None
    return {"sparkfleet": __version__, "python": sys.version.split()[0], "platform": sys.platform, "libraries": libs}


def collect(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str], set[str]]:
    """The bundle's documents by file name, what could not be collected (by file), and the secrets seen."""
    from sparkfleet.root import state_dir
    from sparkfleet.runner.record import load_run

    runs_dir = state_dir() / "runs"
    run_id = args.run or _newest_run(runs_dir)
    rec = load_run(runs_dir, run_id)  # the typed record (older schemas read, a newer one refused)
    if rec is None:
        raise UserError(f"no run {run_id!r} in {runs_dir} (see `sparkfleet runs`)")
    docs: dict[str, Any] = {"record.json": rec.model_dump(mode="json", exclude_unset=True),
                            "versions.json": _versions()}
    missing: dict[str, str] = {}
    secrets = secret_values(dict(os.environ))
    logs = {f"rank{r}": lines for r, lines in (rec.data.last_log_lines or {}).items()}

    sp = spec(args)
    loaded = None
    try:
        from sparkfleet.schema.overrides import as_mapping, from_mapping

        loaded = sp.profile(rec.profile, from_mapping(rec.data.overrides))
        profile = loaded.profile
        docs["profile.json"] = {"files": loaded.chain, "overrides": as_mapping(loaded.overrides),
                                "profile": profile.model_dump(mode="json")}
        secrets |= secret_values(profile.env)
        if profile.api_key_env and os.environ.get(profile.api_key_env):
            secrets.add(os.environ[profile.api_key_env])
    except Exception as exc:  # noqa: BLE001 - the bundle says why, and holds the rest
        missing["profile.json"] = f"{type(exc).__name__}: {exc}"
    inventory = None
    try:
        inventory = sp.inventory(args.inventory or rec.inventory)
    except Exception as exc:  # noqa: BLE001
        missing["plan.json"] = missing["facts.json"] = f"inventory: {exc}"
    if loaded is not None and inventory is not None:
        from sparkfleet.plan import make_plan

        try:
            plan = make_plan(loaded, inventory, sp.playbook(rec.playbook or "up"), sp.root)
            docs["plan.json"] = plan.as_dict()
        except Exception as exc:  # noqa: BLE001
            missing["plan.json"] = f"{type(exc).__name__}: {exc}"
            plan = None
        if args.no_fleet:
            missing["facts.json"] = "not collected (--no-fleet)"
        elif plan is not None:
            fleet_inventory(sp, args.inventory or rec.inventory)  # the example fleet is never dialled
            docs["facts.json"], live = _fleet(inventory, plan, loaded.profile, args)
            logs.update(live)
    docs["logs.json"] = logs
    return docs, missing, secrets


def _fleet(inventory, plan, profile, args) -> tuple[dict, dict[str, list[str]]]:
    """Facts of the lane's nodes and the last log lines of the lane's containers on them, now."""
    from sparkfleet.cli.observe import _ours
    from sparkfleet.fleet.connect import transport_for
    from sparkfleet.fleet.gather import facts_requests, gather
    from sparkfleet.fleet.nodefacts import NodeFacts
    from sparkfleet.fleet.op import run_commands
    from sparkfleet.fleet.ops import LogTail, on

    nodes = [r.node for r in plan.ranks]
    transport = transport_for(nodes)
    live: dict[str, list[str]] = {}
    try:
        facts = gather(transport, nodes, facts_requests(inventory, plan, profile), timeout_s=args.timeout)
        for c in _ours(facts):
            if c.get("profile") != profile.name or "id" not in c:
                continue
            node = inventory.nodes[c["node"]]
            tail = LogTail(c["id"], args.tail)
            res = run_commands(transport, [node], on("read the rank's log", {node.name: tail}, args.timeout))[node.name]
            live[f"rank{c['rank']}-{c['node']}-now"] = tail.parse(res)
    finally:
        transport.close()
    doc = {n: (f.model_dump(mode="json") if isinstance(f, NodeFacts) else {"error": f.error, "message": f.message})
           for n, f in facts.items()}
    return doc, live


# -- writing --------------------------------------------------------------------------------------------
WHAT = {
    "record.json": "the run record (steps, findings, launches as recorded)",
    "logs.json": "every rank's last log lines: from the record, and `-now` from the containers at bundle time",
    "facts.json": "facts of the lane's nodes at bundle time (memory, GPU, docker, RDMA, storage, versions)",
    "profile.json": "the merged profile (extends applied, with the run's -o overrides)",
    "plan.json": "the plan of that profile on the inventory (argv and env of every launch)",
    "versions.json": "sparkfleet, Python and library versions on this machine",
}


def write_bundle(dest: Path, docs: dict[str, Any], missing: dict[str, str], secrets: set[str],
                 run_id: str) -> dict:
    """Redact every document, write the tar.gz atomically (mode 0600); returns the manifest."""
    files = {}
    for name, doc in docs.items():
        files[name] = (json.dumps(scrub(doc, secrets), indent=1, default=str) + "\n").encode()
    manifest = {"bundle": "sparkfleet support bundle", "run_id": run_id,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "redacted": "secret env values, API keys, tokens",
                "files": [{"name": n, "bytes": len(b), "sha256": hashlib.sha256(b).hexdigest(), "what": WHAT.get(n, "")}
                          for n, b in files.items()],
                "not_collected": missing}
    files["manifest.json"] = (json.dumps(manifest, indent=1) + "\n").encode()
    top = f"sparkfleet-support-{run_id}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for name in ["manifest.json", *sorted(n for n in files if n != "manifest.json")]:
                info = tarfile.TarInfo(f"{top}/{name}")
                info.size, info.mtime, info.mode = len(files[name]), int(time.time()), 0o600
                tar.addfile(info, io.BytesIO(files[name]))
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return manifest


def run(args: argparse.Namespace) -> int:
    docs, missing, secrets = collect(args)
    run_id = docs["record.json"].get("run_id") or args.run
    dest = Path(args.out).expanduser() if args.out else Path.cwd() / f"sparkfleet-support-{run_id}.tar.gz"
    manifest = write_bundle(dest, docs, missing, secrets, run_id)
    if args.json:
        print_json({"bundle": str(dest), **manifest})
        return EXIT_OK
    out.print(f"support bundle for run {run_id}: {dest}", markup=False)
    for f in manifest["files"]:
        out.print(f"  {f['name']:<14} {f['bytes']:>9} bytes  {f['what']}", markup=False)
    for name, why in missing.items():
        out.print(f"  {name:<14} not collected: {why}", markup=False)
    return EXIT_OK
