"""The pieces of issue 26 that need no lab: Engram per-layer log facts, --limit refusals (nothing dialled)."""

from __future__ import annotations

import socket

import pytest

from sparkfleet.cli.main import main
from sparkfleet.engines.logs import LogFacts, feed
from sparkfleet.engines.vllm import LOG
from sparkfleet.runner.expect import nfs_read

LINES = [
    "(EngineCore pid=1) INFO 12-01 10:00:00 [engram.py:212] Engram DISK mode: layer 1 rows [0, 1024)",
    "(EngineCore pid=1) INFO 12-01 10:00:00 [engram.py:212] Engram DISK mode: layer 14 rows [0, 1024)",
    "(EngineCore pid=1) INFO 12-01 10:00:00 [engram.py:248] Engram layer 1 rows [0, 1024) read from node-local "
    "/engram-local",
]
NFS_14 = ("(EngineCore pid=1) INFO 12-01 10:00:00 [engram.py:248] Engram layer 14 rows [0, 1024) read from the "
          "model directory (no node-local copy)")


def test_one_layer_over_nfs_is_not_node_local_although_another_layer_said_so() -> None:
    lf = feed(LogFacts(), [*LINES, NFS_14], [], LOG)
    assert lf.engram_node_local  # the old rule: the first 'read from node-local' line
    assert lf.engram_layer_local == {1: True, 14: False}
    assert nfs_read(lf) == [14]
    every = feed(LogFacts(), [*LINES, NFS_14.replace("the model directory (no node-local copy)",
                                                     "node-local /engram-local")], [], LOG)
    assert nfs_read(every) is None
    assert nfs_read(LogFacts()) == []  # no Engram line at all: not node-local


def test_limit_outside_the_lane_and_limit_on_up_are_refused_before_anything(capsys) -> None:
    assert main(["down", "--profile", "dcp2", "--limit", "reddie,nowhere", "--dry-run", "--json"]) == 2
    assert "--limit reddie,nowhere: nowhere is not a node of lane dcp2 (its nodes: reddie, asusi, bluey, " \
           "spark4)" in capsys.readouterr().err
    assert main(["up", "--profile", "dcp2", "--limit", "reddie", "--dry-run", "--json"]) == 2
    assert "--limit is refused on up" in capsys.readouterr().err


def test_down_limit_touches_only_the_named_nodes_under_dry_run(capsys) -> None:
    import json

    assert main(["down", "--profile", "dcp2", "--limit", "bluey", "--dry-run", "--json"]) == 0
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert {e["node"] for e in events if e["event"] == "would"} == {"bluey"}


def test_watch_waits_for_a_silent_node_before_any_restart_even_when_another_rank_exited() -> None:
    from sparkfleet.watch.liveness import Probe, RankState
    from sparkfleet.watch.policy import Settings, Tracker

    t = Tracker(Settings(failures=1))
    ranks = (RankState(0, "reddie", "exited"), RankState(2, "bluey", "unknown", error="No route to host"))
    v = t.observe(Probe(at=1.0, ok=False, why="no answer", latency_s=None, health=None, ranks=ranks))
    assert (v.action, v.node, v.why) == ("wait", "bluey", "waiting for bluey (rank 2) to answer before restarting "
                                         "the group: No route to host")
    back = (RankState(0, "reddie", "exited"), RankState(2, "bluey", "exited"))
    v = t.observe(Probe(at=2.0, ok=False, why="no answer", latency_s=None, health=None, ranks=back))
    assert (v.action, v.reason) == ("restart", "rank-exited")


