"""`sparkfleet bracket`: bars files and rules, verdicts, and CTL → CAND → CTL windows.

THE LANES ARE SIMULATIONS: sim engines started directly (drifting controls, a passing window) and the
simulated lab through the real runner (`up`/`down` playbooks) for the CLI window, with the lanes moved
to free ports in a copied ops root.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from sparkfleet.bench import bracket as br
from sparkfleet.bench.promptsets import PromptSet
from sparkfleet.bench.runner import BenchOptions, BenchResult, Cell, run_bench
from sparkfleet.cli.main import main
from tests import cli_run
from tests.conftest import engram_copies
from tests.test_simengine_util import Lane, free_port

PROSE = """
name: bracket-prose
prompts:
  - id: rivers
    category: prose
    max_tokens: 40
    text: "Write a few sentences about rivers and the towns that grew up along them."
"""
DRAFTER = "control_mean * (1 - max(2%, 1.5 * control_spread))"


def write_bars(tmp: Path, body: str) -> Path:
    (tmp / "prose.yaml").write_text(PROSE)
    path = tmp / "bars.yaml"
    path.write_text(body.replace("PROSE_SET", str(tmp / "prose.yaml")))
    return path


def result_with(values: dict[tuple[str, int], float]) -> BenchResult:
    """A bench result holding only per-stream decode and aggregate numbers (pure verdict tests)."""
    res = BenchResult("http://x", "m", {"categories": ["code", "prose"], "ceilings": []}, {}, "now")
    for (cat, c), v in values.items():
        res.cells.append(Cell(cat, c, False, aggregate_tps=v * c, decode_tps=v, ttft_s=0.2))
    return res


# ---------------------------------------------------------------------------------------------- rules


def test_rules_parse_and_compute_their_thresholds() -> None:
    rel = br.Rule.parse(">= -2%", "t")
    assert rel.kind == "relative" and rel.threshold(100.0, 0.0) == pytest.approx(98.0) and rel.passes(98.0, 98.0)
    assert not rel.passes(97.9, rel.threshold(100.0, 0.0))
    ceiling = br.Rule.parse("<= +10%", "t")  # TTFT: lower is better
    assert ceiling.passes(1.09, ceiling.threshold(1.0, 0.0)) and not ceiling.passes(1.11, ceiling.threshold(1.0, 0.0))
    absolute = br.Rule.parse(">= 105", "t")  # GATE-13: "prose >= 105"
    assert absolute.threshold(500.0, 0.3) == 105 and not absolute.passes(104.0, 105)
    drafter = br.Rule.parse(DRAFTER, "t")
    # controls 100 and 98: mean 99, spread 2.02%; 1.5 x spread = 3.03% beats the 2% floor
    spread = 2 / 99
    assert drafter.threshold(99.0, spread) == pytest.approx(99 * (1 - 1.5 * spread))
    assert drafter.threshold(99.0, 0.005) == pytest.approx(99 * 0.98)  # tight controls: the 2% floor
    for bad in ("> 2%", "about the same", "control_mean * 0.98"):
        with pytest.raises(br.BarsError, match="is not"):
            br.Rule.parse(bad, "bars.yaml: decode.C1")


def test_bars_files_are_checked_before_anything_runs(tmp_path) -> None:
    good = write_bars(tmp_path, f"drift_band: 2.5%\nbench: {{prompt_set: PROSE_SET, concurrency: [1, 8]}}\n"
                                f"bars:\n  aggregate.C1: '>= -2%'\n  decode.prose.C8: '{DRAFTER}'\n")
    bars = br.load_bars(good)
    assert bars.drift_band == 0.025 and bars.bench.concurrency == (1, 8) and len(bars.bars) == 2
    assert [k.text for k, _ in bars.bars] == ["aggregate.C1", "decode.prose.C8"]
    for body, why in [("bars: {aggregate.C4: '>= -2%'}\nbench: {concurrency: [1]}\n", "C4 is not in the bench"),
                      ("bars: {speed.C1: '>= -2%'}\n", "is not METRIC"),
                      ("bars: {aggregate.C1: 'faster'}\n", "is not '>= -2%'"),
                      ("bars: {prefill.8192: '>= -5%'}\n", "does not run prefill"),
                      ("bars: {}\n", "non-empty 'bars'"),
                      ("drift_band: wide\nbars: {aggregate.C1: '>= -2%'}\n", "expected a percentage"),
                      ("bench: {concurency: [1]}\nbars: {aggregate.C1: '>= -2%'}\n", "unknown key")]:
        (tmp_path / "b.yaml").write_text(body)
        with pytest.raises(br.BarsError, match=why):
            br.load_bars(tmp_path / "b.yaml")
    assert main(["bracket", "--control", "dcp2", "--candidate", "dcp1", "--bars", str(tmp_path / "b.yaml")]) == 2


def test_judge_reads_the_candidate_against_the_mean_of_its_controls(tmp_path) -> None:
    bars = br.load_bars(write_bars(tmp_path, f"drift_band: 3%\nbench: {{concurrency: [1, 8]}}\nbars:\n"
                                             f"  decode.code.C1: '{DRAFTER}'\n  decode.C8: '>= -2%'\n"))
    ctl1 = result_with({("code", 1): 100.0, ("prose", 1): 50.0, ("code", 8): 40.0, ("prose", 8): 20.0})
    ctl2 = result_with({("code", 1): 98.0, ("prose", 1): 50.0, ("code", 8): 40.0, ("prose", 8): 20.0})
    near = result_with({("code", 1): 96.5, ("prose", 1): 50.0, ("code", 8): 39.2, ("prose", 8): 19.8})
    cells, invalid = br.judge(bars, ctl1, near, ctl2)
    assert invalid == []
    c1, c8 = cells
    # controls 100 and 98: mean 99, spread 2.02%, bar 99 x (1 - 1.5 x 2.02%) = 96.0
    assert (c1.control_mean, round(c1.spread, 4), round(c1.threshold, 2), c1.verdict) == (99.0, 0.0202, 96.0, "pass")
    assert (c8.control_mean, c8.candidate, round(c8.threshold, 2), c8.verdict) == (30.0, 29.5, 29.4, "pass")
    assert round(c8.change, 4) == -0.0167
    slower = result_with({("code", 1): 95.0, ("prose", 1): 50.0, ("code", 8): 38.0, ("prose", 8): 19.0})
    cells, _ = br.judge(bars, ctl1, slower, ctl2)
    assert [c.verdict for c in cells] == ["fail", "fail"]  # 95 < 96.0; 28.5 < 29.4
    drifted = result_with({("code", 1): 90.0, ("prose", 1): 50.0, ("code", 8): 40.0, ("prose", 8): 20.0})
    cells, invalid = br.judge(bars, ctl1, near, drifted)
    assert cells[0].verdict == "drift" and len(invalid) == 1 and "beyond the 3.0% drift band" in invalid[0]


# ---------------------------------------------------------------------------------------------- windows on sim engines


class SimLanes:
    """Lanes as sim engines started directly; each `up` of a profile takes its next decode rate."""

    def __init__(self, tmp: Path, rates: dict[str, list[float]]) -> None:
        self.tmp, self.rates = tmp, {k: list(v) for k, v in rates.items()}
        self.running: dict[str, Lane] = {}
        self.log: list[str] = []

    def up(self, profile: str) -> str:
        rate = self.rates[profile].pop(0)
        if rate <= 0:
            self.log.append(f"up {profile} failed")
            raise br.BracketError(f"up {profile}: failed: wait_ready: the head exited (simulated)")
        lane = Lane(self.tmp, world=1, boot=0.1, name=f"{profile}-{len(self.log)}", served=("m",),
                    extra=["--max-num-seqs", "16", "--decode-tokens-per-s", str(rate)])
        lane.start(0)
        lane.wait_health()
        self.running[profile] = lane
        self.log.append(f"up {profile} @{rate:g}")
        return lane.url

    def down(self, profile: str) -> None:
        lane = self.running.pop(profile, None)
        if lane is not None:
            lane.stop()
        self.log.append(f"down {profile}")

    def close(self) -> None:
        for lane in self.running.values():
            lane.stop()


def bench(endpoint: str, opts: BenchOptions, pset: PromptSet, arm: str) -> BenchResult:
    return run_bench(endpoint, pset, opts)


# Per-stream decode at C1 only (it does not depend on when the first token comes, which a busy machine
# moves), half a second per stream, with a wide bar: these windows test the bracket, not the engine.
BARS = """drift_band: 10%
bench: {prompt_set: PROSE_SET, concurrency: [1], ignore_eos: true, max_tokens: 61}
bars:
  decode.prose.C1: ">= -10%"
