"""`sparkfleet exporter`: Prometheus metrics for the fleet; `sparkfleet dashboards`: Grafana JSON and scrape config."""

from __future__ import annotations

import argparse
import ipaddress
import re
import signal
import sys
import threading
import time
from pathlib import Path

from sparkfleet.cli.common import (
    EXIT_OK,
    add_inventory,
    add_json,
    add_root,
    err,
    fleet_inventory,
    out,
    print_json,
    spec,
)
from sparkfleet.spec.errors import UserError

ORDER = 45
DEFAULT_LISTEN = "127.0.0.1:9810"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}

EXPORTER_EPILOG = """examples:
  sparkfleet exporter                              # every node of inventory lab, on http://127.0.0.1:9810/metrics
  sparkfleet exporter --profile dcp2 --interval 30s
  sparkfleet exporter --inventory sim --once       # one exposition on stdout (cron, node_exporter textfile)
The exporter polls on a background thread; a scrape only reads the cached state and never waits on a node.
earlyoom kills come from `journalctl -u earlyoom` on each node (needs a user allowed to read the system
journal; the simulated lab has no journal and reports 0); --no-journal skips that command."""

DASHBOARDS_EPILOG = """examples:
  sparkfleet dashboards --out grafana-sparkfleet --profile dcp2
  sparkfleet dashboards --out /tmp/sf --inventory sim --profile dcp2 --exporter 127.0.0.1:9810
Writes DIR/dashboards/*.json, DIR/grafana/provisioning/{datasources,dashboards}/sparkfleet.yaml and
DIR/prometheus/prometheus.yml (the exporter job, and with --profile the lane's engine /metrics on the head).
No Bench dashboard yet: no bench metrics are exported."""


