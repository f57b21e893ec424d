"""The exporter and the dashboards against a real Prometheus, on the simulated lab with a serving dcp2 lane.

THE LAB IS A SIMULATION (sparkfleet/sim, sparkfleet/simengine); Prometheus and promtool are real
(Debian's `prometheus`), and so are the exporter process, its HTTP endpoint and the generated scrape
config. Every query of every generated dashboard must return data; faults injected in the sim must
show up in the right series.

This module starts a lane on the sim's fixed ports (8410, 29551): run it alone, not in parallel with
other modules that do the same.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from sparkfleet.cli.main import main
from sparkfleet.fleet.connect import transport_for
from sparkfleet.metrics import dashboards as dash
from sparkfleet.metrics import names as n
from sparkfleet.sim import lab, values
from tests.conftest import REPO, engram_copies
from tests.prom import Prometheus, binary, free_port, promtool
from tests.watchproc import FAST as WATCH_FAST
from tests.watchproc import WatchProc

ENGINE = "http://127.0.0.1:8410"
# Grafana's $__rate_interval is at least 4 scrape intervals; 15 s at a 1 s scrape interval leaves room for
# scrapes delayed on a busy machine while still needing two samples in the window.
RATE_INTERVAL = "15s"


def _traffic(stop: threading.Event) -> None:
    """Requests to the sim engine, so rate() windows hold real TTFT/ITL/acceptance observations."""
    body = {"model": "deepseek-v4.1-flash", "max_tokens": 24,
            "messages": [{"role": "user", "content": "Name three colours."}]}
    with httpx.Client(timeout=10.0) as http:
        while not stop.is_set():
            try:
                http.post(f"{ENGINE}/v1/chat/completions", json=body)
            except httpx.HTTPError:
                pass
            stop.wait(0.3)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    binary("prometheus")  # fail (CI) or skip before building anything
    binary("promtool")
    for port in (8410, 29551):  # say so plainly when another lane (another test run) holds the sim's ports
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is in use: another sim lane is running"
    tmp = tmp_path_factory.mktemp("metrics-prom")
    state = tmp / "state"
    env = {**os.environ, "SPARKFLEET_STATE": str(state), "PYTHONPATH": str(REPO)}
    stop = threading.Event()
    procs: list[subprocess.Popen] = []
    prom: Prometheus | None = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        sim = lab.up("lab")
        try:
            engram_copies(sim)
            # exporter and Prometheus first: their start-up (first poll, first scrape ~6 s) overlaps the lane's boot
            port = free_port()
            log = (tmp / "exporter.log").open("wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "sparkfleet.cli.main", "exporter", "--inventory", "sim", "--profile", "dcp2",
                 "--listen", f"127.0.0.1:{port}", "--interval", "1s"],
                env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            out = tmp / "grafana"
            assert main(["dashboards", "--out", str(out), "--inventory", "sim", "--profile", "dcp2",
                         "--exporter", f"127.0.0.1:{port}", "--scrape-interval", "1s"]) == 0
            # Prometheus runs with the generated scrape jobs as they are
            scrape = yaml.safe_load((out / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]
            (tmp / "prom").mkdir()
            prom = Prometheus(tmp / "prom", scrape).start()
            assert main(["up", "--profile", "dcp2", "--inventory", "sim", "--gates", "models", "--poll", "0.2",
                         "--probe-seconds", "1", "--json"]) == 0
            # a watch of the lane writes its status file (the Watch row's series); two probes, then SIGTERM
            w = WatchProc(["--profile", "dcp2", "--inventory", "sim", *WATCH_FAST], env)
            try:
                w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "an ok probe")
                w.wait_for(lambda e: e["event"] == "watch.probe" and e["ok"], "a second ok probe")
            finally:
                w.stop()
            traffic = threading.Thread(target=_traffic, args=(stop,), daemon=True)
            traffic.start()
            yield {"sim": sim, "prom": prom, "out": out, "port": port, "state": state, "env": env,
                   "exporter": procs[0], "exporter_log": tmp / "exporter.log"}
        finally:
            stop.set()
            if prom is not None:
                prom.close()
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)  # in case a test stopped it
                    p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
            lab.down()  # ends every sim engine: the lane is gone and ports 8410/29551 are free again


def substitute(expr: str, profile: str = ".*", node: str = ".*") -> str:
    """Grafana's substitution for "All" (allValue .*) or one chosen value, and $__rate_interval."""
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$profile", profile).replace("$node", node)


