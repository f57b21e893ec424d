"""Fabric and drift preflight on the simulated lab with real network namespaces (ssh mode as root).

Each node is its own machine with its own network namespace; its fabric interface holds its fabric
IP on the lab's fabric bridge (in a namespace of its own), so the probe really crosses veths and tc
really shapes them. Faults through the sim (slow-link, mtu-mismatch, driver-drift), checks through
the commands a user runs (`check`, `up`); a link taken down is tested on namespaces of the tests'
own (test_fabric_probe.py). Run under `flock /tmp/sparkfleet-lab.lock`.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from sparkfleet.cli.main import main
from sparkfleet.root import sim_inventory_path
from sparkfleet.sim import lab
from tests.cli_run import findings
from tests.conftest import copy_ops, engram_copies

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the lab's own network namespaces need root")

PROBE_BYTES = str(4 * 1024 * 1024)  # per direction: enough to see a shaped link, lean for the suite
# A shaped link well below a veth's few Gbit/s (the probe's ratio is 2x) yet fast enough that its 4 MiB
# each way and the 400 KiB RTT rounds take a fraction of a second, not minutes as at 20 Mbit/s.
SLOW = "200mbit"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    state = tmp_path_factory.mktemp("fabric-sim") / "state"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKFLEET_STATE", str(state))
        s = lab.up("lab", transport="ssh")
        try:
            engram_copies(s)
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


def test_slow_link_on_one_node_names_exactly_its_links(healed, capsys) -> None:
    healed.fault("bluey", "slow-link", rate=SLOW)
    code, doc = check(capsys, "--fabric", "--fabric-bytes", PROBE_BYTES)
    assert code == 1
    assert sorted(m.split(":")[0] for _, m in failing(doc, "fabric-probe")) == [
        "asusi <-> bluey", "bluey <-> spark4", "reddie <-> bluey"]


def test_slow_link_fails_up_before_any_rank_starts(healed, capsys, tmp_path) -> None:
    # up's own playbook, its fabric_probe step sending PROBE_BYTES (the step's bulk_bytes) instead of 64 MiB
    ops = copy_ops(tmp_path / "ops")
    book = ops / "playbooks/up.yaml"
    book.write_text(book.read_text().replace("  - fabric_probe\n", f"  - fabric_probe: {{args: {{bulk_bytes: {PROBE_BYTES}}}}}\n"))
    shutil.copy(sim_inventory_path(), ops / "inventories/sim.yaml")
    healed.fault("spark4", "slow-link", rate=SLOW)
    code = main(["up", "--profile", "dcp2", "--inventory", "sim", "--root", str(ops), "--json", "--poll", "0.2",
                 "--no-probe"])  # the clock probe step comes first and has tests of its own
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    steps = {e["step"]: e["status"] for e in events if e["event"] == "step" and e["status"] != "start"}
    assert code == 1 and steps["fabric_probe"] == "fail"
    assert sorted(x["message"].split(":")[0] for x in findings(events, "fabric_probe") if x["status"] == "fail") == [
        "asusi <-> spark4", "bluey <-> spark4", "reddie <-> spark4"]
    assert "launch:workers" not in steps  # nothing was started


def test_mtu_mismatch_names_the_node(healed, capsys) -> None:
    healed.fault("asusi", "mtu-mismatch")
    code, doc = check(capsys)
    (bad,) = failing(doc, "fabric")
    assert code == 1 and bad[0] == "asusi" and bad[1].startswith("MTU ")


def test_driver_drift_fails_drift(healed, capsys) -> None:
    healed.fault("spark4", "driver-drift")
    code, doc = check(capsys)
    assert code == 1
    assert [(n, m.split(" ")[0:2]) for n, m in failing(doc, "drift")] == [("spark4", ["NVIDIA", "driver"])]
