"""The measured fabric probe: schedule, verdict, and real measurements between network namespaces.

The namespaces are this test's own (tests/netnslab.py, unique names, removed afterwards). Every link
is shaped with tc tbf, as a real fabric's links are alike: 200 Mbit/s healthy, 50 Mbit/s on the slow
node, so the verdict is about the links and not about how busy this machine's CPUs are. Accuracy
against the configured rates is bench/fabric_probe.py's business (64 MB, as `up` probes), not a test's.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
from itertools import combinations
from pathlib import Path

import pytest

from sparkfleet.checks.fabric_probe import suspects, verdict
from sparkfleet.fleet import fabric_measure as fp
from sparkfleet.fleet.fabric_measure import Link, ProbeRun, probe, rounds
from sparkfleet.schema.inventory import Node, Ssh, Storage
from tests import netnslab

HELPER = Path(fp.__file__).resolve().parent / "nodeside" / "fabric_probe.py"
BULK = 2 * 1024 * 1024  # 0.34 s at 50 Mbit/s: enough to see the rate, short enough for the suite
COUNT = 4  # echoes per size
needs_netns = pytest.mark.skipif(not netnslab.available(), reason="network namespaces need root, ip and tc")


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_rounds_cover_every_pair_once_with_disjoint_pairs(n: int) -> None:
    got = rounds(n)
    pairs = [p for r in got for p in r]
    assert sorted(pairs) == list(combinations(range(n), 2))
    for r in got:
        members = [x for p in r for x in p]
        assert len(members) == len(set(members))  # nobody in two measurements at once
    assert len(got) == (n - 1 if n % 2 == 0 else n)


def link(a: str, b: str, bps: float, rtt: float = 1e-3, error: str | None = None) -> Link:
    return Link(a, b, f"10.0.0.{a[-1]}", f"10.0.0.{b[-1]}", 29570, rtt_s={"49152": rtt, "409600": rtt * 4},
                a_to_b_bps=bps, b_to_a_bps=bps, error=error)


def test_verdict_names_the_slow_links_and_the_unreachable_pair() -> None:
    run = ProbeRun([link("n0", "n1", 1e9), link("n0", "n2", 1e8, 8e-3), link("n0", "n3", 1e9),
                    link("n1", "n2", 1e8, 8e-3), link("n1", "n3", 0.9e9), link("n2", "n3", 1e8, 8e-3)],
                   29570, BULK, (49152, 409600))
    found = verdict(run, lambda x: None)
    assert [f.message.split(":")[0] for f in found if f.status == "fail"] == ["n0 <-> n2", "n1 <-> n2", "n2 <-> n3"]
    run.links[1] = link("n0", "n2", 0, error="cannot connect from 10.0.0.0 to 10.0.0.2:29570: Connection refused")
    run.links[1].a_to_b_bps = run.links[1].b_to_a_bps = None
    (f,) = [f for f in verdict(run, lambda x: None) if f.message.startswith("n0 <-> n2")]
    assert f.status == "fail" and "10.0.0.2:29570" in f.message and f.observed == "port 29570"


def test_the_ratio_comes_from_the_class() -> None:
    run = ProbeRun([link("n0", "n1", 1e9), link("n0", "n2", 0.4e9), link("n1", "n2", 1e9)], 29570, BULK, ())
    assert [f.status for f in verdict(run, lambda x: None)] == ["ok", "fail", "ok"]
    assert [f.status for f in verdict(run, lambda x: 3.0)] == ["ok", "ok", "ok"]


def test_one_link_is_shown_not_judged() -> None:
    (f,) = verdict(ProbeRun([link("n0", "n1", 1e9)], 29570, BULK, ()), lambda x: None)
    assert f.status == "ok" and "not judged" in f.message


def _helper_module():
    spec = importlib.util.spec_from_file_location("sparkfleet_nodeside_fabric_probe", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_helper_refuses_a_peer_outside_the_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _helper_module()

    def no_socket(*a, **k):
        raise AssertionError("a socket was opened")

    monkeypatch.setattr(mod.socket, "socket", no_socket)
    doc = mod.drive({"source": "10.0.0.1", "peer": "8.8.8.8", "port": 29570, "allow": ["10.0.0.1", "10.0.0.2"]})
    assert doc["error"] == "refused: 8.8.8.8 is not one of the lane's fabric addresses"


def test_bad_request_exits_2() -> None:
    p = subprocess.run(["python3", str(HELPER)], input='{"mode": "flood"}', capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 2 and p.stdout == "" and "serve, drive or quit" in p.stderr


def test_requests_carry_only_the_lanes_fabric_ips() -> None:
    nodes = [Node(name=n, ssh=Ssh(host="10.10.0.9"), fabric_ip=f"192.168.192.{11 + i}", hardware="gb10",
                  storage=Storage(model_root="/m", cache_dir="/c")) for i, n in enumerate(["n0", "n1", "n2"])]
    allow = [str(n.fabric_ip) for n in nodes]
    for rnd in fp.plan_links(nodes):
        for x in rnd:
            req = fp.drive_request(x, allow, BULK, fp.RTT_SIZES)
            assert {req["source"], req["peer"]} <= set(allow) and req["allow"] == allow
    assert "10.10.0.9" not in json.dumps([fp.serve_request(n, allow, 1, fp.PORT, 60) for n in nodes])


@pytest.fixture
def lab(tmp_path: Path):
    lab = netnslab.NetnsLab(4, tmp_path / "home")
    try:
        for name in lab.names:
            lab.shape(name, "200mbit")
        yield lab
    finally:
        lab.destroy()


def lab_inventory(lab, tmp_path: Path, monkeypatch) -> Path:
    """An inventory of the lab's namespaces (one GB10 node each), and the CLI's transport pointed at the lab."""
    inv = tmp_path / "netns.yaml"
    nodes = "".join(f"  {n}:\n    ssh: {{host: 127.0.0.1}}\n    fabric_ip: {lab.ips[n]}\n    hardware: gb10\n"
                    f"    rdma: {{hcas: [mlx5_0], fabric_iface: {lab.iface}}}\n"
                    "    storage: {model_root: /models, cache_dir: /cache}\n" for n in lab.names)
    inv.write_text(f"name: netns\nnodes:\n{nodes}groups:\n  sparks: [{', '.join(lab.names)}]\n")
    # a module that binds transport_for by name when first imported would keep the lab's for the rest of the
    # session (test_fabric_sim's `up`, next in the suite, failed on it): they are imported before the patch
    for module in ("sparkfleet.runner.run", "sparkfleet.watch.supervisor"):
        importlib.import_module(module)
    monkeypatch.setattr("sparkfleet.fleet.connect.transport_for", lambda ns: lab)
    return inv


def rx_bytes(dev: str) -> int:
    """Bytes the bridge side of a node's veth received: what the node sent into the lab's bridge."""
    return int(Path(f"/sys/class/net/{dev}/statistics/rx_bytes").read_text())


@needs_netns
def test_healthy_then_slow_node_names_exactly_its_links(lab) -> None:
    before = {n: rx_bytes(lab.host_end(n)) for n in lab.names}
    run = probe(lab, lab.ranks, bulk_bytes=BULK, rtt_count=COUNT, confirm=suspects(lambda x: None))
    found = verdict(run, lambda x: None)
    assert [f for f in found if f.status != "ok"] == [], [f.message for f in found]
    assert len(run.links) == 6 and all(x.error is None and x.a_to_b_bps and x.b_to_a_bps for x in run.links)
    assert all(set(x.rtt_s) == {"49152", "409600"} for x in run.links)
    # every node sent its bulk bytes into the lab's own bridge (the host ends of its veth), 3 links each
    for n in lab.names:
        assert rx_bytes(lab.host_end(n)) - before[n] >= 3 * BULK
    assert all(s["bind"] == lab.ips[n] and s["refused"] == [] for n, s in run.servers.items())

    lab.shape("n2", "50mbit")
    run = probe(lab, lab.ranks, bulk_bytes=BULK, rtt_count=COUNT, confirm=suspects(lambda x: None))
    failed = sorted(f.message.split(":")[0] for f in verdict(run, lambda x: None) if f.status == "fail")
    assert failed == ["n0 <-> n2", "n1 <-> n2", "n2 <-> n3"]
    links = {x.name: x for x in run.links}
    assert {x.name for x in run.links if x.remeasured} == set(failed)  # confirmed by a second measurement
    # tbf shapes n2's egress: what n2 sends is slow, what it receives is not
    assert links["n1 <-> n2"].b_to_a_bps < links["n1 <-> n2"].a_to_b_bps / 3


@needs_netns
def test_unreachable_pair_names_the_pair_and_port(lab) -> None:
    # n3's fabric IP black-holed from n1 only: a wrong route (or firewall) between exactly two ranks
    netnslab.ip("-n", lab.ns["n1"], "route", "add", "blackhole", f"{lab.ips['n3']}/32")
    run = probe(lab, lab.ranks, bulk_bytes=BULK, rtt_count=COUNT, confirm=suspects(lambda x: None))
    found = [f for f in verdict(run, lambda x: None) if f.status == "fail"]
    assert [f.message.split(":")[0] for f in found] == ["n1 <-> n3"]
    assert f"{lab.ips['n3']}:{fp.PORT}" in found[0].message
    assert all(s.get("timed_out") is None for s in run.servers.values())  # stopped by quit, not left running
    assert subprocess.run(["ip", "netns", "pids", lab.ns["n3"]], capture_output=True, text=True).stdout == ""


@needs_netns
def test_port_in_use_is_named(lab) -> None:
    holder = subprocess.Popen(["ip", "netns", "exec", lab.ns["n1"], "python3", "-c",
                               f"import socket,time; s=socket.socket(); s.bind(({lab.ips['n1']!r}, {fp.PORT})); "
                               "s.listen(); print('up', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "up"
        run = probe(lab, lab.ranks, bulk_bytes=BULK, rtt_count=COUNT, connect_wait_s=1.0)
    finally:
        holder.kill()
        holder.wait()
    assert ("n1", f"cannot listen on {lab.ips['n1']}:{fp.PORT}: Address already in use") in run.problems
    # n0 drove to n1 and met the other program: named as such, with the pair
    (f,) = [f for f in verdict(run, lambda x: None) if f.message.startswith("n0 <-> n1")]
    assert f.status == "fail" and "another program holds the port" in f.message


def test_a_second_measurement_keeps_the_better_figures_and_only_suspects_are_measured_again() -> None:
    run = ProbeRun([link("n0", "n1", 1e9), link("n0", "n2", 0.3e9, 5e-3), link("n1", "n2", 1e9)], 29570, BULK, ())
    picked = suspects(lambda x: None)(run)
    assert [x.name for x in picked] == ["n0 <-> n2"]
    x = picked[0]
    fp._best(x, {"out_bps": 0.95e9, "in_bps": 0.2e9, "rtt_s": {"49152": 1e-3, "409600": 9e-3}})
    assert (x.a_to_b_bps, x.b_to_a_bps, x.remeasured) == (0.95e9, 0.3e9, True)
    assert x.rtt_s == {"49152": 1e-3, "409600": 9e-3} and "measured again" in verdict(run, lambda y: None)[1].observed


def test_dry_run_shows_exactly_what_the_probe_sends() -> None:
    """Under --dry-run the executor shows the probe's every command (servers, rounds, quit) and runs none; run,
    the nodes receive exactly those commands and requests, in that order (one generator, probe_ops)."""
    from sparkfleet.fleet.op import Executor, NoConnection, shown_as
    from sparkfleet.fleet.transport import Result
    from sparkfleet.placement import Rank

    nodes = [Node(name=n, ssh=Ssh(host="10.10.0.9"), fabric_ip=f"192.168.192.{11 + i}", hardware="gb10",
                  storage=Storage(model_root="/m", cache_dir="/c")) for i, n in enumerate(["n0", "n1", "n2", "n3"])]
    ranks = [Rank(i, n) for i, n in enumerate(nodes)]
    shown: list[tuple[str, str, str, str]] = []
    dry = Executor(NoConnection(), {n.name: n for n in nodes}, dry_run=True,
                   show=shown_as(lambda event, **x: shown.append((x["what"], x["node"], x["command"],
                                                                 x.get("stdin", "")))))
    assert dry.drive(fp.probe_ops(ranks, bulk_bytes=BULK)) is None  # NoConnection: any use would raise

    class Fleet:
        """Nodes that answer as the helper does: a current copy, servers that report, drivers that measure."""

        def __init__(self) -> None:
            self.sent: list[tuple[str, str, str]] = []

        def run_each(self, ns, commands, stdin=None, **kw):
            out = {}
            for n in ns:
                req = json.loads((stdin or {}).get(n.name) or "{}")
                self.sent.append((n.name, commands[n.name], (stdin or {}).get(n.name, "")))
                doc = {"mode": req.get("mode"), "bind": req.get("bind"), "refused": [], "errors": []}
                if req.get("mode") == "drive":
                    doc = {"rtt_s": {"49152": 1e-4}, "out_bps": 1e9, "in_bps": 1e9}
                out[n.name] = Result(n.name, True, json.dumps(doc) if req else "")
            return out

    fleet = Fleet()
    run = fp.probe(fleet, ranks, bulk_bytes=BULK)
    assert [x.bps for x in run.links] == [1e9] * 6 and set(run.servers) == {"n1", "n2", "n3"}
    by_what = [(what, node, cmd, stdin) for what, node, cmd, stdin in shown]
    # the servers run in the background: their commands may reach the nodes after the first round's
    assert sorted(fleet.sent) == sorted((node, cmd, stdin) for _, node, cmd, stdin in by_what)
    assert [w for w, *_ in by_what][:1] == ["verify fabric_probe.py"]
    assert [w for w, *_ in by_what][-3:] == ["stop the fabric probe servers"] * 3
    assert sum(w.startswith("fabric probe round") for w, *_ in by_what) == 6


def test_a_round_that_raises_still_stops_the_servers() -> None:
    """A transport error (or Ctrl-C) in a round: the executor raises it inside the probe, which still sends
    the servers their quit (they would hold the port for server_life), then the error goes on."""
    from sparkfleet.fleet.op import Executor
    from sparkfleet.fleet.transport import Result
    from sparkfleet.placement import Rank

    nodes = [Node(name=n, ssh=Ssh(host="10.10.0.9"), fabric_ip=f"192.168.192.{11 + i}", hardware="gb10",
                  storage=Storage(model_root="/m", cache_dir="/c")) for i, n in enumerate(["n0", "n1", "n2"])]
    modes: list[str] = []

    class Breaks:
        def run_each(self, ns, commands, stdin=None, **kw):
            mode = json.loads((stdin or {}).get(ns[0].name) or '{"mode": "verify"}')["mode"]
            modes.append(mode)
            if mode == "drive":
                raise KeyboardInterrupt
            return {n.name: Result(n.name, True, "{}") for n in ns}

    with pytest.raises(KeyboardInterrupt):
        Executor(Breaks(), {n.name: n for n in nodes}).drive(fp.probe_ops([Rank(i, n) for i, n in enumerate(nodes)]))
    assert modes[0] == "verify" and "drive" in modes and modes[-1] == "quit"


@needs_netns
def test_check_fabric_names_the_slow_nodes_links_through_the_command(lab, tmp_path, monkeypatch, capsys) -> None:
    """`sparkfleet check --fabric` on an inventory of the lab's namespaces (the transport enters them)."""
    from sparkfleet.cli.main import main

    inv = lab_inventory(lab, tmp_path, monkeypatch)
    lab.shape("n1", "50mbit")
    code = main(["check", "--profile", "dcp2", "--inventory", str(inv), "--fabric", "--fabric-bytes", str(BULK),
                 "--json"])
    doc = json.loads(capsys.readouterr().out)
    probe_fails = sorted(f["message"].split(":")[0] for f in doc["findings"]
                         if f["check"] == "fabric-probe" and f["status"] == "fail")
    assert code == 1 and probe_fails == ["n0 <-> n1", "n1 <-> n2", "n1 <-> n3"]
    assert {x["a_ip"] for x in doc["fabric_probe"]["links"]} <= set(lab.ips.values())
    # the link facts came from each namespace's own /sys: fab0 is there and up, a veth's 10 Gb/s and MTU
    # 1500 everywhere; this machine has no RDMA port, which the check says for each node
    fabric = [f for f in doc["findings"] if f["check"] == "fabric"]
    assert [(f["node"], f["status"], f["message"]) for f in fabric] == [
        (n, "fail", f"no RDMA port is bound to {lab.iface}") for n in lab.names]
    assert all(f["observed"].startswith(f"{lab.iface} up, carrier 1, 10 Gb/s, MTU 1500;") for f in fabric)


