"""`sparkfleet facts`: what each node reports (memory, GPU, earlyoom, containers, RDMA, storage)."""

from __future__ import annotations

import argparse

from sparkfleet.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_inventory,
    add_json,
    add_root,
    fleet_inventory,
    out,
    print_json,
    spec,
)
from sparkfleet.cli.tables import WHOLE_UP_TO
from sparkfleet.fleet.gather import facts_requests, gather, model_dir, plan_for, resolve_gid_indexes
from sparkfleet.fleet.nodefacts import NodeFacts, PathInfo
from sparkfleet.fleet.transport import Result
from sparkfleet.naming import PROFILE_LABEL, RANK_LABEL
from sparkfleet.schema.errors import UserError

ORDER = 20

# NVML clock-event reason bits (REFERENCE.md §4), for people reading the mask
REASONS = {0x1: "GpuIdle", 0x2: "ApplicationsClocksSetting", 0x4: "SwPowerCap", 0x8: "HwSlowdown",
           0x10: "SyncBoost", 0x20: "SwThermalSlowdown", 0x40: "HwThermalSlowdown",
           0x80: "HwPowerBrakeSlowdown", 0x100: "DisplayClockSetting"}

EPILOG = """examples:
  sparkfleet facts --profile dcp2            # the lane's nodes, with its model/Engram/cache dirs and -v sources
  sparkfleet facts --node reddie --node asusi
  sparkfleet facts --json | jq '.reddie.meminfo'"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("facts", help="gather node facts: memory, GPU, earlyoom, containers, RDMA, storage",
                       description="Run the node-side facts helper on each node (one round trip per node, in "
                       "parallel; the helper is shipped by sha256 only where missing or changed) and show "
                       "what every node reports. Without --profile or --node: every node of the inventory.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_root(p)
    add_inventory(p)
    add_json(p)
    p.add_argument("--profile", "-p", help="the lane whose nodes (and dirs, and bind-mount sources) to look at")
    p.add_argument("--node", "-n", action="extend", nargs="+", default=[], metavar="NODE",
                   help="a node to look at (repeatable; also NODE,NODE)")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S", help="per node (default: 30)")
    p.add_argument("--wide", "-w", action="store_true",
                   help=f"every node's facts however many nodes are asked (default: past {WHOLE_UP_TO} nodes not "
                   "named with --node, only the nodes that failed and the summary)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sp = spec(args)
    inventory = fleet_inventory(sp, args.inventory)
    names = [n for arg in args.node for n in arg.split(",") if n]
    plan = profile = None
    if args.profile:
        loaded = sp.profile(args.profile)
        if loaded.profile.abstract:
            raise UserError(f"{args.profile} is a base for other lanes (abstract: true), not a lane; "
                            f"see `sparkfleet profiles`")
        profile = loaded.profile
        plan = plan_for(loaded, inventory, sp.root)
    elif not names:
        names = list(inventory.nodes)
    requests = facts_requests(inventory, plan, profile, names)
    nodes = [inventory.nodes[n] for n in requests]
    from sparkfleet.fleet.connect import transport_for  # the transports are optional until used

    transport = transport_for(nodes)
    try:
        results = gather(transport, nodes, requests, timeout_s=args.timeout)
    finally:
        transport.close()
    failed = [n for n, r in results.items() if not isinstance(r, NodeFacts)]
    if args.json:
        print_json({n: (r.model_dump(mode="json") if isinstance(r, NodeFacts) else _error_dict(r))
                    for n, r in results.items()})
        return EXIT_FAIL if failed else EXIT_OK
    gids = resolve_gid_indexes(nodes, results)
    # a block per node reads well for a few nodes; at a fleet's size the failures would hide among them
    blocks = args.wide or bool(args.node) or len(nodes) <= WHOLE_UP_TO
    for node in nodes:
        r = results[node.name]
        if isinstance(r, NodeFacts):
            if blocks:
                mdir = model_dir(profile, node) if profile is not None else None
                _print_node(r, mdir, gids.get(node.name) if node.rdma else None)
                out.print()
        else:
            out.print(f"[bold]{escape(node.name)}[/]  [bold red]FAILED[/] {escape(r.message or r.error or 'failed')}")
            if blocks:
                out.print()
    answered = len(results) - len(failed)
    summary = f"{answered} of {len(results)} node(s) answered"
    if not blocks:
        out.print(f"(each node's facts: --wide, or --json; {WHOLE_UP_TO} nodes or fewer show them by default)",
                  markup=False, highlight=False)
    if failed:
        out.print(f"[bold red]{summary}[/]; failed: {escape(', '.join(failed))}")
        return EXIT_FAIL
    out.print(summary)
    return EXIT_OK


def escape(text: str) -> str:
    """rich's markup escape, imported only when a table is printed (--json needs no rich)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _error_dict(r: Result) -> dict:
    return {"ok": False, "error": r.error, "message": r.message, "exit_code": r.exit_code,
            "stderr": r.stderr[-2000:]}


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def reasons(mask: int | None) -> str:
    if mask is None:
        return "reasons ?"
    names = [name for bit, name in REASONS.items() if mask & bit]
    return f"reasons {mask:#x}" + (f" ({', '.join(names)})" if names else " (none)")


