"""`up`'s steps driven as the runner drives them (runner/ops.py), against a transport that answers as a
node's shell would: here the Engram step, which judges each rank's copy with the one Engram rule
(engram/manifest.py check_rank, also what `engram-local` fleet mode and the exporter call)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkfleet.fleet.nodeside.engram_copy import MANIFEST_SCHEMA
from sparkfleet.fleet.transport import Result, RunEachByRun
from sparkfleet.opsdir import Spec
from sparkfleet.plan import make_plan
from sparkfleet.runner.context import RunContext, RunOptions
from sparkfleet.runner.ops import drive
from sparkfleet.runner.record import Record
from sparkfleet.runner.steps import STEPS
from sparkfleet.schema.playbook import Step

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

REV = "df42c109f1defefcbfcedbe7d905718a12266e40"  # dcp2's model.revision


class Shell(RunEachByRun):
    """`cat PATH` answered from a dict of files per node; a missing file fails as cat does."""

    def __init__(self, files: dict[str, dict[str, str]]) -> None:
        self.files = files
        self.ran: list[tuple[str, str]] = []

    def run(self, nodes, command, **kw):
        out = {}
        for n in nodes:
            self.ran.append((n.name, command))
            path = command.removeprefix("cat ")
            text = self.files.get(n.name, {}).get(path)
            out[n.name] = (Result(n.name, True, text, "", 0) if text is not None else
                           Result(n.name, False, "", f"cat: {path}: No such file or directory\n", 1, "exit"))
        return out


class Events:
    def emit(self, *a, **k) -> None:
        pass


def manifest(revision: str = REV, fmt: str = "fp8", verified: bool = True, complete: bool = True) -> str:
    return json.dumps({"schema": MANIFEST_SCHEMA, "complete": complete, "verified": verified, "format": fmt,
                       "mode": "whole-shards", "source": {"revision": revision}, "layers": {},
                       "completed_at": "2026-11-30T10:00:00+0000"})


def test_the_engram_step_judges_each_copy_with_the_one_rule(repo_spec: Spec, tmp_path: Path) -> None:
    loaded, inv = repo_spec.profile("dcp2"), repo_spec.inventory("lab")
    pb = repo_spec.playbook("up")
    plan = make_plan(loaded, inv, pb, repo_spec.root)
    path = f"/nvme/engram-local/{REV}/engram-manifest.json"
    shell = Shell({"reddie": {path: manifest()}, "asusi": {path: manifest(revision="0123456789abcdef")},
                   "bluey": {path: manifest(verified=False)}})  # spark4: no copy at all
    ctx = RunContext(repo_spec, loaded, inv, pb, plan, shell, Record("r", "up", "dcp2", "lab", "up"), Events(),
                     RunOptions(), tmp_path)
    result = drive(ctx, STEPS["engram"](ctx, Step(step="engram")))
    assert sorted(shell.ran) == [(n, f"cat {path}") for n in ("asusi", "bluey", "reddie", "spark4")]
    assert ctx.record.data["engram"] == {0: "node-local", 1: "nfs", 2: "nfs", 3: "nfs"}
    # dcp2 expects node-local rows (expect.engram_node_local): a copy there that does not qualify stops the run
    assert (result.status, result.summary) == ("fail", "expect.engram_node_local: rank 1 (asusi): the copy is of "
                                               f"checkpoint 0123456789abcdef, the lane runs {REV} (docs/failure-modes.md FM-62): "
                                               "falls back to reading the model directory over NFS (6-8 ms a step "
                                               "against 3, ENG-16) (and 2 more)")
    got = [(f.node, f.status, f.message) for f in result.findings]
    assert ("asusi", "fail", "rank 1 (asusi): the copy is of checkpoint 0123456789abcdef, the lane runs "
            f"{REV} (docs/failure-modes.md FM-62): falls back to reading the model directory over NFS (6-8 ms a step "
            "against 3, ENG-16)") in got
    assert ("bluey", "fail", "rank 2 (bluey): the copy was never verified (made with --no-verify, or its read-back "
            "failed): falls back to reading the model directory over NFS (6-8 ms a step against 3, "
            "ENG-16)") in got
    # no copy at all fails too, with the operator's way out
    assert ("spark4", "fail", "rank 3 (spark4): no engram-manifest.json: the copy is missing or incomplete: falls "
            "back to reading the model directory over NFS (6-8 ms a step against 3, ENG-16)") in got
    [spark4] = [f for f in result.findings if f.node == "spark4"]
    assert spark4.remedy == ("make the copies: boot once reading NFS on purpose (sparkfleet up --profile dcp2 "
                             "-o expect.engram_node_local=false), then sparkfleet engram-local harvest --profile dcp2 "
                             "and sparkfleet engram-local --profile dcp2 --tensors PATTERN; or keep serving from NFS "
                             "with that -o")
    assert [f.status for f in result.findings if f.node == "reddie"] == ["ok"]
    assert set(ctx.record.data["engram_manifests"]) == {"0"}


def test_without_the_expectation_every_fallback_is_a_warning(repo_spec: Spec, tmp_path: Path) -> None:
    loaded, inv = repo_spec.profile("dcp2"), repo_spec.inventory("lab")
    loaded.profile.expect.engram_node_local = False
    pb = repo_spec.playbook("up")
    plan = make_plan(loaded, inv, pb, repo_spec.root)
    path = f"/nvme/engram-local/{REV}/engram-manifest.json"
    shell = Shell({"reddie": {path: manifest()}, "bluey": {path: manifest(verified=False)}})
    ctx = RunContext(repo_spec, loaded, inv, pb, plan, shell, Record("r", "up", "dcp2", "lab", "up"), Events(),
                     RunOptions(), tmp_path)
    result = drive(ctx, STEPS["engram"](ctx, Step(step="engram")))
    assert (result.status, result.summary) == ("warn", "ranks on NFS: 1, 2, 3")
    assert [(f.node, f.status) for f in result.findings] == [("reddie", "ok"), ("asusi", "warn"), ("bluey", "warn"),
                                                            ("spark4", "warn")]
