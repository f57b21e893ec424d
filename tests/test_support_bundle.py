"""`sparkfleet support-bundle`: what it holds, its manifest, and that a planted secret appears nowhere in it."""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.fleet.nodefacts import Container
from sparkfleet.fleet.transport import Result, RunEachByRun
from tests.test_checks import fake_fleet, healthy, lane  # noqa: F401 - fake_fleet is a fixture

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
HF = "hf_PlantedSecretToken0123456789"
API = "sk-planted-api-key-0123456789abcdef"
OTHER = "s3cr3t-passw0rd-value"
RUN = "20261201-093000-a1b2c3"


class LogTransport(RunEachByRun):
    """`docker logs` of the lane's containers answers lines that carry the planted secrets."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.closed = False

    def run(self, nodes, command, *, stdin=None, timeout_s=60.0, env=None):
        self.commands.append(command)
        return {n.name: Result(n.name, True, stdout=(
            f"INFO serving on 0.0.0.0:8410\nDEBUG request headers: Authorization: Bearer {API}\n"
            f"ERROR download failed with token={HF} for {n.name}\nRuntimeError: CUDA error: out of memory\n"))
            for n in nodes}

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo_spec, fake_fleet) -> dict:  # noqa: F811
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("HF_TOKEN", HF)
    monkeypatch.setenv("MY_DB_PASSWORD", OTHER)
    runs = tmp_path / "state" / "runs"
    runs.mkdir(parents=True)
    record = {"run_id": RUN, "playbook": "up", "profile": "dcp2", "inventory": "lab", "outcome": "failed",
              "reason": "wait_ready: rank 0 logged a fatal line: RuntimeError: CUDA error: out of memory",
              "command": f"sparkfleet up --profile dcp2 --api-key {API}", "steps": [],
              "data": {"overrides": {"flags.--gpu-memory-utilization": 0.78},
                       "env": {"HF_TOKEN": HF, "NCCL_DEBUG": "INFO"},
                       "last_log_lines": {"0": ["loading weights", f"using HF token {HF}",
                                                "RuntimeError: CUDA error: out of memory"]}}}
    (runs / f"{RUN}.json").write_text(json.dumps(record))
    (runs / "20261130-080000-000000.json").write_text(json.dumps({**record, "run_id": "20261130-080000-000000"}))
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    for i, node in enumerate(["reddie", "asusi", "bluey", "spark4"]):
        facts[node].docker.containers.append(Container(
            id=f"c{i}", name=f"sf-dcp2-r{i}", image="x", state="running",
            labels={"sparkfleet.profile": "dcp2", "sparkfleet.rank": str(i), "sparkfleet.run": RUN}))
    fake_fleet["facts"] = facts
    fake_fleet["transport"] = LogTransport()
    return {"fleet": fake_fleet, "out": tmp_path / "bundle.tar.gz"}


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_bundle_holds_the_run_and_no_planted_secret(planted, capsys) -> None:
    assert main(["support-bundle", "--root", str(REPO), "--out", str(planted["out"])]) == 0  # the newest run
    assert f"support bundle for run {RUN}" in capsys.readouterr().out
    raw = planted["out"].read_bytes()
    members = _members(planted["out"])
    top = f"sparkfleet-support-{RUN}/"
    assert sorted(members) == [top + n for n in ("facts.json", "logs.json", "manifest.json", "plan.json",
                                                "profile.json", "record.json", "versions.json")]
    everything = gzip.decompress(raw) + b"".join(members.values())
    for secret in (HF, API, OTHER):
        assert secret.encode() not in everything, secret
    manifest = json.loads(members[top + "manifest.json"])
    assert manifest["run_id"] == RUN and manifest["not_collected"] == {}
    for f in manifest["files"]:
        assert hashlib.sha256(members[top + f["name"]]).hexdigest() == f["sha256"] and f["what"]
    record = json.loads(members[top + "record.json"])
    # read through the typed record: a schema-1 record (no schema_version) keeps the keys schema 4 no longer
    # names under data.legacy
    assert record["schema_version"] == 1 and record["outcome"] == "failed"
    assert record["data"]["legacy"]["env"] == {"HF_TOKEN": "***", "NCCL_DEBUG": "INFO"}
    assert record["command"] == "sparkfleet up --profile dcp2 --api-key ***"
    logs = json.loads(members[top + "logs.json"])
    assert logs["rank0"] == ["loading weights", "using HF token ***", "RuntimeError: CUDA error: out of memory"]
    assert logs["rank2-bluey-now"][1:] == ["DEBUG request headers: Authorization: Bearer ***",
                                           "ERROR download failed with token=*** for bluey",
                                           "RuntimeError: CUDA error: out of memory"]
    assert set(logs) == {"rank0", "rank0-reddie-now", "rank1-asusi-now", "rank2-bluey-now", "rank3-spark4-now"}
    profile = json.loads(members[top + "profile.json"])
    assert profile["overrides"] == {"flags.--gpu-memory-utilization": 0.78}
    assert profile["profile"]["flags"]["--gpu-memory-utilization"] == 0.78  # the run's -o, applied
    plan = json.loads(members[top + "plan.json"])
    assert [r["node"] for r in plan["ranks"]] == ["reddie", "asusi", "bluey", "spark4"]
    assert json.loads(members[top + "facts.json"])["asusi"]["hostname"]
    assert json.loads(members[top + "versions.json"])["sparkfleet"]
    assert any("docker logs --tail 200 c1" in c for c in planted["fleet"]["transport"].commands)
    assert (planted["out"].stat().st_mode & 0o777) == 0o600


def test_no_fleet_contacts_nothing_and_says_so(planted, capsys, monkeypatch) -> None:
    import sparkfleet.fleet.connect as connect

    monkeypatch.setattr(connect, "transport_for", lambda *a, **k: pytest.fail("a node was contacted"))
    assert main(["support-bundle", "--root", str(REPO), "--run", RUN, "--no-fleet", "--json",
                 "--out", str(planted["out"])]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["not_collected"] == {"facts.json": "not collected (--no-fleet)"}
    assert HF.encode() not in gzip.decompress(planted["out"].read_bytes())


def test_unknown_run_is_one_line_exit_2(planted, capsys) -> None:
    assert main(["support-bundle", "--root", str(REPO), "--run", "nosuch", "--out", str(planted["out"])]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparkfleet: no run 'nosuch' in ") and err.count("\n") == 1
    assert not planted["out"].exists()


def test_a_record_of_a_newer_schema_is_refused_by_the_bundle_and_runs_show(planted, capsys, tmp_path) -> None:
    """Both read through the typed record (runner/record.py read_record): a schema this sparkfleet does not know
    is one line, exit 2, and no bundle."""
    path = tmp_path / "state" / "runs" / f"{RUN}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema_version": 99}))
    assert main(["support-bundle", "--root", str(REPO), "--run", RUN, "--out", str(planted["out"])]) == 2
    assert "schema_version 99 is newer than this sparkfleet reads" in capsys.readouterr().err
    assert not planted["out"].exists()
    assert main(["runs", "show", RUN]) == 2
    assert "schema_version 99 is newer than this sparkfleet reads" in capsys.readouterr().err
