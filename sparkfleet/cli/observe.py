"""`status`, `logs`, `runs`: what runs where, what it says, and what earlier runs did."""

from __future__ import annotations

import argparse
import json
import sys
import time

from sparkfleet.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_inventory,
    add_json,
    add_root,
    add_wide,
    err,
    fleet_inventory,
    out,
    print_json,
    spec,
)
from sparkfleet.naming import PROFILE_LABEL as LABEL
from sparkfleet.naming import RANK_LABEL, RUN_LABEL, slurm_job_name
from sparkfleet.schema.errors import UserError
from sparkfleet.slurm.ops import jobs_now as slurm_jobs_now

ORDER = 14


def register(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    s = sub.add_parser("status", help="per node: lane, rank, container state, uptime; the endpoint's health",
                       formatter_class=fmt, description="What sparkfleet's lanes are doing on the fleet.",
                       epilog="examples:\n  sparkfleet status\n  sparkfleet status --inventory sim --json\n"
                       "  sparkfleet status --profile tf1017 --endpoint http://127.0.0.1:8001")
    add_root(s)
    add_inventory(s)
    add_json(s)
    add_wide(s)
    s.add_argument("--profile", "-p", help="only this lane")
    s.add_argument("--endpoint", metavar="URL",
                   help="the lane's API base URL if not the default (http://HEAD:PORT, or an SSH tunnel to a head "
                   "that binds 127.0.0.1); needs --profile")
    s.add_argument("--limit", metavar="NODE[,NODE]", help="only these nodes")
    s.set_defaults(func=run_status)

    lg = sub.add_parser("logs", help="a lane's logs, every rank merged with a node prefix", formatter_class=fmt,
                        epilog="examples:\n  sparkfleet logs --profile dcp2 --tail 50\n"
                        "  sparkfleet logs --profile dcp2 --rank 0 --follow\n"
                        "  sparkfleet logs --profile dcp2 --json | jq -r 'select(.rank == 0) | .line'\n"
                        "  sparkfleet logs --profile dcp2 --job           # launcher: slurm: the job's output file")
    add_root(lg)
    add_inventory(lg)
    lg.add_argument("--json", action="store_true",
                    help='one JSON object per log line, for scripts: {"node", "rank", "container", "line"}')
    lg.add_argument("--profile", "-p", required=True, help="the lane whose containers' logs to print")
    lg.add_argument("--node", metavar="NODE", help="only the ranks on this node")
    lg.add_argument("--rank", type=int, metavar="N", help="only this rank (0 is the head)")
    lg.add_argument("--tail", type=int, default=100, metavar="N",
                    help="last N lines per rank (default 100; 0 = all)")
    lg.add_argument("--since", help="only lines since (docker's --since: 10m, 2026-11-29T10:00:00)")
    lg.add_argument("--follow", "-f", action="store_true",
                    help="keep printing new lines (every second) until Ctrl-C")
    lg.add_argument("--limit", metavar="NODE[,NODE]", help="only these nodes of the lane")
    lg.add_argument("--job", action="store_true",
                    help="launcher: slurm: the output of the lane's newest job instead (every task's lines, srun's "
                    "`N: ` label first; the only log once the job ended), read on its batch host")
    lg.set_defaults(func=run_logs)

    r = sub.add_parser("runs", help="list run records; `runs show ID` prints one", formatter_class=fmt,
                       epilog="examples:\n  sparkfleet runs\n  sparkfleet runs show 20261129-101500-a1b2c3")
    add_json(r)
    add_wide(r)
    r.add_argument("action", nargs="?", choices=["show"],
                   help="show: print one run record (its steps and last log lines)")
    r.add_argument("run_id", nargs="?", help="the run to show (as `sparkfleet runs` lists them)")
    r.set_defaults(func=run_runs)


def _fleet(args: argparse.Namespace):
    from sparkfleet.fleet.connect import transport_for
    from sparkfleet.fleet.gather import gather

    sp = spec(args)
    inv = fleet_inventory(sp, args.inventory)
    nodes = list(inv.nodes.values())
    if getattr(args, "profile", None):
        p = sp.profile(args.profile).profile
        nodes = inv.group_nodes(p.group) if p.group in inv.groups else nodes
    if getattr(args, "limit", None):
        from sparkfleet.cli.lifecycle import limit_nodes

        names = limit_nodes(args, args.profile or f"inventory {inv.name}", [n.name for n in nodes])
        nodes = [n for n in nodes if n.name in names]
    transport = transport_for(nodes)
    return sp, inv, nodes, transport, gather(transport, nodes, {})


UNREACHABLE = "unreachable, may be running"  # a node that could not be asked: its lane's rank may still run


def _ours(facts, ranks: dict[str, tuple[str, int]] | None = None) -> list[dict]:
    """sparkfleet's containers per node; a node that did not answer is a row of its own (with the lane's rank
    placed there, from `ranks`: node -> (profile, rank), when one lane is asked about)."""
    from sparkfleet.fleet.nodefacts import NodeFacts

    rows = []
    for node, f in facts.items():
        if not isinstance(f, NodeFacts):
            lane = (ranks or {}).get(node)
            rows.append({"node": node, "error": f.message or f.error, "state": UNREACHABLE,
                         **({"profile": lane[0], "rank": lane[1]} if lane else {})})
            continue
        for c in (f.docker.containers if f.docker else []):
            if LABEL in c.labels:
                row = {"node": node, "profile": c.labels[LABEL], "rank": int(c.labels.get(RANK_LABEL, -1)),
                       "run": c.labels.get(RUN_LABEL), "container": c.name, "id": c.id, "state": c.state,
                       "started_at": c.started_at, "simulated": f.simulated}
                if c.exit_code is not None:
                    row["exit_code"] = c.exit_code
                rows.append({**row, **rebooted_under(node, f, c, row["profile"], row["rank"])})
    return rows


def rebooted_under(node: str, f, c, profile: str, rank: int) -> dict:
    """A rank its node rebooted under (power lost, a watchdog reset: FM-25): not running, and started before the
    node's boot, both times the node's own (its uptime and clock from one facts run, docker's StartedAt). However it
    ended (dockerd marks a rank it finds dead at boot exited 255), the lane lost it. {} for any other container."""
    from sparkfleet.fleet.ops.docker import docker_time

    booted, started = f.booted_at(), docker_time(c.started_at)
    if c.state == "running" or booted is None or started is None or started >= booted:
        return {}
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(booted))
    return {"rebooted_at": at,
            "note": f"{node} rebooted at {at} (from its uptime), after rank {rank} started at {c.started_at}: the "
                    "lane lost this rank",
            "remedy": f"start the whole lane again: `sparkfleet up --profile {profile}` (a tensor-parallel lane "
                      f"cannot take one rank back; `sparkfleet watch --profile {profile}` restarts it by itself)"}


