"""Station autotune cache: new hash dirs seeded from the newest configs; shape changes flagged."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from sparkfleet.runner import autotune
from tests.noderoot import run_in_root

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


def test_new_hash_dirs_are_seeded_with_the_newest_configs(tmp_path: Path) -> None:
    root = tmp_path / "R"  # the node's filesystem: the seed script runs with it as /
    cache = root / "home/milo/dsv41/vllm-cache/flashinfer"
    old, older, new = cache / "hash-old", cache / "hash-older", cache / "hash-new"
    for d in (old, older, new):
        d.mkdir(parents=True)
    (older / autotune.CONFIGS).write_text('{"configs": 1}')
    (old / autotune.CONFIGS).write_text('{"configs": 168}')
    past = time.time() - 3600
    os.utime(older / autotune.CONFIGS, (past - 10, past - 10))
    for d in (old, older):
        os.utime(d, (past, past))
    cmd = autotune.seed_command("/home/milo/dsv41/vllm-cache", 5)  # dirs made in the node's last 5 s
    out = run_in_root(root, ["bash", "-c", cmd], capture_output=True, text=True, check=True).stdout
    res = autotune.parse(out)
    assert res == {"source": "/home/milo/dsv41/vllm-cache/flashinfer/hash-old/autotune_configs.json",
                   "seeded": ["/home/milo/dsv41/vllm-cache/flashinfer/hash-new"]}
    assert (new / autotune.CONFIGS).read_text() == '{"configs": 168}'
    # a second poll seeds nothing more
    out = run_in_root(root, ["bash", "-c", cmd], capture_output=True, text=True, check=True).stdout
    assert autotune.parse(out)["seeded"] == []


def test_shape_changes_against_the_last_good_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    argv = ["docker", "run", "img", "--model", "/model", "--max-num-seqs", "24",
            "--speculative-config", '{"num_speculative_tokens":5}', "--cudagraph-capture-sizes", "1", "2", "4"]
    assert autotune.shape_changes(runs, "gb300-v23", argv) == []  # no earlier run: nothing to compare
    (runs / "20261118-1.json").write_text(json.dumps(
        {"profile": "gb300-v23", "outcome": "ok", "data": {"launches": [{"argv": argv}]}}))
    assert autotune.shape_changes(runs, "gb300-v23", argv) == []
    changed = [*argv[:-1], "8"]
    assert autotune.shape_changes(runs, "gb300-v23", changed) == ["--cudagraph-capture-sizes"]
    seats = [("16" if a == "24" else a) for a in argv]  # a new hash, the same shapes: seeding works ([000])
    assert autotune.shape_changes(runs, "gb300-v23", seats) == []
    failed_later = {"profile": "gb300-v23", "outcome": "failed", "data": {"launches": [{"argv": changed}]}}
    (runs / "20261118-2.json").write_text(json.dumps(failed_later))  # a failed run is not a baseline
    assert autotune.shape_changes(runs, "gb300-v23", changed) == ["--cudagraph-capture-sizes"]


def test_seeding_is_judged_by_the_nodes_clock_so_a_station_behind_the_controller_still_seeds(tmp_path: Path) -> None:
    """FM-40: the Station's clock 90 s behind the controller's. Its tuner made hash-new 10 s ago by its own
    clock; the controller started the launch 60 s ago by its clock. Judged by the controller's timestamp
    (the old rule: mtime >= controller start) the dir looks 30 s older than the launch and is never seeded."""
    root = tmp_path / "R"
    cache = root / "cache/flashinfer"
    old, new, stale = cache / "hash-old", cache / "hash-new", cache / "hash-stale"
    for d in (old, new, stale):
        d.mkdir(parents=True)
    (old / autotune.CONFIGS).write_text('{"configs": 168}')
    node_now = time.time()
    past = node_now - 7200
    os.utime(old / autotune.CONFIGS, (past, past))
    os.utime(old, (past, past))
    os.utime(new, (node_now - 10, node_now - 10))
    os.utime(stale, (node_now - 600, node_now - 600))  # an empty dir from before this launch: not its tuner's
    controller_now = node_now + 90
    controller_started = controller_now - 60
    assert os.path.getmtime(new) < controller_started  # what the controller's clock would have refused
    cmd = autotune.seed_command("/cache", controller_now - controller_started)
    out = run_in_root(root, ["bash", "-c", cmd], capture_output=True, text=True, check=True).stdout
    assert autotune.parse(out)["seeded"] == ["/cache/flashinfer/hash-new"]
    assert not (stale / autotune.CONFIGS).exists()
    assert (new / autotune.CONFIGS).read_text() == '{"configs": 168}'
