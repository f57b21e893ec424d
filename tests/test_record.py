"""The run record is one typed model: every key the runner and watch write is declared, an undeclared key is
refused on write, and records of the previous schema still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from sparkfleet.runner.record import SCHEMA_VERSION, Record, read_record

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

V2 = Path(__file__).parent / "fixtures/records/v2-stop-failed.json"  # written by sparkfleet 733d167 (schema 2)
V3 = Path(__file__).parent / "fixtures/records/v3-down-ok.json"  # written by sparkfleet 395af8e (schema 3): a lab `down`


def test_a_stored_v2_record_still_reads() -> None:
    doc = json.loads(V2.read_text())
    assert doc["schema_version"] == 2 and SCHEMA_VERSION == 4
    rec = read_record(doc, str(V2))
    assert (rec.schema_version, rec.outcome, rec.reason) == (2, "failed", "stop: cannot list containers on every node")
    assert rec.data.fleet_lock is not None and rec.data.overrides == {} and rec.data.legacy is None
    assert [s.step for s in rec.steps] == ["stop"]


def test_a_stored_v3_record_still_reads() -> None:
    doc = json.loads(V3.read_text())
    assert doc["schema_version"] == 3
    rec = read_record(doc, str(V3))
    assert (rec.schema_version, rec.playbook, rec.profile, rec.outcome) == (3, "down", "llamacpp-lab", "ok")
    assert rec.data.legacy is None and rec.data.slurm_job is None
    assert [s.step for s in rec.steps] == [s["step"] for s in doc["steps"]]


def test_a_v2_key_this_version_no_longer_names_is_kept_as_legacy() -> None:
    doc = json.loads(V2.read_text())
    doc["data"]["schema_errors"] = ["data.x: Extra inputs are not permitted"]
    rec = read_record(doc)
    assert rec.data.legacy == {"schema_errors": ["data.x: Extra inputs are not permitted"]}


def test_an_undeclared_key_is_refused_on_write_and_a_declared_one_typed(tmp_path: Path) -> None:
    rec = Record("r1", "up", "dcp2", "lab", "up --profile dcp2")
    rec.data["wait_ready"] = {"poll_s": 1.0, "polls": 3}
    rec.data["engram"] = {"0": "node-local"}
    written = json.loads(rec.write(tmp_path).read_text())
    assert written["schema_version"] == SCHEMA_VERSION and written["data"]["engram"] == {"0": "node-local"}
    rec.data["wait_redy"] = {}
    with pytest.raises(ValidationError, match="wait_redy"):
        rec.as_dict()


def test_the_typed_parts_refuse_a_wrong_type_keep_a_new_key_and_read_an_old_record(tmp_path: Path) -> None:
    """wait_ready, unreachable, incident, stand_down, restart, fleet_lock and engine_build are typed: a wrong
    type is refused on write; a key a writer adds is kept (the parts are open); a part an older sparkfleet
    wrote with fewer keys reads."""
    rec = Record("r2", "up", "dcp2", "lab", "up --profile dcp2")
    rec.data["wait_ready"] = {"poll_s": 0.2, "polls": 2, "failed_rank": 1, "failed_node": "asusi", "later": "kept"}
    rec.data["unreachable"] = {"bluey": {"rank": 2, "kind": "reach", "why": "timed out", "remedy": "power it"}}
    written = json.loads(rec.write(tmp_path).read_text())["data"]
    assert written["wait_ready"] == {"poll_s": 0.2, "polls": 2, "failed_rank": 1, "failed_node": "asusi",
                                     "later": "kept"}  # as written: no default filled in
    assert written["unreachable"]["bluey"]["kind"] == "reach"
    rec.data["wait_ready"]["failed_rank"] = "one"
    with pytest.raises(ValidationError, match="wait_ready.failed_rank"):
        rec.as_dict()
    rec.data["wait_ready"]["failed_rank"] = 1
    rec.data["fleet_lock"] = {"nodes": "reddie"}
    with pytest.raises(ValidationError, match="fleet_lock.nodes"):
        rec.as_dict()
    rec.data["fleet_lock"] = {"nodes": ["reddie"]}
    rec.data["engine_build"] = {"digest": "ab", "nodes": {"reddie": {"exists": True, "digest": "ab"},
                                                          "asusi": "could not read the tree"}}
    assert json.loads(rec.write(tmp_path).read_text())["data"]["engine_build"]["nodes"] == {
        "reddie": {"exists": True, "digest": "ab"}, "asusi": "could not read the tree"}
    rec.data["engine_build"]["nodes"]["reddie"] = {"exists": "maybe"}
    with pytest.raises(ValidationError, match="engine_build.nodes.reddie"):
        rec.as_dict()
    old = {"schema_version": 4, "run_id": "r3", "playbook": "watch", "profile": "dcp2", "inventory": "lab",
           "command": "sparkfleet watch", "started": 1.0, "outcome": "ok", "steps": [],
           "data": {"incident": {"why": "no reason key yet"}, "restart": {"run_id": "r4"}, "wait_ready": {}}}
    got = read_record(old, "old.json")
    assert (got.data.incident.why, got.data.restart.run_id, got.data.wait_ready.polls) == ("no reason key yet",
                                                                                          "r4", 0)
    assert read_record({**old, "data": {"engine_build": {"digest": "cd"}}}).data.engine_build.nodes == {}


def test_runs_show_reads_a_stored_v2_record_through_the_typed_model(tmp_path: Path, monkeypatch, capsys) -> None:
    """A key schema 2 wrote that this version no longer names is shown where the typed model keeps it."""
    from sparkfleet.cli.main import main

    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path))
    doc = json.loads(V2.read_text())
    doc["data"]["schema_errors"] = ["data.x: Extra inputs are not permitted"]
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / f"{doc['run_id']}.json").write_text(json.dumps(doc))
    assert main(["runs", "show", doc["run_id"]]) == 0
    said = " ".join(capsys.readouterr().out.split())  # wrapped to the terminal's width
    assert f"run {doc['run_id']}: up dcp2 on rec: failed (stop: cannot list containers on every node), 0.072 s" \
        in said and "fail stop 0.02 cannot list containers on every node" in said
    assert main(["runs", "show", doc["run_id"], "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert "schema_errors" not in shown["data"] and \
        shown["data"]["legacy"] == {"schema_errors": ["data.x: Extra inputs are not permitted"]}
    assert shown["steps"][0]["findings"][0]["check"] == "reach" and shown["data"]["fleet_lock"] == \
        doc["data"]["fleet_lock"]