def _all_queries() -> list[tuple[str, str, str]]:
    return [(file, title, expr) for file, d in dash.all_dashboards().items() for title, expr in dash.queries(d)]


def test_every_panel_query_of_every_dashboard_returns_data(fleet) -> None:
    prom: Prometheus = fleet["prom"]
    # the exporter's first poll (helper shipped, every node asked) can take several seconds on a busy machine
    prom.wait_for(f'{n.NODE_UP}{{node="reddie"}}', timeout_s=60)
    # and the poll after the lane's `up` finished has read its run record (a poll can take 10 s under load)
    prom.wait_for(f'{n.RUNS}{{profile="dcp2", playbook="up"}}', timeout_s=60)
    prom.wait_for('vllm:num_requests_running{profile="dcp2"}')
    queries = _all_queries()
    assert len(queries) >= 40
    variants = [(".*", ".*"), ("dcp2", "reddie")]  # "All", and one lane and node picked
    pending = {(file, title, expr, p, nd) for file, title, expr in queries for p, nd in variants}
    deadline = time.monotonic() + 20.0  # rate() needs two scrapes inside the window
    with ThreadPoolExecutor(max_workers=8) as pool:
        while pending and time.monotonic() < deadline:
            items = sorted(pending)
            for item, got in zip(items, pool.map(lambda i: prom.query(substitute(i[2], i[3], i[4])), items), strict=True):
                if got:
                    pending.discard(item)
            if pending:
                time.sleep(0.5)
    if pending:  # say what the exporter serves for the missing names, and how the scrapes went
        targets = [(t["labels"]["job"], t["health"], t["lastError"]) for t in prom.targets()]
        wanted = set().union(*(dash.series_names(e) for _, _, e, _, _ in pending))
        served = httpx.get(f"http://127.0.0.1:{fleet['port']}/metrics", timeout=10).text.splitlines()
        lines = [x for x in served if x.split("{")[0].split(" ")[0] in wanted][:20]
        raise AssertionError(f"targets: {targets}\nexporter serves:\n" + "\n".join(lines) + "\nwithout data:\n"
                             + "\n".join(f"{f} / {t} (profile={p}, node={nd}): {substitute(e, p, nd)}"
                                          for f, t, e, p, nd in sorted(pending)))
    # and the values are real, not NaN everywhere: traffic ran, so the serving panels have numbers
    for expr in ('sum by (profile) (rate(vllm:generation_tokens_total{profile=~".*"}[15s]))',
                 dash.lane()["panels"][-1]["targets"][0]["expr"]):
        vals = [float(r["value"][1]) for r in prom.query(substitute(expr))]
        assert vals and all(math.isfinite(v) for v in vals), (expr, vals)
    (lane_info,) = prom.query(f'{n.LANE_INFO}{{profile="dcp2"}}')
    assert lane_info["metric"]["checkpoint"] == "df42c109f1defefcbfcedbe7d905718a12266e40"
    assert lane_info["metric"]["engine"] == "vllm"
    jobs = {t["labels"]["job"]: t["health"] for t in prom.targets()}
    assert jobs == {"sparkfleet-exporter": "up", "sparkfleet-engine": "up"}


