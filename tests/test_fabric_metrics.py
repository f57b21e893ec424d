"""The exporter's fabric series: link facts per node from the poll, measured links from the run record."""

from __future__ import annotations

import pytest

from sparkfleet.fleet.nodefacts import NetLink, RdmaPort
from sparkfleet.metrics import names as n
from sparkfleet.runner.summaries import RunIndex
from tests.test_metrics import T0, facts, inv, scrape, spec, up_view, value, write_record  # noqa: F401

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


def test_link_facts_and_clock_offset_per_node(inv) -> None:  # noqa: F811
    ok, down = facts("reddie"), facts("asusi")
    ok.links = {"enp1s0f0np0": NetLink(name="enp1s0f0np0", exists=True, operstate="up", carrier=1,
                                       speed_mbps=200_000, mtu=9000)}
    ok.rdma = [RdmaPort(hca="rocep1s0f0", port=1, state="ACTIVE", netdev="enp1s0f0np0")]
    ok.received_at = T0 - 0.25  # reddie's clock is a quarter second ahead of the exporter's
    down.links = {"enp1s0f0np0": NetLink(name="enp1s0f0np0", exists=True, operstate="down", mtu=1500),
                  "enP2p1s0f0np0": NetLink(name="enP2p1s0f0np0", exists=False)}
    down.rdma = [RdmaPort(hca="rocep1s0f0", port=1, state="DOWN")]
    got = scrape(up_view(inv, {"reddie": ok, "asusi": down}))
    assert value(got, n.FABRIC_LINK_UP.name, node="reddie", iface="enp1s0f0np0") == 1.0
    assert value(got, n.FABRIC_LINK_UP.name, node="asusi", iface="enp1s0f0np0") == 0.0
    assert value(got, n.FABRIC_LINK_UP.name, node="asusi", iface="enP2p1s0f0np0") == 0.0  # missing
    assert value(got, n.FABRIC_LINK_MTU.name, node="reddie", iface="enp1s0f0np0") == 9000
    assert value(got, n.FABRIC_LINK_MTU.name, node="asusi", iface="enp1s0f0np0") == 1500
    assert value(got, n.FABRIC_LINK_SPEED.name, node="reddie", iface="enp1s0f0np0") == 200e9 / 8
    assert value(got, n.FABRIC_LINK_SPEED.name, node="asusi", iface="enp1s0f0np0") is None  # unknown when down
    assert value(got, n.RDMA_PORT_ACTIVE.name, node="reddie", hca="rocep1s0f0", port="1") == 1.0
    assert value(got, n.RDMA_PORT_ACTIVE.name, node="asusi", hca="rocep1s0f0", port="1") == 0.0
    assert value(got, n.NODE_CLOCK_OFFSET.name, node="reddie") == 0.25
    assert value(got, n.NODE_CLOCK_OFFSET.name, node="asusi") is None  # no receipt time: not guessed


def test_probed_links_from_the_newest_run_with_a_probe(inv, tmp_path) -> None:  # noqa: F811
    runs = tmp_path / "runs"
    link = {"name": "reddie <-> asusi", "a": "reddie", "b": "asusi", "a_to_b_bps": 8e9, "b_to_a_bps": 2e9,
            "rtt_s": {"49152": 0.0001, "409600": 0.0005}}
    slow = {**link, "name": "reddie <-> bluey", "b": "bluey"}
    steps = [{"step": "stop", "status": "ok", "elapsed_s": 2.0}, {"step": "fabric_probe", "status": "fail",
                                                                   "elapsed_s": 7.5}]
    write_record(runs, "a", started=T0, duration=12.0, outcome="failed", steps=steps, data={"fabric_probe": {
        "links": [link, slow], "findings": [{"check": "fabric-probe", "status": "fail",
                                             "message": "reddie <-> bluey: bandwidth 2 Gb/s is 4.0x below"}]}})
    write_record(runs, "b", started=T0 + 100, duration=5.0, data={})  # a later run without a probe
    view = up_view(inv, {}, runs=RunIndex(runs, "lab").refresh())
    got = scrape(view)
    b = n.PROBE_LINK_BANDWIDTH.name
    assert value(got, b, profile="dcp2", link="reddie <-> asusi", src="reddie", dst="asusi") == 1e9
    assert value(got, b, profile="dcp2", link="reddie <-> asusi", src="asusi", dst="reddie") == 2.5e8
    assert value(got, n.PROBE_LINK_RTT.name, profile="dcp2", link="reddie <-> asusi", size_bytes="409600") == 0.0005
    assert value(got, n.PROBE_LINK_OK.name, profile="dcp2", link="reddie <-> asusi") == 1.0
    assert value(got, n.PROBE_LINK_OK.name, profile="dcp2", link="reddie <-> bluey") == 0.0
    assert value(got, n.PROBE_TIME.name, profile="dcp2") == T0 + 9.5
