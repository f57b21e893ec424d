"""The operator's habits: output that fits 80 columns, -o overrides, per-user config, the command index."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path

import pytest

from sparkfleet.cli import main as cli_main
from sparkfleet.cli.main import main
from sparkfleet.cli.tables import Column, lines
from sparkfleet.fleet.nodefacts import EarlyOom
from tests.test_checks import fake_fleet, healthy, lane  # noqa: F401 - fake_fleet is a fixture

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent
BOX = re.compile("[\u2500-\u257f]")  # box-drawing characters


@pytest.fixture
def at80(monkeypatch: pytest.MonkeyPatch):
    from sparkfleet.cli.common import out

    monkeypatch.setattr(out, "width", 80)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    return out


def assert_fits(text: str, cells: list[str], width: int = 80) -> None:
    """No line longer than the width, no box drawing or escape codes, every word of every cell whole."""
    for line in text.splitlines():
        assert len(line) <= width, f"line of {len(line)} chars: {line!r}"
    assert not BOX.search(text) and "\x1b[" not in text
    words = set(text.split())
    for cell in cells:
        for word in cell.split():
            if len(word) <= 30:  # longer tokens (paths, digests) may be split to fit; words never are
                assert word in words, f"word {word!r} of {cell!r} was cut"


def assert_columns_not_narrower_than_headers(text: str, headers: list[str]) -> None:
    """In table layout the dashed rule under the header gives each column's width."""
    rows = text.splitlines()
    for i, line in enumerate(rows):
        if line.split()[:len(headers)] == headers[:len(line.split())] and i + 1 < len(rows) \
                and set(rows[i + 1].replace(" ", "")) == {"-"}:
            widths = [len(seg) for seg in rows[i + 1].split("  ") if seg]
            shown = line.split()
            assert len(widths) == len(shown)
            for header, w in zip(shown, widths, strict=True):
                assert w >= len(header), f"column {header!r} is {w} wide"
            return
    raise AssertionError("no header line with a rule under it")


def test_profiles_fit_80_columns(at80, capsys: pytest.CaptureFixture) -> None:
    from sparkfleet.opsdir import Spec

    assert main(["profiles", "--root", str(REPO)]) == 0
    text = capsys.readouterr().out
    sp = Spec(REPO)
    descriptions = [sp.profile(n).profile.description for n in sp.profile_names()
                    if not sp.profile(n).profile.abstract]
    assert_fits(text, descriptions)
    assert_columns_not_narrower_than_headers(text, ["profile", "engine", "group", "port", "servable", "extends"])
    # the failure: a description wrapped to a handful of characters per line
    assert "description: Production, DCP2, 6 GiB KV: 1,888,800 tokens at 500K context" in text


