"""Failure modes guarded in what `sparkfleet plan` renders, caused through `plan` itself (no node is touched):
FM-55 (the Station lanes' long-prefill threshold) and FM-49 (every launch script sparkfleet renders is
valid shell, run under `set -u`); and FM-60, refused by `bracket` from its bars file before anything runs."""

from __future__ import annotations

import json
import subprocess

import pytest

from sparkfleet.cli.main import main
from sparkfleet.opsdir import Spec
from tests.conftest import REPO

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


def plan(capsys, profile: str) -> tuple[int, dict | None]:
    code = main(["plan", "--profile", profile, "--inventory", "lab", "--json"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if code == 0 else None)


def lanes() -> list[tuple[str, str]]:
    """(name, engine) of every lane that is not a base."""
    sp = Spec(REPO)
    out = []
    for name in sp.profile_names():
        p = sp.profile(name).profile
        if not p.abstract:
            out.append((name, p.engine))
    return out


def launches(doc: dict) -> list[dict]:
    return [s for s in doc["steps"] if s["step"] == "launch"]


STATION_VLLM = [n for n, engine in lanes() if n.startswith("gb300-") and engine == "vllm"]


@pytest.mark.parametrize("profile", STATION_VLLM)
def test_every_station_vllm_lane_launches_with_the_long_prefill_threshold(capsys, profile: str) -> None:
    """FM-55: a 972K prompt is 85 s of dead air for short requests without it; the seed's launch carries 6144."""
    code, doc = plan(capsys, profile)
    if code == 2:  # a lane the rules refuse (servable: false and the like) never launches at all
        pytest.skip(f"{profile} is refused by plan")
    (head,) = [x for x in launches(doc) if x["role"] == "head"]
    argv = head["argv"]
    at = argv.index("--long-prefill-token-threshold")
    assert argv[at + 1] == "6144"
    assert "--long-prefill-token-threshold 6144" in head["script"]


def test_every_rendered_launch_script_is_valid_shell_under_set_u(capsys, tmp_path) -> None:
    """FM-49: `set -u` killed the seeds' waiter. Every script `plan` renders for every lane parses (`bash -n`)
    and, with `docker` a stub that prints its arguments, runs to the end under `set -eu`."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "docker").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > /dev/null\n')
    (stub / "docker").chmod(0o755)
    checked = 0
    for name, _engine in lanes():
        code, doc = plan(capsys, name)
        if code != 0:
            continue
        for launch in launches(doc):
            script = "set -eu\n" + launch["script"]
            assert subprocess.run(["bash", "-n", "-c", script], capture_output=True).returncode == 0, (name, launch)
            ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                                 env={"PATH": f"{stub}:/usr/bin:/bin"})
            assert ran.returncode == 0, (name, launch["rank"], ran.stderr)
            checked += 1
    assert checked >= 20  # every servable lane's every rank


def test_bracket_refuses_an_acceptance_bar_on_too_few_requests_before_anything_runs(tmp_path, capsys) -> None:
    """FM-60: an acceptance gate on 8 prompts a class is noise. `bracket` refuses the bars file with exit 2,
    naming the file, the cell and the count, before any lane is touched (no inventory is even read)."""
    bars = tmp_path / "bars.yaml"
    bars.write_text("bench: {concurrency: [1, 8], categories: [code]}\nbars:\n  aggregate.C1: '>= -2%'\n"
                    "  acceptance.code.C8: '>= 3.0'\n")
    code = main(["bracket", "--control", "dcp2", "--candidate", "dcp1", "--bars", str(bars), "--inventory",
                 "no-such-inventory"])
    err = capsys.readouterr().err
    assert code == 2
    assert (f"{bars}: acceptance.code.C8: an acceptance bar on 8 request(s) (C8 x 1 category) is noise: it needs at "
            "least 200 (docs/failure-modes.md FM-60)") in err
    ok = tmp_path / "ok.yaml"  # 25 streams of each of the eight categories: 200 requests
    ok.write_text("bench: {concurrency: [25]}\nbars:\n  acceptance.C25: '>= 3.0'\n")
    from sparkfleet.bench.bracket import load_bars

    assert [k.text for k, _ in load_bars(ok).bars] == ["acceptance.C25"]
