"""NCCL's transport from its INFO lines, the decision per rank, and the commands `check --nccl` runs.

The Socket case is NCCL 2.28.9's own output on an H200 without an HCA (docs/receipts/, captured with
`python3 sparkfleet/fleet/nodeside/nccl_allreduce.py --world-size 1`). The RDMA lines are in NCCL's
formats as its logging docs and source print them (checks/nccl.py cites them): `NET/IB : Using
[0]dev:port/RoCE`, `Using network IB` and vLLM's `[send] via NET/IB/GDRDMA`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from sparkfleet.checks import nccl
from sparkfleet.cli.main import main
from sparkfleet.fleet.gather import resolve_gid_indexes
from sparkfleet.fleet.ops import allreduce as run_nccl
from sparkfleet.fleet.ship import guard_command
from sparkfleet.fleet.transport import Result, RunEachByRun
from sparkfleet.opsdir import Spec
from tests.test_checks import healthy, lane

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

RECEIPT = Path(__file__).resolve().parent.parent / "docs" / "receipts" / "nccl-allreduce-h200-world1.txt"

RDMA = """\
reddie:4021:4021 [0] NCCL INFO NCCL version 2.27.7+cuda13.0
reddie:4021:4021 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so
reddie:4021:4021 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:192.168.192.11<0>
reddie:4021:4021 [0] NCCL INFO Initialized NET plugin IB
reddie:4021:4021 [0] NCCL INFO Assigned NET plugin IB to comm
reddie:4021:4021 [0] NCCL INFO Using network IB
reddie:4021:4090 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
reddie:4021:4090 [0] NCCL INFO Channel 00/0 : 3[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
reddie:4021:4090 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
{"sparkfleet_nccl": {"rank": 0, "world_size": 4, "latency_us": {"49152": 31.5, "409600": 58.25}}}
"""

SOCKET_CHANNELS = """\
bluey:711:711 [0] NCCL INFO NET/IB : No device found.
bluey:711:711 [0] NCCL INFO Channel 00/0 : 2[0] -> 3[0] [send] via NET/Socket/0
bluey:711:711 [0] NCCL INFO Channel 00/0 : 1[0] -> 2[0] [receive] via NET/Socket/0
"""


def test_the_h200_receipt_is_a_socket_fallback() -> None:
    t = run_nccl.parse(RECEIPT.read_text())
    assert t.network == "Socket" and t.on_socket and not t.on_rdma
    assert t.socket_ifaces == "[0]eth0:192.0.2.2<0>" and t.version == "2.28.9+cuda13.0"
    assert t.result is not None and t.result["world_size"] == 1 and set(t.result["latency_us"]) == {"49152", "409600"}
    # for a one-rank lane nothing crosses a network: not a failure
    f = nccl.verdict("h200", 0, t, expects_rdma=False, exit_code=0)
    assert f.status == "ok" and f.message.startswith("rank 0: NCCL over network Socket, all-reduce 48 KB")
    # the same output from a rank of an RDMA lane is the silent fallback: it fails
    f = nccl.verdict("h200", 0, t, expects_rdma=True, exit_code=0)
    assert f.status == "fail" and f.message == "rank 0: NCCL fell back to TCP sockets (NET/Socket), not RDMA"


def test_rdma_lines_pass_with_gpudirect_and_latency() -> None:
    t = run_nccl.parse(RDMA)
    assert (t.network, t.on_rdma, t.gdrdma, t.on_socket) == ("IB", True, True, False)
    assert t.via == {"NET/IB/0/GDRDMA": 3} and t.ib_devices == "[0]rocep1s0f0:1/RoCE [RO]"
    f = nccl.verdict("reddie", 0, t, expects_rdma=True, exit_code=0)
    assert (f.status, f.message) == ("ok", "rank 0: NCCL over RDMA with GPUDirect, all-reduce 48 KB 31.5 us, "
                                           "400 KB 58.25 us")


def test_a_channel_via_socket_fails_even_without_the_network_line() -> None:
    t = run_nccl.parse(SOCKET_CHANNELS)
    assert t.network is None and t.via == {"NET/Socket/0": 2}
    assert nccl.verdict("bluey", 2, t, expects_rdma=True, exit_code=0).status == "fail"


def test_no_transport_lines_is_not_judged_and_a_failed_run_fails() -> None:
    t = run_nccl.parse('{"sparkfleet_nccl": {"rank": 1, "latency_us": {"49152": 30}}}\n')
    assert nccl.verdict("asusi", 1, t, expects_rdma=True, exit_code=0).status == "warn"
    t = run_nccl.parse("spark4:9:9 [0] NCCL WARN NET/IB : Got completion with error 12\n"
                   '{"sparkfleet_nccl": {"rank": 3, "error": "DistBackendError: NCCL error"}}\n')
    f = nccl.verdict("spark4", 3, t, expects_rdma=True, exit_code=1)
    assert f.status == "fail" and "DistBackendError" in f.message and "Got completion with error 12" in f.message


def test_commands_carry_each_nodes_hca_gid_and_the_lanes_nccl_env(repo_spec: Spec) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["bluey"].rdma[0].gids[3].index = 5  # bluey's RoCE v2 IPv4 entry is at 5
    gid = resolve_gid_indexes([r.node for r in plan.ranks], facts)
    runs = run_nccl.commands(profile, plan.ranks, plan.launches, gid)
    assert [(x.rank, x.node) for x in runs] == [(0, "reddie"), (1, "asusi"), (2, "bluey"), (3, "spark4")]
    argv = shlex.split(runs[2].command.replace('"$HOME"', "/root"))
    assert argv[:6] == ["docker", "run", "--rm", "--name", "sf-nccl-dcp2-r2-check", "--label"]
    env = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert "NCCL_IB_GID_INDEX=5" in env and "NCCL_DEBUG=INFO" in env and "NCCL_NET=IB" in env
    assert "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0" in env and "NCCL_SOCKET_IFNAME=enp1s0f0np0" in env
    assert "--device" in argv and "/dev/infiniband:/dev/infiniband" in argv and "--restart" not in argv
    assert "-v" in argv and "/root/.cache/sparkfleet/bin/nccl_allreduce.py:/opt/sparkfleet/nccl_allreduce.py:ro" in argv
    image = profile.image.pinned
    assert argv[argv.index(image) + 1:] == ["python3", "/opt/sparkfleet/nccl_allreduce.py", "--rank", "2",
                                            "--world-size", "4", "--master-addr", "192.168.192.11",
                                            "--master-port", "29571", "--sizes", "49152,409600", "2>&1"]


def test_check_nccl_dry_run_shows_the_commands_and_runs_none(repo_spec: Spec, monkeypatch, capsys) -> None:
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    ran: list[str] = []

    class NoRun(RunEachByRun):
        def run(self, nodes, command, **kw):
            ran.append(command)
            # --dry-run=facts may read (the Engram manifests, the helper copy's sha256: the guard that runs
            # nothing), never more
            if not (command.startswith("cat ") or command == guard_command("nccl_allreduce.py", run=False)):
                raise AssertionError("a command was run")
            if not command.startswith("cat "):  # the node holds this sparkfleet's copy of the helper
                return {n.name: Result(n.name, True) for n in nodes}
            return {n.name: Result(n.name, False, "", "cat: no such file\n", 1, "exit") for n in nodes}

        def close(self) -> None:
            pass

    opened: list[object] = []
    monkeypatch.setattr("sparkfleet.fleet.connect.transport_for", lambda nodes: opened.append(nodes) or NoRun())
    def gather_ops(*a, **k):  # the facts, asking no node
        return facts
        yield

    monkeypatch.setattr("sparkfleet.fleet.gather.gather_ops", gather_ops)
    code = main(["check", "--profile", "dcp2", "--nccl", "--dry-run"])  # no node contacted, not even for facts
    text = capsys.readouterr().out
    assert ran == [] and opened == [] and code == 0
    assert "check --dry-run: no node was contacted" in text and "nccl (--dry-run: not run)" in text
    assert "rank 3 on spark4:" in text and "--master-addr 192.168.192.11" in text
    code = main(["check", "--profile", "dcp2", "--nccl", "--dry-run=facts"])  # facts read, the all-reduce not run
    text = capsys.readouterr().out
    assert any(c.startswith("cat ") for c in ran) and len(opened) == 1 and code == 1  # no Engram copies: fail
    assert "nccl (--dry-run: not run)" in text and "rank 3 on spark4:" in text