def parse_duration(text: str, what: str = "--interval") -> float:
    """'15s', '1m', '500ms', '2h' or plain seconds, > 0."""
    m = _DURATION.match(text)
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"{what} {text!r}: expected a duration like 15s, 1m or 500ms")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT or [V6]:PORT; the host is required (no implicit all-interfaces)."""
    m = re.match(r"^\[([^\]]+)\]:(\d+)$", text) or re.match(r"^([^:\[\]]+):(\d+)$", text)
    if not m:
        raise UserError(f"--listen {text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    host, port = m.group(1), int(m.group(2))
    if not 0 < port < 65536:
        raise UserError(f"--listen {text!r}: port must be 1-65535")
    return host, port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def register(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    e = sub.add_parser("exporter", help="Prometheus metrics for the fleet (nodes, GPUs, earlyoom, lanes, checks)",
                       description="Serve Prometheus metrics about the fleet around the lanes: node reachability, "
                       "memory against earlyoom, GPU clocks and the latch verdict, lane containers, Engram "
                       "sources, check/gate results and run records (docs/metrics.md).",
                       epilog=EXPORTER_EPILOG, formatter_class=fmt)
    add_root(e)
    add_inventory(e)
    e.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where to serve /metrics (default {DEFAULT_LISTEN}: loopback only)")
    e.add_argument("--interval", default="15s", metavar="DURATION", help="poll interval (default 15s)")
    e.add_argument("--timeout", default="20s", metavar="DURATION", help="per node command timeout (default 20s)")
    e.add_argument("--profile", "-p", help="only this lane (default: every lane with containers on the fleet)")
    e.add_argument("--once", action="store_true", help="poll once, print the exposition, exit")
    e.add_argument("--no-journal", action="store_true", help="do not read earlyoom's journal on the nodes")
    e.set_defaults(func=run_exporter)

    d = sub.add_parser("dashboards", help="write Grafana dashboards, provisioning and a Prometheus scrape config",
                       description="Write the Fleet and Lane dashboards (built from the exporter's metric names) "
                       "with Grafana provisioning files and a prometheus.yml for the exporter and the lane's "
                       "engine.", epilog=DASHBOARDS_EPILOG, formatter_class=fmt)
    add_root(d)
    add_inventory(d)
    add_json(d)
    d.add_argument("--out", required=True, metavar="DIR", help="directory to write into (created)")
    d.add_argument("--profile", "-p", help="add this lane's engine /metrics (on its head) to the scrape config")
    d.add_argument("--exporter", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where Prometheus reaches the exporter (default {DEFAULT_LISTEN})")
    d.add_argument("--prometheus-url", default="http://127.0.0.1:9090", metavar="URL",
                   help="Prometheus as Grafana reaches it (default http://127.0.0.1:9090)")
    d.add_argument("--scrape-interval", default="15s", metavar="DURATION",
                   help="scrape interval in prometheus.yml and Grafana's timeInterval (default 15s)")
    d.set_defaults(func=run_dashboards)


def _poller(args: argparse.Namespace):
    from sparkfleet.fleet.connect import transport_for
    from sparkfleet.metrics.poller import Poller
    from sparkfleet.root import state_dir

    sp = spec(args)
    inventory = fleet_inventory(sp, args.inventory)
    interval = parse_duration(args.interval)
    timeout = parse_duration(args.timeout, "--timeout")
    transport = transport_for(list(inventory.nodes.values()))
    state = state_dir()
    try:
        poller = Poller(sp, inventory, transport, interval_s=interval, timeout_s=timeout, profile=args.profile,
                        journal=not args.no_journal, runs_dir=state / "runs", watch_state=state,
                        journal_state=state / "exporter" / f"journal-{inventory.name}.json")
    except BaseException:
        transport.close()
        raise
    return poller, transport


def run_exporter(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, generate_latest

    from sparkfleet.metrics.collector import FleetCollector, MetricsServer, exposition

    host, port = parse_listen(args.listen)
    poller, transport = _poller(args)
    try:
        if args.once:
            poller.poll_once()
            registry = CollectorRegistry()  # our own: no process/GC collectors mixed into the fleet's metrics
            registry.register(FleetCollector(lambda: poller.snapshot, time.time))
            sys.stdout.write(generate_latest(registry).decode())
            return EXIT_OK
        try:
            # serves the snapshot's pre-rendered exposition (the same text the collector gives; see collector.py)
            server = MetricsServer(host, port, lambda: exposition(poller.snapshot, time.time()))
        except OSError as exc:
            raise UserError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from None
        server.start()
        if not _is_loopback(host):
            err.print(f"sparkfleet exporter: listening on {host}, not loopback: anyone who can reach it sees node "
                      "names, lanes and checkpoints", markup=False)
        stop = threading.Event()
        # systemd and `kill` send SIGTERM: end as cleanly as on Ctrl-C
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        err.print(f"sparkfleet exporter: serving http://{args.listen}/metrics; polling {len(poller.nodes)} node(s) "
                  f"of inventory {poller.inventory.name} every {poller.interval_s:g} s", markup=False)
        poller.start()
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            server.shutdown()
            server.server_close()
            poller.stop(timeout_s=poller.timeout_s + 5)
        return EXIT_OK
    finally:
        transport.close()


def run_dashboards(args: argparse.Namespace) -> int:
    from sparkfleet.metrics.provisioning import EngineTarget, write_all
    from sparkfleet.placement import endpoint, place
    from sparkfleet.spec.inventory import DEFAULT_HARDWARE

    parse_listen(args.exporter)
    interval = args.scrape_interval
    parse_duration(interval, "--scrape-interval")
    if not re.match(r"^\d+(ms|s|m|h)$", interval):
        raise UserError(f"--scrape-interval {interval!r}: Prometheus needs an integer and a unit, e.g. 15s")
    sp = spec(args)
    inventory = sp.inventory(args.inventory)
    engines: list[EngineTarget] = []
    notes: list[str] = ["no Bench dashboard: no bench metrics are exported yet"]
    if args.profile:
        loaded = sp.profile(args.profile)
        p = loaded.profile
        if p.abstract:
            raise UserError(f"{args.profile} is a base for other lanes (abstract: true), not a lane")
        head = place(loaded, inventory)[0].node
        from sparkfleet.engines.registry import engine_for

        names = engine_for(p.engine).metrics
        if names is None:
            notes.append(f"{p.name} runs {p.engine}, which exports no /metrics sparkfleet reads, so its engine "
                         "is not added to the scrape config")
        elif p.port is not None:
            if not names.histograms:
                notes.append(f"{p.name} runs {p.engine}: its {names.prefix}* series are scraped; the Lane "
                             "dashboard's requests and token-rate panels read them, its latency panels stay empty")
            engines.append(EngineTarget(p.name, head.name, endpoint(head, p.port).removeprefix("http://")))
            if p.host.startswith("127.") and head.transport != "local":
                notes.append(f"{p.name} listens on {p.host} on {head.name}: Prometheus must run on that node")
    # the clock panel shades the latch band of the inventory's GB10 class (with its overrides)
    gb10 = next((inventory.hardware(nd) for nd in inventory.nodes.values() if nd.hardware == "gb10"), None)
    band = gb10.clock_latch_mhz if gb10 is not None else DEFAULT_HARDWARE["gb10"].clock_latch_mhz
    files = write_all(Path(args.out), exporter=args.exporter, engines=engines, prometheus_url=args.prometheus_url,
                      scrape_interval=interval, latch_band=band)
    if args.json:
        print_json({"files": [str(f) for f in files], "engines": [e.__dict__ for e in engines], "notes": notes})
        return EXIT_OK
    for f in files:
        out.print(str(f), markup=False, highlight=False)
    for note in notes:
        out.print(f"note: {note}", markup=False, highlight=False)
    return EXIT_OK