def test_generated_scrape_config_passes_promtool(fleet) -> None:
    r = promtool("check", "config", str(fleet["out"] / "prometheus" / "prometheus.yml"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_exporter_once_exposition_passes_promtool_check_metrics(fleet, capsys) -> None:
    assert main(["exporter", "--inventory", "sim", "--once"]) == 0
    text = capsys.readouterr().out
    for m in (n.NODE_UP, n.MEM_AVAILABLE, n.GPU_LATCHED, n.LANE_INFO, n.LANE_CONTAINER_STATE, n.CHECK_PASSED,
              n.GATE_PASSED, n.ENGRAM_SOURCE, n.RUNS, n.EARLYOOM_KILLS):
        assert f"\n{m.name}{{" in text, m.name
    assert 'sparkfleet_runs_total{outcome="ok",playbook="up",profile="dcp2"} 1.0' in text
    assert 'sparkfleet_gate_passed{gate="models",profile="dcp2"} 1.0' in text
    # a sim node keeps no journal (no /var/log/journal): unreadable, not "no kills"
    assert 'sparkfleet_earlyoom_journal_readable{node="asusi"} 0.0' in text
    assert 'sparkfleet_earlyoom_kills_total{node="asusi",signal="SIGTERM"} 0.0' in text
    lint = promtool("check", "metrics", stdin=text)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _value(prom: Prometheus, expr: str) -> float | None:
    got = prom.query(expr)
    return float(got[0]["value"][1]) if got else None


def _eventually(prom: Prometheus, expr: str, want: float, timeout_s: float = 25.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := _value(prom, expr)) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"{expr} = {got}, expected {want} within {timeout_s:g} s")
        time.sleep(0.5)


def _quiesce(exporter: subprocess.Popen, sandbox: Path, timeout_s: float = 20.0) -> None:
    """Stop the exporter and wait until no command it started runs inside `sandbox`.

    The sim's `unreachable` fault (local mode) moves a node's sandbox away. A command already running
    there when it moves can recreate part of it (the helper guard makes ~/.cache/sparkfleet/bin), and
    the sim cannot heal that; so the fault is injected only while nothing runs on that node.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        # Stop the exporter, then look: a command it started may still be running, and one whose output
        # fills the pipe waits for the (stopped) exporter to read it, so let it run again and retry.
        exporter.send_signal(signal.SIGSTOP)
        time.sleep(0.2)
        busy = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and os.readlink(proc / "cwd").startswith(str(sandbox)):
                    busy.append(proc.name)
            except OSError:
                continue
        if not busy:
            return
        exporter.send_signal(signal.SIGCONT)
        if time.monotonic() > deadline:
            raise AssertionError(f"commands still running in {sandbox}: pids {busy}")
        time.sleep(0.1)


def test_faults_show_up_in_the_right_series(fleet) -> None:
    sim, prom, exporter = fleet["sim"], fleet["prom"], fleet["exporter"]
    inv = sim.inventory()
    # before: every GB10 idle (GpuIdle), with a low idle clock that is NOT a latch
    _eventually(prom, f'{n.GPU_UNDER_LOAD}{{node="asusi"}}', 0.0)
    assert _value(prom, f'{n.GPU_LATCHED}{{node="asusi"}}') == 0.0
    assert _value(prom, f'{n.GPU_SM_CLOCK}{{node="asusi"}}') < 630
    transport = transport_for([inv.nodes["asusi"]])
    try:
        _quiesce(exporter, sim.root("station"))
        try:
            sim.fault("station", "unreachable")
        finally:
            exporter.send_signal(signal.SIGCONT)
        sim.fault("asusi", "clock-latch")
        sim.fault("bluey", "low-memory", gib=40)
        r = transport.run([inv.nodes["asusi"]], "sim-gpu-load --no-wait 60")["asusi"]
        assert r.ok, r.message or r.stderr
        _eventually(prom, f'{n.GPU_LATCHED}{{node="asusi"}}', 1.0)
        assert _value(prom, f'{n.GPU_SM_CLOCK}{{node="asusi"}}') == values.CLOCK_LATCH_MHZ
        assert _value(prom, f'{n.GPU_UNDER_LOAD}{{node="asusi"}}') == 1.0
        assert _value(prom, f'{n.GPU_LATCHED}{{node="reddie"}}') == 0.0  # idle, healthy nodes stay unlatched
        _eventually(prom, f'{n.MEM_AVAILABLE}{{node="bluey"}}', 40.0 * 2**30)
        headroom = _value(prom, f'{n.MEM_AVAILABLE}{{node="bluey"}} - on (node) {n.EARLYOOM_SIGTERM}{{node="bluey"}}')
        assert headroom is not None and headroom < 40.0 * 2**30
        _eventually(prom, f'{n.NODE_UP}{{node="station"}}', 0.0)
        age1 = _value(prom, f'{n.NODE_FACTS_AGE}{{node="station"}}')
        time.sleep(2.0)
        age2 = _value(prom, f'{n.NODE_FACTS_AGE}{{node="station"}}')
        assert age1 is not None and age2 is not None and age2 > age1  # still exported, and growing
        assert prom.query(f'{n.MEM_AVAILABLE}{{node="station"}}') == []  # no stale readings while it is down
        assert _value(prom, f'{n.NODE_UP}{{node="reddie"}}') == 1.0  # one bad node leaves the others alone
        failures = prom.query(f'{n.NODE_POLL_FAILURES}{{node="station"}}')
        assert [r["metric"]["error"] for r in failures] == ["unreachable"]
    finally:
        transport.run([inv.nodes["asusi"]], "sim-gpu-load 0")
        transport.close()
        sim.heal()
    _eventually(prom, f'{n.NODE_UP}{{node="station"}}', 1.0)  # and it comes back


def test_exporter_ends_cleanly_on_sigterm(fleet) -> None:
    exporter = fleet["exporter"]
    exporter.terminate()
    assert exporter.wait(30) == 0