"""


def test_a_bracket_whose_controls_drift_is_declared_invalid(tmp_path) -> None:
    lanes = SimLanes(tmp_path, {"ctl": [120.0, 80.0], "cand": [120.0]})  # the control comes back a third slower
    try:
        res = br.run_bracket("ctl", "cand", br.load_bars(write_bars(tmp_path, BARS)), lanes, bench)
    finally:
        lanes.close()
    assert lanes.log == ["up ctl @120", "down ctl", "up cand @120", "down cand", "up ctl @80"]
    assert not res.window_valid and not res.passed and res.serving == "ctl" and res.promoted is False
    assert all(c.verdict == "drift" for c in res.cells), res.cells
    assert res.cells[0].spread > 0.3 and "drift band" in res.invalid_reasons[0]
    assert res.decision.startswith("WINDOW INVALID") and "Nothing was promoted" in res.decision


def test_a_window_with_steady_controls_passes_and_leaves_the_decision_to_a_person(tmp_path, capsys) -> None:
    lanes = SimLanes(tmp_path, {"ctl": [120.0, 120.0], "cand": [120.0]})
    try:
        res = br.run_bracket("ctl", "cand", br.load_bars(write_bars(tmp_path, BARS)), lanes, bench)
    finally:
        lanes.close()
    assert res.window_valid and res.passed, (res.invalid_reasons, res.cells)
    assert [c.verdict for c in res.cells] == ["pass"]
    assert "Promotion is a person's decision" in res.decision and "sparkfleet up --profile cand" in res.decision
    assert res.serving == "ctl" and res.promoted is False
    from sparkfleet.cli.bench import show_bracket

    show_bracket(res)
    shown = capsys.readouterr().out
    assert "decode.prose.C1" in shown and "PASS" in shown and "window: VALID" in shown
    assert "DECISION (for a person): The candidate cand passed all 1 pre-registered bar(s)" in shown


# ---------------------------------------------------------------------------------------------- through the runner


def test_bracket_cli_on_the_sim_lab_fails_a_slow_candidate_and_ends_with_the_control_serving(
        tmp_path, ops_root, monkeypatch, capsys) -> None:
    from sparkfleet.cli import bench as cli_bench
    from sparkfleet.sim import lab

    # The lanes on ports of their own (a copied ops root), not the production 8410/29551 that other
    # tests' lanes use: a lane of theirs answering on 8410 would pass for ours.
    port, master = free_port(), free_port()
    for name, old, new in (("production-1.2.yaml", "port: 8410", f"port: {port}"),
                           ("spark-vllm.yaml", "master_port: 29551", f"master_port: {master}")):
        path = ops_root / "profiles" / name
        assert old in path.read_text()
        path.write_text(path.read_text().replace(old, new))
    monkeypatch.setenv("SPARKFLEET_ROOT", str(ops_root))
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    bars = tmp_path / "bars.yaml"
    # The lab's engines step every 10 ms with ~3 tokens per step; a wrong-commit engine (garbage-tokens)
    # has its drafts refused and makes one token per step: about a third of the speed.
    # Wide drift band (50%: a fresh-clone CI run saw the two controls 34% apart at C2) and per-stream bars: the
    # lab's 10 ms steps are sleeps that a loaded machine stretches; the candidate runs at about a third.
    bars.write_text(f"drift_band: 50%\nbench: {{categories: [prose], concurrency: [1, 2], max_tokens: 60, "
                    f"ignore_eos: true}}\nbars:\n  decode.prose.C1: '{DRAFTER}'\n  decode.prose.C2: '>= -10%'\n")
    sim = lab.up("lab")
    engram_copies(sim)
    up = cli_bench.RunnerLanes.up

    def up_with_a_slow_candidate(self, profile: str) -> str:
        if profile == "dcp1":  # the engine reads its faults when its container starts
            sim.fault("reddie", "garbage-tokens")
        try:
            return up(self, profile)
        finally:
            sim.heal("reddie")

    monkeypatch.setattr(cli_bench.RunnerLanes, "up", up_with_a_slow_candidate)
    try:
        code = main(["bracket", "--control", "dcp2", "--candidate", "dcp1", "--bars", str(bars), "--inventory", "sim",
                     "--gates", "models", "--poll", "0.2", "--probe-seconds", "1", "--json", "--out",
                     str(tmp_path / "out")])
        res = json.loads(capsys.readouterr().out)
        docker = {n: cli_run.node_containers(sim, n) for n in ("reddie", "asusi", "bluey", "spark4")}
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
        # the control serves: bench it by its profile alone (endpoint from the inventory), probing first
        from sparkfleet.fleet.nodeside import clock_probe

        image_load = clock_probe.image_load
        monkeypatch.setattr(clock_probe, "image_load", lambda image, seconds=0.5: image_load(image, 0.5))  # a short load
        bench_code = main(["bench", "--profile", "dcp2", "--inventory", "sim", "--probe", "--concurrency", "1",
                           "--categories", "prose", "--max-tokens", "12", "--no-warmup", "--json",
                           "--out", str(tmp_path / "bench")])
        benched = json.loads(capsys.readouterr().out)
    finally:
        capsys.readouterr()
        lab.down()  # stops every engine the lab started
    assert code == 1
    assert [a["arm"] for a in res["arms"]] == ["control-1", "candidate", "control-2"]
    assert all(a["error"] is None and a["bench_ok"] for a in res["arms"]), res["arms"]
    assert res["window_valid"], res["invalid_reasons"]
    assert [c["verdict"] for c in res["cells"]] == ["fail", "fail"], res["cells"]
    assert all(c["candidate"] < 0.6 * c["control_mean"] for c in res["cells"])
    assert res["serving"] == "dcp2" and res["promoted"] is False and "FAILED 2 of 2" in res["decision"]
    lanes = {n: {c["Config"]["Labels"].get("sparkfleet.profile") for c in cs if c["State"]["Running"]}
             for n, cs in docker.items()}
    assert lanes == {n: {"dcp2"} for n in docker} and health == 200  # the control serves, the candidate is gone
    saved = json.loads((tmp_path / "out" / "bracket.json").read_text())
    assert saved["cells"] == res["cells"]
    assert all((tmp_path / "out" / arm / "results.json").is_file() for arm in ("control-1", "candidate", "control-2"))
    assert bench_code == 0 and benched["endpoint"] == f"http://127.0.0.1:{port}" and benched["model"] == "deepseek-v4.1-flash"
    assert set(benched["probe"]["nodes"]) == {"reddie", "asusi", "bluey", "spark4"}
    assert "reddie: clock " in benched["probe"]["summary"]
    assert any(c.startswith("Clock latch / slow state probed before the run: ") for c in benched["caveats"])


def test_a_candidate_that_does_not_come_up_leaves_the_control_serving(tmp_path) -> None:
    lanes = SimLanes(tmp_path, {"ctl": [120.0, 120.0], "cand": [0.0]})
    try:
        res = br.run_bracket("ctl", "cand", br.load_bars(write_bars(tmp_path, BARS)), lanes, bench)
    finally:
        lanes.close()
    assert lanes.log == ["up ctl @120", "down ctl", "up cand failed", "down cand", "up ctl @120"]
    assert res.serving == "ctl" and not res.window_valid and res.cells == []
    assert res.invalid_reasons == ["candidate (cand): up cand: failed: wait_ready: the head exited (simulated)"]
    assert [a.error is None for a in res.arms] == [True, False, True]