@needs_netns
def test_the_optional_nccl_step_under_dry_run_shows_each_ranks_command(lab, tmp_path, monkeypatch, capsys) -> None:
    """A playbook with `- nccl` after `facts`, run with --dry-run: each rank's docker command, none run."""
    from sparkfleet.cli.main import main

    inv = lab_inventory(lab, tmp_path, monkeypatch)
    book = tmp_path / "nccl.yaml"
    book.write_text("name: nccl\nsteps:\n  - facts\n  - nccl\n  - fabric_probe\n")
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    monkeypatch.setattr("sparkfleet.runner.run.transport_for", lambda ns: lab, raising=False)
    ran: list[str] = []
    real_run = lab.run

    def spy(nodes, command, **kw):
        ran.append(command)
        return real_run(nodes, command, **kw)

    monkeypatch.setattr(lab, "run", spy)
    code = main(["play", str(book), "--profile", "dcp2", "--inventory", str(inv), "--dry-run", "--json"])
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    would = [e for e in events if e["event"] == "would"]
    nccl = [e for e in would if e["what"] == "NCCL all-reduce in the lane's image"]
    assert code == 0 and [e["node"] for e in nccl] == lab.names
    assert all(e["command"].startswith("docker run --rm --name sf-nccl-dcp2-r") for e in nccl)
    assert f"--master-addr {lab.ips['n0']}" in nccl[2]["command"]
    probe = [e for e in would if e["what"].startswith("fabric probe")]
    assert len(probe) == 3 + 6  # servers on n1..n3, then six links in three rounds
    assert not any(c.startswith("docker run") for c in ran)  # only the read-only facts ran


@needs_netns
def test_check_fails_a_fabric_link_taken_down(lab, tmp_path, monkeypatch, capsys) -> None:
    """`sparkfleet check` with n2's fabric interface taken down (`ip link set fab0 down` in its namespace)."""
    from sparkfleet.cli.main import main

    inv = lab_inventory(lab, tmp_path, monkeypatch)
    netnslab.ip("-n", lab.ns["n2"], "link", "set", lab.iface, "down")
    code = main(["check", "--profile", "dcp2", "--inventory", str(inv), "--json"])
    doc = json.loads(capsys.readouterr().out)
    down = [(f["node"], f["message"]) for f in doc["findings"] if f["check"] == "fabric"
            and f["message"].startswith("fabric link")]
    assert code == 1 and down == [("n2", f"fabric link {lab.iface} is down")]
    (seen,) = [f["observed"] for f in doc["findings"] if f["check"] == "fabric" and f["node"] == "n2"
               and f["message"].startswith("fabric link")]
    assert seen.startswith(f"{lab.iface} down, carrier ?, speed ?, MTU 1500")
