"""Fabric and drift preflight on the simulated lab with real network namespaces (ssh mode as root).

Each node is its own machine with its own network namespace; its fabric interface holds its fabric
IP on the lab's fabric bridge (in a namespace of its own), so the probe really crosses veths. The
sim's slow-link, mtu-mismatch and driver-drift faults are not in the lab yet (issue 11): slow links
and links taken down are tested on namespaces of the tests' own (test_fabric_probe.py), MTU and
driver drift on facts (test_fabric_checks.py). Run under `flock /tmp/sparkfleet-lab.lock`.
"""

from __future__ import annotations

import json
import os

import pytest

from sparkfleet.cli.main import main
from sparkfleet.sim import lab

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the lab's own network namespaces need root")

PROBE_BYTES = str(4 * 1024 * 1024)  # per direction: enough to see a shaped link, lean for the suite


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    state = tmp_path_factory.mktemp("fabric-sim") / "state"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        s = lab.up("lab", transport="ssh")
        try:
            yield s
        finally:
            lab.down()


@pytest.fixture
def healed(sim):
    yield sim
    sim.heal()


def check(capsys, *extra: str) -> tuple[int, dict]:
    code = main(["check", "--profile", "dcp2", "--inventory", "sim", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def failing(doc: dict, check_name: str) -> list[tuple[str | None, str]]:
    return [(f.get("node"), f["message"]) for f in doc["findings"] if f["check"] == check_name and f["status"] == "fail"]


def test_a_healthy_fabric_passes_and_the_probe_stays_on_the_fabric_ips(healed, capsys) -> None:
    code, doc = check(capsys, "--fabric", "--fabric-bytes", PROBE_BYTES)
    assert failing(doc, "fabric") == [] and failing(doc, "fabric-probe") == [] and failing(doc, "drift") == []
    assert code == 0, [f for f in doc["findings"] if f["status"] == "fail"]
    inv = healed.inventory()
    fabric_ips = {inv.nodes[n].fabric_ip for n in ("reddie", "asusi", "bluey", "spark4")}
    links = doc["fabric_probe"]["links"]
    assert len(links) == 6 and all(x["error"] is None for x in links)
    assert {x["a_ip"] for x in links} | {x["b_ip"] for x in links} == fabric_ips
    assert {x["name"] for x in links} == {"reddie <-> asusi", "reddie <-> bluey", "reddie <-> spark4",
                                          "asusi <-> bluey", "asusi <-> spark4", "bluey <-> spark4"}