def _line(label: str, text: str) -> None:
    out.print(f"  {label:<9} " + text, markup=False, highlight=False)


def _print_node(f: NodeFacts, mdir: str | None, gid: int | None) -> None:
    sim = " [magenta]\\[sim][/]" if f.simulated else ""
    up = f", up {f.uptime_s / 3600:.1f} h" if f.uptime_s is not None else ""
    out.print(f"[bold]{escape(f.node)}[/]{sim}  host {escape(f.hostname)}{up}, helper {escape(f.helper_version)}")
    m = f.meminfo
    if m:
        swap = f", swap {gib(m.swap_free_bytes)} free of {gib(m.swap_total_bytes)}" if m.swap_total_bytes else ""
        _line("memory", f"{gib(m.mem_available_bytes)} available of {gib(m.mem_total_bytes)}{swap}")
    for g in f.gpus:
        clocks = f"SM {g.sm_clock_mhz if g.sm_clock_mhz is not None else '?'}/" \
                 f"{g.max_sm_clock_mhz if g.max_sm_clock_mhz is not None else '?'} MHz"
        power = f", {g.power_draw_w:.1f} W" if g.power_draw_w is not None else ""
        _line(f"gpu {g.index}", f"{g.name} {g.pstate or ''}, {clocks}, {reasons(g.clock_event_reasons)}{power}")
    e = f.earlyoom
    if e:
        state = f"running (pid {e.pid})" if e.running else "NOT running"
        pct = f"{e.mem_term_percent:g}%" if e.mem_term_percent is not None else "?"
        _line("earlyoom", f"{state}, SIGTERM at MemAvailable <= {pct} = {gib(e.sigterm_threshold_bytes)}"
              + (f"; argv {' '.join(e.argv[1:])}" if e.argv[1:] else "")
              + (f"; EARLYOOM_ARGS {e.default_args!r}" if e.default_args is not None else ""))
    d = f.docker
    if d and not d.available:
        _line("docker", f"unavailable: {d.error}")
    elif d:
        _line("docker", f"{len(d.containers)} container(s), {len(d.images)} image(s)")
        for c in d.containers:
            extra = [c.state]
            if c.host_ports:
                extra.append("ports " + ",".join(map(str, c.host_ports)))
            if c.network_mode:
                extra.append(f"net {c.network_mode}")
            if c.gpus:
                extra.append("gpus")
            if PROFILE_LABEL in c.labels:
                extra.append(f"lane {c.labels[PROFILE_LABEL]} rank {c.labels.get(RANK_LABEL, '?')}")
            _line("", f"  {c.name}: {c.image} ({', '.join(extra)})")
    if f.listening:
        _line("listening", ", ".join(f"{x.port}" + (f" ({x.process})" if x.process else "") for x in f.listening))
    for p in f.rdma:
        v2 = p.roce_v2_ipv4_index
        _line("rdma", f"{p.hca}/{p.port} {p.state or '?'} {p.netdev or '?'}: RoCE v2 IPv4 GID index "
              + (str(v2) if v2 is not None else "none")
              + ("".join(f" ({g.ipv4})" for g in p.gids if g.index == v2 and g.ipv4)))
    if gid is not None:
        _line("gid", f"index {gid} for the fabric interface (NCCL/b12x)")
    for path, info in f.paths.items():
        _line("path", _path_text(path, info, path == mdir))
    shown = {p.mount.target for p in f.paths.values() if p.mount}
    for mount in f.mounts:
        if mount.target not in shown:
            _line("mount", f"{mount.target}: {mount.fstype} {mount.source}")
    for err in f.errors:
        out.print(f"  [yellow]{'error':<9}[/] {escape(err)}", highlight=False)


def _path_text(path: str, info: PathInfo, is_model: bool) -> str:
    what = "(model dir) " if is_model else ""
    if not info.exists:
        state = "MISSING"
    else:
        state = "dir" if info.is_dir else "file"
    mount = f", on {info.mount.fstype} {info.mount.source} at {info.mount.target}" if info.mount else ""
    space = f", {gib(info.free_bytes)} free of {gib(info.total_bytes)}" if info.total_bytes else ""
    return f"{path} {what}{state}{mount}{space}"
