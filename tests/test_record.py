"""The run record is one typed model: every key the runner and watch write is declared, an undeclared key is
refused on write, and records of the previous schema still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from sparkfleet.runner.record import SCHEMA_VERSION, Record, read_record

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