def _endpoint_status(base: str) -> dict:
    import httpx

    out = {"endpoint": base}
    try:
        with httpx.Client(timeout=3.0) as http:
            out["health"] = http.get(f"{base}/health").status_code
            m = http.get(f"{base}/v1/models")
            out["models"] = [x.get("id") for x in m.json().get("data", [])] if m.status_code == 200 else []
            metrics = http.get(f"{base}/metrics")
            if metrics.status_code == 200:
                out["kv_cache_usage"] = _kv_usage(metrics.text)
    except (httpx.HTTPError, ValueError) as exc:
        out["error"] = type(exc).__name__
    return out


def _kv_usage(text: str) -> float | None:
    # each engine's KV usage gauge, then its older name (vLLM's gpu_cache_usage_perc, REFERENCE.md §1)
    from sparkfleet.metrics.dashboards import engine_series

    for name in engine_series("gauges", "kv_usage", fallback=True):
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                try:
                    return float(line.rsplit(" ", 1)[1])
                except ValueError:
                    return None
    return None


def run_status(args: argparse.Namespace) -> int:
    if args.endpoint and not args.profile:
        raise UserError("--endpoint is one lane's API: name the lane with --profile")
    sp, inv, nodes, transport, facts = _fleet(args)
    rows = [r for r in _ours(facts, _lane_ranks(sp, inv, args.profile))
            if not args.profile or r.get("profile") in (None, args.profile)]
    lanes = {}
    try:
        for r in rows:
            if r.get("rank") == 0 and r.get("state") == "running":
                lanes[r["profile"]] = _lane_status(sp.profile(r["profile"]).profile, inv.nodes[r["node"]],
                                                   transport, args.endpoint)
        if args.endpoint and args.profile not in lanes:  # asked for: probed whatever SSH said
            lanes[args.profile] = _endpoint_status(args.endpoint.rstrip("/"))
    finally:
        transport.close()
    failed = [r for r in rows if "error" in r or "note" in r]  # a node unanswered, or a rank lost to a reboot
    jobs = slurm_jobs_now(inv, args.profile and slurm_job_name(args.profile)) if inv.launcher == "slurm" else []
    slurm = {"slurm_jobs": jobs} if isinstance(jobs, list) else {"slurm_error": jobs}
    bad = failed or isinstance(jobs, str)
    if args.json:
        print_json({"containers": rows, "lanes": lanes, **(slurm if inv.launcher == "slurm" else {})})
        return EXIT_FAIL if bad else EXIT_OK
    print_status(rows, lanes, wide=args.wide)
    if not rows:
        out.print("no sparkfleet containers on these nodes")
    if inv.launcher == "slurm":
        print_jobs(jobs)
    return EXIT_FAIL if bad else EXIT_OK