def test_profiles_wide_is_one_line_per_lane(at80, capsys: pytest.CaptureFixture) -> None:
    assert main(["profiles", "--root", str(REPO), "--wide"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("dcp2 "))
    assert row.split()[:6] == ["dcp2", "vllm", "sparks", "8410", "yes", "production-1.2"]
    assert row.endswith("Production, DCP2, 6 GiB KV: 1,888,800 tokens at 500K context")
    assert max(len(line) for line in text.splitlines()) > 80


def test_check_fits_80_columns_one_block_per_finding(at80, repo_spec, fake_fleet, capsys) -> None:  # noqa: F811
    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["asusi"].earlyoom = EarlyOom(running=False)
    fake_fleet["facts"] = facts
    assert main(["check", "--root", str(REPO), "--profile", "dcp2"]) == 1
    text = capsys.readouterr().out
    doc_findings = _check_json(fake_fleet, capsys)
    cells = [f.get(k) or "" for f in doc_findings for k in ("message", "observed", "expected", "remedy")]
    assert_fits(text, cells)
    assert_columns_not_narrower_than_headers(text, ["node", "check", "status"])
    lines_ = text.splitlines()
    head = next(i for i, line in enumerate(lines_) if line.split()[:3] == ["asusi", "earlyoom", "FAIL"])
    block = "\n".join(lines_[head:head + 12])
    assert "    finding:  earlyoom is not running" in block and "    remedy:" in block
    assert re.search(r'EARLYOOM_ARGS="-m\s*2"', block.replace("\n", " "))


def _check_json(fake_fleet, capsys) -> list[dict]:  # noqa: F811
    assert main(["check", "--root", str(REPO), "--profile", "dcp2", "--json"]) == 1
    return json.loads(capsys.readouterr().out)["findings"]


def test_status_and_runs_fit_80_columns(at80, capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkfleet.cli.observe import print_status

    rows = [{"node": n, "profile": "exl3tp4b-ablit-best", "rank": i, "run": "20261201-093000-a1b2c3",
             "container": f"sparkfleet-exl3tp4b-ablit-best-r{i}", "id": "x", "state": "running",
             "started_at": "2026-12-01T09:30:02.123456789Z", "simulated": False}
            for i, n in enumerate(["reddie", "asusi", "bluey", "spark4"])]
    rows.append({"node": "station", "error": "station: no answer from root@10.0.0.5:22 within 10s (node down, "
                 "link down or firewalled); check the node and its network"})
    print_status(rows, {})
    text = capsys.readouterr().out
    assert_fits(text, [r.get("container", "") for r in rows] + [rows[-1]["error"]])
    assert "reason:" in text  # the row is too wide for 80 columns: blocks, the reason below its row

    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path))
    runs = tmp_path / "runs"
    runs.mkdir()
    reason = ("rank 2 on bluey: container exited with status 1 after 312 s: RuntimeError: NCCL error: "
              "unhandled system error (run with NCCL_DEBUG=INFO for details)")
    for i, (outcome, why) in enumerate([("ok", ""), ("failed", reason)]):
        rid = f"20261201-09{i}000-abc12{i}"
        (runs / f"{rid}.json").write_text(json.dumps({
            "run_id": rid, "playbook": "up", "profile": "exl3tp4b-ablit-best", "inventory": "lab",
            "outcome": outcome, "reason": why, "duration_s": 412.5, "steps": [], "started": 0}))
    assert main(["runs"]) == 0
    text = capsys.readouterr().out
    assert_fits(text, [reason])
    assert_columns_not_narrower_than_headers(text, ["run", "playbook", "profile", "outcome", "seconds"])


def test_layouts_pick_table_blocks_records() -> None:
    cols = [Column("node"), Column("check"), Column("note", wrap=True)]
    rows = [["reddie", "memory", "MemAvailable is 80 GiB, below the 100 GiB floor for a worker after drop"]]
    table = [t.plain for t in lines(cols, rows, 80)]
    assert table[0].split() == ["node", "check", "note"] and len(table) == 4  # the note wraps onto a 2nd line
    assert all(len(x) <= 80 for x in table)
    blocks = [t.plain for t in lines(cols, rows, 40)]
    assert blocks[2] == "reddie  memory" and blocks[3].startswith("    note: MemAvailable")
    # fixed columns that do not fit the first line go below it, rightmost first
    moved = [t.plain for t in lines([Column("a" * 30), Column("b" * 30)], [["x", "y"]], 40)]
    assert moved == ["a" * 30, "-" * 30, "x", "    " + "b" * 30 + ": y"]
    records = [t.plain for t in lines([Column("name"), Column("size")], [["x" * 30, "1"]], 20)]
    assert records == ["name: " + "x" * 14, "      " + "x" * 14, "      xx", "    size: 1"]


