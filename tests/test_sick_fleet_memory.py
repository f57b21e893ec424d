"""expect's post-load memory floor through a real `up` on the lab: the head's MemAvailable falls under the
profile's head floor (5 GB, HLT-23) while the lane loads, after the pre-launch checks passed; `up` fails
at expect naming node, floor and what it found, and stops every rank it started (exit 1).

THE LAB IS A SIMULATION (sparkfleet/sim): the sim's engines take no memory, so the test lowers the head's
MemAvailable (`low-memory`) once `up` is waiting for the lane, as a load that ate the head's memory would.
The runner, facts helper and docker calls are the real code. Run under the lab lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.cli_run import LAB_NODES, lane_states
from tests.conftest import REPO

FAST = ["--gates", "models", "--poll", "0.2", "--no-probe", "--no-fabric-probe"]


@pytest.fixture(autouse=True)
def clean(lane_cleaned):
    """The lab healed and dcp2 down afterwards (tests/conftest.py lane_cleaned)."""


def test_a_head_under_its_memory_floor_after_load_fails_expect_and_every_rank_is_stopped(sim, tmp_path) -> None:
    sim.fault("reddie", "slow-boot", factor=4)  # the lane is still loading when the memory goes
    log = tmp_path / "up.log"
    up = subprocess.Popen([sys.executable, "-m", "sparkfleet.cli.main", "up", "--profile", "dcp2", "--inventory",
                           str(sim.inventory_path), *FAST, "--json"],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, stdout=log.open("w"),
                          stderr=subprocess.STDOUT, text=True)

    def events() -> list[dict]:
        return [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]

    try:
        deadline = time.monotonic() + 120
        while not any(e["event"] == "step" and e["step"] == "wait_ready" and e["status"] == "start"
                      for e in events()):
            assert up.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        sim.fault("reddie", "low-memory", gib=3)  # 3 GiB = 3.2 GB, under the head floor of 5 GB
        assert up.wait(timeout=180) == 1, log.read_text()[-2000:]
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    ev = events()
    done = {e["step"]: e["status"] for e in ev if e["event"] == "step" and e["status"] != "start"}
    assert done["check"] != "fail" and (done["wait_ready"], done["expect"]) == ("ok", "fail"), done
    fails = [(f["node"], f["check"], f["message"], f.get("observed"), f.get("expected"))
             for e in ev if e["event"] == "findings" and e["step"] == "expect"
             for f in e["findings"] if f["status"] == "fail"]
    assert fails == [("reddie", "mem-after-load", "MemAvailable 3.2 GB under the head floor", "3.2 GB", ">= 5.0 GB")]
    res = next(e for e in ev if e["event"] == "result")
    assert res["reason"] == "expect: expectations not met; every rank of this launch was stopped"
    assert lane_states(sim) == {n: ["exited"] for n in LAB_NODES}