def print_jobs(jobs: list[dict] | str) -> None:
    """The lanes' Slurm jobs (launcher: slurm), one line each; or why squeue could not say."""
    if isinstance(jobs, str):
        err.print(f"sparkfleet: status: cannot list the Slurm jobs (squeue): {jobs}", markup=False)
        return
    for j in jobs:
        why = f", reason {j['reason']}" if j["state"] == "PENDING" else ""
        out.print(f"slurm job {j['id']} {j['name']} {j['state']} {j['time']} on {j['nodes']}{why} ({j['comment']})",
                  markup=False, highlight=False)
    if not jobs:
        out.print("no Slurm job of sparkfleet's lanes", markup=False)


def _lane_ranks(sp, inv, profile: str | None) -> dict[str, tuple[str, int]]:
    """node -> (profile, rank) for the one lane asked about (none: every lane could be anywhere)."""
    if not profile:
        return {}
    from sparkfleet.placement import place

    try:
        return {r.node.name: (profile, r.rank) for r in place(sp.profile(profile), inv)}
    except UserError:
        return {}


def _lane_status(profile, head, transport, override: str | None) -> dict:
    """The head's API answers (health, models, KV usage), asked where `--endpoint` says, else by the one
    rule every command uses (fleet/connect.py api_base: an SSH tunnel over the head's connection for a
    head bound to its loopback, closed before this returns)."""
    from sparkfleet.fleet.connect import api_base

    if override:
        return _endpoint_status(override.rstrip("/"))
    if profile.port is None:
        return {"endpoint": None, "error": f"profile {profile.name} has no port (pass --endpoint URL)"}
    tunnel: list[str] = []
    with api_base(head, profile.port, profile.host, transport, on_tunnel=tunnel.append) as base:
        st = _endpoint_status(base)
    if tunnel:  # say where the API is, not the tunnel's local port (gone now)
        st.update(endpoint=f"{head.name}:127.0.0.1:{profile.port} (SSH tunnel)", tunnel=tunnel[0])
    return st


def print_status(rows: list[dict], lanes: dict[str, dict], wide: bool = False) -> None:
    """Containers per node as a table that fits the terminal; an unreachable node's reason wraps last."""
    from rich.text import Text

    from sparkfleet.cli.tables import Column, render, say

    sim = any(r.get("simulated") for r in rows)
    cols = [Column(c) for c in ("node", "lane", "rank", "state", "since", "container")]
    errors = any("error" in r or "note" in r for r in rows)
    if errors:
        cols.append(Column("reason", wrap=True))
    table = []
    for r in sorted(rows, key=lambda x: (x.get("profile") or "", x.get("rank", -1))):
        if "error" in r:
            row = [r["node"], r.get("profile", ""), str(r.get("rank", "")), Text(UNREACHABLE, style="red"), "", "",
                   r["error"]]
        else:
            state = r["state"] + (f" ({r['exit_code']})" if "exit_code" in r else "")
            row = [r["node"], r["profile"], str(r["rank"]), Text(state, style="red") if "note" in r else state,
                   r["started_at"] or "", r["container"]]
            row += [f"{r['note']}; {r['remedy']}" if "note" in r else ""] if errors else []
        table.append(row)
    if rows:
        render(cols, table, wide=wide, title="sparkfleet status" + (" [simulation]" if sim else ""))
    for name, st in lanes.items():
        say(f"{name}: {st['endpoint']} health {st.get('health', '-')} models {st.get('models', [])} "
            f"KV usage {st.get('kv_cache_usage')}" + (f" ({st['error']})" if "error" in st else ""))