def test_colour_only_when_asked(repo_spec, fake_fleet, capsys, monkeypatch) -> None:  # noqa: F811
    """Piped output has no escape codes; --color always brings them (a fresh console sees FORCE_COLOR)."""
    from sparkfleet.cli import common

    profile, inv, plan = lane(repo_spec, "dcp2")
    facts = healthy(profile, inv, plan)
    facts["asusi"].earlyoom = EarlyOom(running=False)
    fake_fleet["facts"] = facts
    # main() sets FORCE_COLOR for --color always: setenv first so teardown restores the variables as they were
    for name in ("FORCE_COLOR", "NO_COLOR"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(common.out, "_console", None)
    monkeypatch.setattr(common.err, "_console", None)  # teardown puts the earlier consoles back
    assert main(["check", "--root", str(REPO), "--profile", "dcp2"]) == 1
    assert "\x1b[" not in capsys.readouterr().out
    monkeypatch.setattr(common.out, "_console", None)
    assert main(["--color", "always", "check", "--root", str(REPO), "--profile", "dcp2"]) == 1
    assert "\x1b[1;31mFAIL" in capsys.readouterr().out


# -- -o / --set -----------------------------------------------------------------------------------------

def test_plan_overrides_are_applied_shown_and_in_json(capsys) -> None:
    args = ["plan", "--root", str(REPO), "--profile", "dcp2", "-o", "flags.--gpu-memory-utilization=0.78",
            "--set", "env.NCCL_DEBUG=INFO", "-o", "expect.kv_tokens=1888800"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "override flags.--gpu-memory-utilization = 0.78 (from -o)" in text
    assert "override env.NCCL_DEBUG = 'INFO' (from -o)" in text
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["overrides"] == {"flags.--gpu-memory-utilization": 0.78, "env.NCCL_DEBUG": "INFO",
                                "expect.kv_tokens": 1888800}
    launches = [s for s in doc["steps"] if s["step"] == "launch"]
    assert launches and all("--gpu-memory-utilization 0.78" in s["script"] for s in launches)
    assert all("NCCL_DEBUG=INFO" in s["script"] for s in launches)
    assert main(["plan", "--root", str(REPO), "--profile", "dcp2", "--json"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert "overrides" not in base and not any("--gpu-memory-utilization 0.78" in s.get("script", "")
                                               for s in base["steps"])


@pytest.mark.parametrize("override, message", [
    ("expect.kv_tokenz=1", "sparkfleet: -o expect.kv_tokenz=1: expect.kv_tokenz: no field 'kv_tokenz' in expect "
     "(fields: kv_tokens, moe_backend, engram_node_local, mem_available_floor_gb, boot_budget_s, stall_s, log_lines)"),
    ("tp=four", "sparkfleet: -o tp=four: tp: Input should be a valid integer, unable to parse string as an "
     "integer (got 'four')"),
    ("flags.gpu=1", "sparkfleet: -o flags.gpu=1: flags.gpu: 'gpu' is not a flag name (expected --name)"),
    ("tp", "sparkfleet: -o tp: expected KEY=VALUE with a dotted KEY (e.g. -o flags.--max-num-seqs=8)"),
])
@pytest.mark.parametrize("command", ["plan", "check", "up", "bench"])
def test_bad_override_is_one_line_exit_2_nothing_contacted(command, override, message, capsys, monkeypatch,
                                                           tmp_path) -> None:
    import sparkfleet.fleet.connect as connect

    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path))
    monkeypatch.setattr(connect, "transport_for", lambda *a, **k: pytest.fail("a node was contacted"))
    assert main([command, "--root", str(REPO), "--profile", "dcp2", "-o", override]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == message and "Traceback" not in captured.err
    assert not (tmp_path / "runs").exists()  # no record claims anything


def test_overrides_kept_in_the_restore_point(tmp_path: Path) -> None:
    from sparkfleet.opsdir import Spec
    from sparkfleet.schema.overrides import as_mapping, from_mapping, parse

    sp = Spec(REPO)
    loaded = sp.profile("dcp2", parse(["flags.--gpu-memory-utilization=0.78", "env.NCCL_DEBUG=!unset"]))
    recorded = json.loads(json.dumps(as_mapping(loaded.overrides)))
    assert recorded == {"flags.--gpu-memory-utilization": 0.78, "env.NCCL_DEBUG": "!unset"}
    again = sp.profile("dcp2", from_mapping(recorded))
    assert again.profile == loaded.profile and again.profile.flags["--gpu-memory-utilization"] == 0.78


# -- per-user config ------------------------------------------------------------------------------------

def test_default_inventory_from_env_then_file(tmp_path: Path, monkeypatch, capsys) -> None:
    inv = tmp_path / "mine.yaml"
    inv.write_text((REPO / "inventories" / "lab.yaml").read_text().replace("name: lab", "name: mine"))
    conf = tmp_path / "config.yaml"
    conf.write_text("inventory: mine.yaml\nstate: st\n")
    monkeypatch.setenv("SPARKFLEET_CONFIG", str(conf))
    monkeypatch.delenv("SPARKFLEET_INVENTORY", raising=False)
    monkeypatch.delenv("SPARKFLEET_STATE", raising=False)
    assert main(["plan", "--root", str(REPO), "--profile", "dcp2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inventory"] == "mine"
    assert main(["config", "--json"]) == 0
    doc = {s["name"]: s for s in json.loads(capsys.readouterr().out)["settings"]}
    assert doc["inventory"]["value"] == str(inv) and doc["inventory"]["source"] == f"{conf}:1"
    assert doc["state"]["value"] == str(tmp_path / "st") and doc["state"]["source"] == f"{conf}:2"
    monkeypatch.setenv("SPARKFLEET_INVENTORY", "lab")
    assert main(["plan", "--root", str(REPO), "--profile", "dcp2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inventory"] == "lab"
    assert main(["config", "--json"]) == 0
    doc = {s["name"]: s for s in json.loads(capsys.readouterr().out)["settings"]}
    assert doc["inventory"]["source"] == "env SPARKFLEET_INVENTORY"
    assert main(["plan", "--root", str(REPO), "--profile", "dcp2", "--json", "-i", str(inv)]) == 0
    assert json.loads(capsys.readouterr().out)["inventory"] == "mine"


def test_config_file_with_an_unknown_key_is_one_line_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    conf = tmp_path / "config.yaml"
    conf.write_text("inventory: lab\ninventroy: sim\n")
    monkeypatch.setenv("SPARKFLEET_CONFIG", str(conf))
    monkeypatch.delenv("SPARKFLEET_INVENTORY", raising=False)
    assert main(["plan", "--root", str(REPO), "--profile", "dcp2"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"sparkfleet: {conf}:2: inventroy: unknown setting (known: inventory, root, state, ssh_config, fanout)")


@pytest.mark.parametrize("written, got", [("0", "0"), ("many", "'many'"), ("-3", "-3"), ("true", "True"),
                                          ("'²'", "'²'")])
def test_a_fanout_that_is_not_a_whole_number_is_one_line_exit_2(tmp_path: Path, monkeypatch, capsys, written: str,
                                                                  got: str) -> None:
    conf = tmp_path / "config.yaml"
    conf.write_text(f"inventory: lab\nfanout: {written}\n")
    monkeypatch.setenv("SPARKFLEET_CONFIG", str(conf))
    monkeypatch.delenv("SPARKFLEET_INVENTORY", raising=False)
    assert main(["plan", "--root", str(REPO), "--profile", "dcp2"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"sparkfleet: {conf}:2: fanout: expected a whole number >= 1 (most nodes a command talks to at once, over "
        f"SSH or in local shells), got {got}")
    conf.write_text("fanout: 16\n")
    assert main(["config", "--json"]) == 0
    doc = {s["name"]: s for s in json.loads(capsys.readouterr().out)["settings"]}
    assert doc["fanout"] == {"name": "fanout", "value": "16", "source": f"{conf}:1", "env": "SPARKFLEET_FANOUT"}


def test_sim_default_line(monkeypatch, tmp_path: Path) -> None:
    from sparkfleet.cli.sim import default_line

    monkeypatch.delenv("SPARKFLEET_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    monkeypatch.setenv("SPARKFLEET_STATE", "/tmp/my state")
    assert default_line() == "export SPARKFLEET_INVENTORY=sim SPARKFLEET_STATE='/tmp/my state'"
    monkeypatch.delenv("SPARKFLEET_STATE")
    assert default_line() == "export SPARKFLEET_INVENTORY=sim"


# -- the command index ----------------------------------------------------------------------------------

def test_command_index_matches_what_modules_register() -> None:
    registered = {}
    for module in cli_main.command_modules():
        sub = argparse.ArgumentParser().add_subparsers()
        module.register(sub)
        for name in sub.choices:
            registered[name] = module.__name__.rsplit(".", 1)[1]
    assert registered == {c: m for c, m in cli_main.COMMANDS.items() if c in registered}
    for command, module in cli_main.COMMANDS.items():  # an entry ahead of its module: that module is absent
        if command not in registered:
            assert importlib.util.find_spec(f"sparkfleet.cli.{module}") is None, (command, module)