def test_a_rank_is_lost_to_a_reboot_when_its_node_booted_after_it_started() -> None:
    """status (FM-25): the node's boot time (its clock less its uptime, one facts run) against the container's
    start (dockerd's, on the node's clock)."""
    from sparkfleet.cli.observe import rebooted_under
    from sparkfleet.fleet.nodefacts import Container, NodeFacts

    boot = 1_796_000_000.0  # 2026-11-30T00:53:20Z
    node = NodeFacts(node="bluey", hostname="bluey", collected_at=boot + 30, uptime_s=30.0, helper_version="1")

    def rank(state: str, started: str) -> Container:
        return Container(id="c", name="sf-dcp2-r2", image="i", state=state, started_at=started,
                         exit_code=None if state == "running" else 255)

    lost = rebooted_under("bluey", node, rank("exited", "2026-11-30T00:50:00.5Z"), "dcp2", 2)
    assert lost == {"rebooted_at": "2026-11-30T00:53:20Z",
                    "note": "bluey rebooted at 2026-11-30T00:53:20Z (from its uptime), after rank 2 started at "
                            "2026-11-30T00:50:00.5Z: the lane lost this rank",
                    "remedy": "start the whole lane again: `sparkfleet up --profile dcp2` (a tensor-parallel lane "
                              "cannot take one rank back; `sparkfleet watch --profile dcp2` restarts it by itself)"}
    # started after the boot, still running, or a node without an uptime: not lost to a reboot
    assert rebooted_under("bluey", node, rank("exited", "2026-11-30T00:53:25Z"), "dcp2", 2) == {}
    assert rebooted_under("bluey", node, rank("running", "2026-11-30T00:50:00Z"), "dcp2", 2) == {}
    assert rebooted_under("bluey", node.model_copy(update={"uptime_s": None}),
                          rank("exited", "2026-11-30T00:50:00Z"), "dcp2", 2) == {}


# -- a node that only times out costs one run one connect timeout ---------------------------------------------

def _silent_port() -> tuple[socket.socket, list[socket.socket], int]:
    """A TCP port on this machine that answers no new connection, as a blackholed host does: a listener with
    a backlog of 0 and its one queued connection never accepted, so Linux drops every later SYN unanswered
    (no RST: the connect only times out)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fill = []
    for _ in range(2):  # Linux queues backlog + 1
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        fill.append(c)
    return srv, fill, port


@pytest.mark.parametrize("wait_once, attempts", [(True, 1), (False, 2)])
def test_a_run_transport_waits_for_a_silent_node_once_and_says_so_after(monkeypatch, tmp_path, wait_once: bool,
                                                                        attempts: int) -> None:
    from sparkfleet.fleet.ssh import SshTransport
    from sparkfleet.schema.inventory import Node, Ssh, Storage

    srv, fill, port = _silent_port()
    opened = []
    real = SshTransport._open
    monkeypatch.setattr(SshTransport, "_open", lambda self, node: (opened.append(node.name), real(self, node))[1])
    node = Node(name="bluey", ssh=Ssh(host="127.0.0.1", port=port, user="ops"), hardware="gb10", transport="ssh",
                storage=Storage(model_root="/m", cache_dir="/c"))
    try:
        with SshTransport(tmp_path / "known_hosts", connect_timeout_s=0.5, wait_once=wait_once) as t:
            first = t.run([node], "true")["bluey"]
            second = t.run([node], "true")["bluey"]
    finally:
        for s in (srv, *fill):
            s.close()
    assert (first.error, first.message) == ("unreachable", f"bluey: no answer from ops@127.0.0.1:{port} within 0.5s "
                                            "(node down, link down or firewalled); check the node and its network")
    assert opened == ["bluey"] * attempts
    assert second.error == "unreachable"
    assert second.message == first.message + (" (earlier in this run: not waited for again)" if wait_once else "")


def test_a_refused_node_is_asked_again_by_a_run_transport(tmp_path, monkeypatch) -> None:
    """Only a timeout is remembered: a refusal costs nothing to ask again (the node may be back)."""
    from sparkfleet.fleet.ssh import SshTransport
    from sparkfleet.schema.inventory import Node, Ssh, Storage

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: connection refused
    opened = []
    real = SshTransport._open
    monkeypatch.setattr(SshTransport, "_open", lambda self, node: (opened.append(node.name), real(self, node))[1])
    node = Node(name="bluey", ssh=Ssh(host="127.0.0.1", port=port, user="ops"), hardware="gb10", transport="ssh",
                storage=Storage(model_root="/m", cache_dir="/c"))
    with SshTransport(tmp_path / "known_hosts", connect_timeout_s=5, wait_once=True) as t:
        got = [t.run([node], "true")["bluey"].message for _ in range(2)]
    assert got == [f"bluey: connection refused by ops@127.0.0.1:{port}; is sshd running on the node?"] * 2
    assert opened == ["bluey", "bluey"]