def run_logs(args: argparse.Namespace) -> int:
    from sparkfleet.engines.logs import shown
    from sparkfleet.fleet.op import run_commands
    from sparkfleet.fleet.ops import Logs, LogTail, NodeError, Op, on
    from sparkfleet.fleet.transport import Result
    from sparkfleet.schema.inventory import Node

    if args.job:
        return _job_logs(args)
    sp, inv, nodes, transport, facts = _fleet(args)

    def read(node: Node, what: str, op: Op) -> Result:
        """One rank's log read, through the executor."""
        return run_commands(transport, [node], on(what, {node.name: op}, 60))[node.name]

    try:
        rows = _ours(facts)
        lost = [r for r in rows if "error" in r and (args.node is None or r["node"] == args.node)]
        for r in lost:  # said first, on stderr: their logs are not in what follows
            err.print(f"sparkfleet: logs: could not reach {r['node']}: {r['error']}", markup=False)
        mine = [r for r in rows if "error" not in r and r.get("profile") == args.profile
                and (args.node is None or r["node"] == args.node) and (args.rank is None or r["rank"] == args.rank)]
        if not mine:
            where = (f"; could not reach {', '.join(r['node'] for r in lost)}, so it may still run there"
                     if lost else "")
            job = (f" (a Slurm lane's containers go with its job: `sparkfleet logs --profile {args.profile} --job` "
                   "prints the job's output)" if inv.launcher == "slurm" else "")
            raise UserError((f"no container of lane {args.profile!r} on the selected nodes that answered{where}"
                             if lost else f"no container of lane {args.profile!r} on the selected nodes") + job)
        # lines as the reader splits them (fleet/ops LogTail, Logs: on `\n` only), so a tqdm bar redrawn
        # with `\r` is one line; people see what a terminal shows of it, scripts (--json) the line itself
        seen: dict[str, int] = {}
        said: dict[str, str] = {}
        first = True
        while True:
            for r in sorted(mine, key=lambda x: x["rank"]):
                node = inv.nodes[r["node"]]
                if first:
                    tail = LogTail(r["id"], args.tail or None, args.since)
                    lines = tail.parse(read(node, "read the rank's log", tail))
                else:  # the follow loop reads as `up` does: the complete lines after those already seen
                    new = Logs(r["id"], seen[r["id"]])
                    got = new.parse(read(node, "read the rank's new log lines", new))
                    if isinstance(got, NodeError):  # said once, not every second
                        lines = [] if said.get(r["id"]) == got.message else [f"(cannot read logs: {got.message})"]
                        said[r["id"]] = got.message
                    else:
                        lines, said[r["id"]] = got, ""
                        seen[r["id"]] += len(got)
                for line in lines:
                    if args.json:
                        sys.stdout.write(json.dumps({"node": r["node"], "rank": r["rank"], "container": r["container"],
                                                     "line": line}) + "\n")
                    else:
                        out.print(f"{r['node']}/r{r['rank']} | {shown(line)}", markup=False, highlight=False)
                if args.json:
                    sys.stdout.flush()
            if not args.follow:
                return EXIT_OK
            if first:  # from now on count every complete line, so only new ones print
                for r in mine:
                    count = Logs(r["id"])
                    got = count.parse(read(inv.nodes[r["node"]], "count the rank's log lines", count))
                    seen[r["id"]] = len(got) if isinstance(got, list) else 0
                first = False
            time.sleep(1.0)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        transport.close()


