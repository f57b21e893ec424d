"""`sparkfleet diff` and `plan --against`: per rank, what differs between profiles, runs and restore points.

Runs here are records written the way the runner writes them (runner/record.py) from a plan's launches;
the end-to-end restore on the lab is tests/test_restore.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.opsdir import Spec
from sparkfleet.plan import make_plan
from sparkfleet.runner.record import Record
from tests.conftest import REPO, copy_ops

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SPARKFLEET_STATE", str(d))
    return d


def write_run(state: Path, profile: str, run_id: str, gid: int = 3, outcome: str = "ok") -> dict:
    """A run record of `profile` as the runner writes it: the plan's launches, GID indexes resolved."""
    sp = Spec(REPO)
    inv = sp.inventory("lab")
    plan = make_plan(sp.profile(profile), inv, sp.playbook("up"), REPO, run_id=run_id,
                     gid_index={n: gid for n in inv.nodes})
    rec = Record(run_id, "up", profile, "lab", f"sparkfleet up --profile {profile}", started=time.time())
    rec.outcome, rec.finished = outcome, rec.started + 1
    rec.data["launches"] = [x.as_dict() | {"inventory": {"gid_index": gid}} for x in plan.launches]
    rec.write(state / "runs")
    return rec.as_dict()


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def changes(result: dict, rank: int) -> list[tuple]:
    rd = next(r for r in result["ranks"] if r["rank"] == rank)
    return [(c["kind"], c["key"], c["a"], c["b"]) for c in rd["changes"]]


def test_a_run_against_its_profile_today_is_the_same(state, capsys) -> None:
    write_run(state, "dcp2", "r1")
    code, got = run_json(capsys, "diff", "r1", "dcp2")
    assert code == 0 and got["same"] and not got["unrelated"] and got["ranks"] == []
    code, got = run_json(capsys, "diff", "dcp2")  # one argument: the profile today vs its last good run
    assert code == 0 and got["a"] == {"kind": "run", "name": "r1", "profile": "dcp2"} and got["same"]


def test_diff_names_each_ranks_flag_env_and_mount_changes(state, capsys, tmp_path) -> None:
    write_run(state, "dcp2", "r1")
    ops = copy_ops(tmp_path / "ops")
    prof = ops / "profiles/dcp2.yaml"
    prof.write_text(prof.read_text().replace("  --kv-cache-memory-bytes: 6442450944", "  --kv-cache-memory-bytes: 8589934592"))
    inv = ops / "inventories/lab.yaml"
    text = inv.read_text()
    i = text.index("  bluey:")
    inv.write_text(text[:i] + text[i:].replace("hcas: [rocep1s0f0, roceP2p1s0f0]", "hcas: [mlx5_0]", 1))
    code, got = run_json(capsys, "diff", "run:r1", "profile:dcp2", "--root", str(ops))
    assert code == 1 and not got["unrelated"]
    kv = ("flag", "--kv-cache-memory-bytes", ["6442450944"], ["8589934592"])
    for rank in (0, 1, 3):
        assert changes(got, rank) == [kv]
    hca = "rocep1s0f0,roceP2p1s0f0"
    assert changes(got, 2) == [("env", "B12X_ROCE_HCA", hca, "mlx5_0"), ("env", "NCCL_IB_HCA", hca, "mlx5_0"), kv]
    main(["diff", "r1", "dcp2", "--root", str(ops)])  # the table
    table = capsys.readouterr().out
    assert "a = run r1 (dcp2), b = profile dcp2" in table and "env NCCL_IB_HCA" in table and "mlx5_0" in table


def test_plan_against_shows_the_differences_inline(state, capsys, tmp_path) -> None:
    write_run(state, "dcp2", "r1")
    ops = copy_ops(tmp_path / "ops")
    prof = ops / "profiles/dcp2.yaml"
    prof.write_text(prof.read_text().replace("  --dcp-comm-backend: ag_rs", "  --dcp-comm-backend: ag_rs\n  --new-lever: true"))
    assert main(["plan", "--profile", "dcp2", "--against", "r1", "--root", str(ops)]) == 0
    text = capsys.readouterr().out
    assert text.count("~ vs r1: flag --new-lever: (none) -> (bare)") == 4
    code, got = run_json(capsys, "plan", "--profile", "dcp2", "--against", "r1", "--root", str(ops))
    assert code == 0 and [changes(got["against"], r) for r in range(4)] == [[("flag", "--new-lever", None, [])]] * 4


def test_unrelated_things_still_diff_and_say_so(state, capsys) -> None:
    write_run(state, "gb300-v23", "s1")
    code, got = run_json(capsys, "diff", "s1", "dcp2")
    assert code == 1 and got["unrelated"] and {r["rank"] for r in got["ranks"]} == {0, 1, 2, 3}
    assert ("node", "node", "station", "reddie") in changes(got, 0)
    assert [c for c in changes(got, 1) if c[0] == "rank"] == [("rank", "launch", None, "present")]
    assert main(["diff", "s1", "dcp2"]) == 1
    assert "are different lanes: expect everything to differ" in capsys.readouterr().out


def test_diff_bad_names(state, capsys) -> None:
    assert main(["diff", "nosuch", "dcp2"]) == 2
    assert "'nosuch' is not a profile, a restore point or a run id" in capsys.readouterr().err
    assert main(["diff", "run:nosuch", "dcp2"]) == 2
    assert "no run named 'nosuch'" in capsys.readouterr().err
    assert main(["diff", "dcp1"]) == 2
    assert "no good run of 'dcp1' is recorded" in capsys.readouterr().err


def test_records_of_an_older_schema_are_read_and_a_newer_one_is_refused(state, capsys) -> None:
    doc = write_run(state, "dcp2", "r1")
    legacy = {k: v for k, v in doc.items() if k != "schema_version"}  # schema 1: the same layout, no version
    (state / "runs/r0.json").write_text(json.dumps(legacy))
    code, got = run_json(capsys, "diff", "r0", "r1")
    assert code == 0 and got["same"]
    (state / "runs/r9.json").write_text(json.dumps(doc | {"schema_version": 99}))
    assert main(["diff", "r9", "dcp2"]) == 2
    err = capsys.readouterr().err
    assert "r9.json: schema_version 99 is newer than this sparkfleet reads (4); upgrade sparkfleet to read it" in err
