"""Station autotune cache: new hash dirs seeded from the newest configs; shape changes flagged."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sparkfleet.runner import autotune
from tests.noderoot import run_in_root


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
    since = time.time() - 5
    cmd = autotune.seed_command("/home/milo/dsv41/vllm-cache", since)
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
    failed_later = {"profile": "gb300-v23", "outcome": "failed", "data": {"launches": [{"argv": changed}]}}
    (runs / "20261118-2.json").write_text(json.dumps(failed_later))  # a failed run is not a baseline
    assert autotune.shape_changes(runs, "gb300-v23", changed) == ["--cudagraph-capture-sizes"]