def _job_logs(args: argparse.Namespace) -> int:
    """`logs --job`: the lane's newest Slurm job's output file, its last --tail lines, then (--follow) what is
    appended, every second, until Ctrl-C (slurm/output.py)."""
    from sparkfleet.fleet.connect import transport_for
    from sparkfleet.fleet.op import query, run_commands
    from sparkfleet.root import state_dir
    from sparkfleet.slurm import output as jo

    picked = [flag for flag, v in (("--node", args.node), ("--rank", args.rank), ("--since", args.since),
                                   ("--limit", args.limit)) if v is not None]
    if picked:
        raise UserError(f"logs --job reads the job's one output file: {', '.join(picked)} select containers "
                        "(leave them out, or leave out --job)")
    sp = spec(args)
    inv = fleet_inventory(sp, args.inventory)
    if inv.launcher != "slurm":
        raise UserError(f"logs --job reads a Slurm job's output: inventory {inv.name!r} has launcher: {inv.launcher}")
    p = sp.profile(args.profile).profile
    name = slurm_job_name(p.name)
    jobs = slurm_jobs_now(inv, name, ended_too=True)
    if isinstance(jobs, str):
        raise UserError(f"logs --job: cannot list the lane's Slurm jobs (squeue): {jobs}")
    jid = jo.newest(jobs)
    job = jo.JobRef(jid, name, "slurm") if jid else jo.from_records(state_dir() / "runs", p.name, inv.name)
    if job is None:
        raise UserError(f"no Slurm job of lane {p.name!r}: Slurm lists none (it forgets an ended job after "
                        f"MinJobAge) and no run record in {state_dir() / 'runs'} names one")
    nodes = inv.group_nodes(p.group) if p.group in inv.groups else list(inv.nodes.values())
    transport = transport_for(nodes)
    try:
        res = run_commands(transport, nodes, query(f"read Slurm job {job.job_id}'s output",
                                                   {n.name: jo.read_command(job.path, args.tail or None)
                                                    for n in nodes}, 60))
        host = next((n for n, r in res.items() if r.ok), None)
        if host is None:
            lost = [f"{n} ({r.message or r.stderr.strip() or 'exit ' + str(r.exit_code)})" for n, r in res.items()
                    if r.exit_code != jo.NO_FILE]
            raise UserError(f"Slurm job {job.job_id}'s output {job.path} is on none of the lane's nodes"
                            + (f"; could not read {', '.join(lost)}" if lost else ""))
        lines, offset = jo.parse_read(res[host].stdout)

        def show(batch: list[str]) -> None:
            for line in batch:
                if args.json:
                    sys.stdout.write(json.dumps({"job": job.job_id, "node": host, "line": line}) + "\n")
                else:
                    out.print(f"job {job.job_id} | {line}", markup=False, highlight=False)
            if args.json:
                sys.stdout.flush()

        err.print(f"sparkfleet: logs: Slurm job {job.job_id} ({'squeue' if job.source == 'slurm' else job.source})"
                  f", {host}:{job.path}", markup=False)
        show(lines)
        while args.follow:
            time.sleep(1.0)
            r = run_commands(transport, [inv.nodes[host]], query(f"read Slurm job {job.job_id}'s new output",
                                                                 {host: jo.new_command(job.path, offset)}, 60))[host]
            if r.ok:
                batch, used = jo.complete(r.stdout)
                offset += used
                show(batch)
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        transport.close()


def run_runs(args: argparse.Namespace) -> int:
    from sparkfleet.root import state_dir
    from sparkfleet.runner.record import list_runs, load_run

    runs_dir = state_dir() / "runs"
    if args.action == "show":
        if not args.run_id:
            raise UserError("runs show needs a run id (see `sparkfleet runs`)")
        rec = load_run(runs_dir, args.run_id)  # the typed record (older schemas read, a newer one refused)
        if rec is None:
            raise UserError(f"no run {args.run_id!r} in {runs_dir}")
        if args.json:
            print_json(rec.model_dump(mode="json", exclude_unset=True))
            return EXIT_OK
        from sparkfleet.cli.tables import Column, render, say

        say(f"run {rec.run_id}: {rec.playbook} {rec.profile} on {rec.inventory}: {rec.outcome}"
            + (f" ({rec.reason})" if rec.reason else "") + f", {rec.duration_s} s")
        render([Column("status"), Column("step"), Column("seconds"), Column("summary", wrap=True)],
               [[st.status, st.step, f"{st.elapsed_s:.2f}", st.summary] for st in rec.steps], wide=args.wide)
        if rec.data.startup is not None:
            out.print(startup_line(rec.data.startup), markup=False)
        for rank, lines in (rec.data.last_log_lines or {}).items():
            out.print(f"  last lines of rank {rank}:", markup=False)
            for line in lines[-10:]:
                out.print(f"    {line}", markup=False)
        return EXIT_OK
    runs = list_runs(runs_dir)
    if args.json:
        print_json(runs)
        return EXIT_OK
    print_runs(runs, wide=args.wide)
    if not runs:
        out.print("no runs recorded yet")
    return EXIT_OK


def startup_line(receipt) -> str:
    """The startup receipt (runner/record.py StartupRecord) as one line: seconds from the head's container start."""
    points = [("port open", receipt.port_open_s), ("/health 200", receipt.health_s), ("ready", receipt.ready_s),
              ("first token", receipt.first_token_s)]
    said = ", ".join(f"{name} {s:.1f} s" if s is not None else f"{name} not reached" for name, s in points)
    why = f" ({receipt.first_token_error})" if receipt.first_token_error else ""
    return f"startup from the head's container start: {said}{why}"


def print_runs(runs: list[dict], wide: bool = False) -> None:
    """One row per run record; the failure reason is the free text that wraps."""
    from sparkfleet.cli.tables import Column, render

    if not runs:
        return
    cols = [Column(c) for c in ("run", "playbook", "profile", "outcome", "seconds")] + [Column("reason", wrap=True)]
    render(cols, [[r["run_id"], r["playbook"], r["profile"], r["outcome"], str(r.get("duration_s") or ""),
                   r.get("reason") or ""] for r in runs], wide=wide)
