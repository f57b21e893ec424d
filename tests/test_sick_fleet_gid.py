"""The RoCE GID variables of a launch (the engine adapter's gid_env) judged by the rdma check (no lab)."""

from __future__ import annotations

import pytest

from sparkfleet.checks import run_checks
from sparkfleet.plan import make_plan
from tests.test_checks import _gids, healthy, lane, of

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


def test_tensorfold_gid_index_is_judged_when_the_inventory_fixes_it(repo_spec) -> None:
    """TensorFold's GID_INDEX (its config.env) carries the inventory's index: fixed at 3 on a node whose
    entry moved to 5, it fails naming the variable, on top of the inventory's own finding."""
    profile, inv, _ = lane(repo_spec, "tf1017")
    inv.nodes["asusi"].rdma.gid_index = 3
    plan = make_plan(repo_spec.profile("tf1017"), inv, repo_spec.playbook("up"), repo_spec.root)
    facts = healthy(profile, inv, plan)
    facts["asusi"].rdma[0].gids = _gids("192.168.192.12", "enp1s0f0np0", v2_ipv4_index=5)
    got = [(f.status, f.message) for f in of(run_checks(plan, inv, facts, profile=profile), "rdma", "asusi")]
    assert ("fail", "rank 1: GID_INDEX=3 on HCA rocep1s0f0,roceP2p1s0f0 is not this node's RoCE v2 IPv4 entry "
            "for 192.168.192.12; the right index is 5") in got
    assert got[0][0] == "fail" and got[0][1].startswith("gid_index 3 is not this node's RoCE v2 IPv4 entry")
