"""The node operations that were inline commands (fleet/ops/: helper, facts, patches, build, nccl, probe,
autotune): each one's command as the caller ran it, and its pure `parse` fed the output shapes the other
tests capture from the real tools and helpers (test_gather.py, test_patches.py, test_build.py, test_nccl.py,
test_fabric_probe.py, test_autotune.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from sparkfleet.engines.build_recipe import BuildStep, EngineBuild, stage_of
from sparkfleet.fleet import ops
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.fleet.ship import guard_command, helper_bytes, inline_command, remote_path
from sparkfleet.fleet.transport import Result
from sparkfleet.patches import manifest as pm
from sparkfleet.runner import autotune
from tests.conftest import REPO

GUARD_SAYS_MISSING = "sparkfleet-helper-missing /root/.cache/sparkfleet/bin/facts.py\n"


# -- a node-side helper ------------------------------------------------------------------------------

def test_a_helper_s_run_ship_and_inline_commands() -> None:
    run, verify = ops.RunHelper("facts.py"), ops.RunHelper("facts.py", run=False)
    assert run.command() == guard_command("facts.py") and verify.command() == guard_command("facts.py", run=False)
    assert not run.changes and ops.RunHelper("engram_copy.py", writes=True).changes
    assert not ops.RunHelper("engram_copy.py", run=False, writes=True).changes  # verifying writes nothing
    ship = ops.ShipHelper("facts.py")
    assert ship.changes and ship.command() == run.command()
    assert ship.files() == {remote_path("facts.py"): helper_bytes("facts.py")}
    inline = ops.InlineHelper("facts.py")
    assert not inline.changes and inline.command() == inline_command("facts.py")


def test_a_helper_s_answer() -> None:
    op = ops.RunHelper("facts.py")
    missing = Result("a", False, stderr=GUARD_SAYS_MISSING, exit_code=97, error="exit")
    assert op.missing(missing) and not op.missing(Result("a", False, stderr="boom", exit_code=97, error="exit"))
    no_python = Result("a", False, stderr="sh: 1: python3: not found", exit_code=127, error="exit")
    said = op.parse(no_python)
    assert "python3 not found on a" in said.message and no_python.message == ""  # pure: a copy
    crashed = op.parse(Result("a", False, stderr="Traceback (most recent call last):\nKeyError: 'x'\n",
                              exit_code=1, error="exit"))
    assert crashed.message == "facts.py on a failed (exit 1): KeyError: 'x'"
    down = Result("a", False, error="unreachable", message="a: connection refused (10.0.0.9:22)")
    assert op.parse(down) is down


# -- facts -------------------------------------------------------------------------------------------

def test_facts_read_the_helper_s_json_line() -> None:
    op = ops.Facts()
    assert op.command() == guard_command("facts.py") and not op.changes
    doc = {"node": "good", "hostname": "spark-1", "collected_at": 1.0, "helper_version": "1",
           "meminfo": {"mem_total_bytes": 126701056 * 1024, "mem_available_bytes": 120000000 * 1024}}
    got = op.parse(Result("good", True, stdout="a warning first\n" + json.dumps(doc) + "\n", exit_code=0,
                          extra={"ended_at": 5.5}))
    assert isinstance(got, NodeFacts) and got.hostname == "spark-1" and got.received_at == 5.5
    assert got.meminfo.mem_total_bytes == 126701056 * 1024


def test_facts_say_what_was_wrong_with_the_answer() -> None:  # the shapes test_gather.py's transport gives
    op = ops.Facts()
    garbage = op.parse(Result("g", True, stdout="Traceback (most recent call last):\n  oops\n", exit_code=0))
    assert not garbage.ok and "printed invalid JSON" in garbage.message
    schema = op.parse(Result("s", True, stdout='{"node": "s", "hostname": "x"}\n', exit_code=0))
    assert "do not match this sparkfleet's schema" in schema.message and "collected_at" in schema.message
    other = op.parse(Result("o", True, exit_code=0, stdout=json.dumps(
        {"node": "elsewhere", "hostname": "x", "collected_at": 1.0, "helper_version": "1"})))
    assert "answered for node 'elsewhere'" in other.message
    empty = op.parse(Result("e", True, stderr="warning: no GPU\n", exit_code=0))
    assert empty.message == "facts.py on e printed nothing (stderr: warning: no GPU)"
    assert "python3 not found on n" in op.parse(Result("n", False, stderr="sh: 1: python3: not found",
                                                       exit_code=127, error="exit")).message


# -- patch sets --------------------------------------------------------------------------------------

def _on_node(op, tmp: Path, stdin: str) -> Result:
    """The op's command run by a real shell, as a node runs it."""
    p = subprocess.run(["sh", "-c", op.command()], input=stdin, capture_output=True, text=True, timeout=60, cwd=tmp)
    return Result("n1", p.returncode == 0, p.stdout, p.stderr, p.returncode, None if p.returncode == 0 else "exit")


def test_a_patch_set_s_hashes_read_back(tmp_path: Path) -> None:
    m = pm.load(REPO, "probe")
    (f,) = m.files
    op = ops.HashPatchSet(m, str(tmp_path))
    assert not op.changes and op.paths() == [f"{tmp_path}/probe/{f.source}"]
    assert json.loads(op.stdin()) == op.paths()
    missing = op.parse(_on_node(op, tmp_path, op.stdin()))  # the real script: {"path": null}
    assert missing.reachable and missing.missing == [f.source] and not missing.ok
    target = Path(op.paths()[0])
    target.parent.mkdir(parents=True)
    target.write_bytes(b"not the patch")
    wrong = op.parse(_on_node(op, tmp_path, op.stdin()))
    assert wrong.wrong == [f.source] and wrong.found[f.source] == hashlib.sha256(b"not the patch").hexdigest()
    target.write_bytes((REPO / "patches/probe" / f.source).read_bytes())
    right = op.parse(_on_node(op, tmp_path, op.stdin()))
    assert right.ok and right.paths == {f.source: str(target)} and right.found == {f.source: f.sha256}
    down = op.parse(Result("n1", False, error="unreachable", message="n1: connection refused (10.0.0.9:22)"))
    assert not down.reachable and down.message == "n1: connection refused (10.0.0.9:22)"
    odd = op.parse(Result("n1", True, stdout="Python 2.7.18\n", exit_code=0))
    assert not odd.reachable and odd.message == "unexpected answer: 'Python 2.7.18\\n'"


def test_copying_patch_files() -> None:
    op = ops.CopyPatchFiles((("/nvme/patches/probe/p.py", b"x = 1\n"),))
    assert op.changes and op.command() == "true" and op.files() == {"/nvme/patches/probe/p.py": b"x = 1\n"}
    assert op.parse(Result("n1", True, exit_code=0)) is None
    assert op.parse(Result("n1", False, error="error", message="sftp: No space left on device")) == \
        "copying failed: sftp: No space left on device"


# -- an engine build ---------------------------------------------------------------------------------

ZIG_FAILS = ("printf '%s\\n' 'src/main.zig:2:5: error: no sm121 kernel' "  # the zig stand-in's words (test_build.py)
             "'Build Summary: 0/3 steps succeeded; 1 failed' >&2; exit 1")


def _build(tmp: Path, zig: str = "mkdir -p zig-out/bin && printf '#!/bin/sh\\n' > zig-out/bin/tensorfold") -> EngineBuild:
    built = str(tmp / "recipe" / "TensorFold")
    return EngineBuild(engine="tensorfold", dir=built, fetch=BuildStep("git clone", f"mkdir {stage_of(built)}"),
                       steps=(BuildStep("zig build", zig),))


def _run(command: str, stdin: str = "") -> Result:
    p = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True, timeout=60)
    return Result("n1", p.returncode == 0, p.stdout, p.stderr, p.returncode, None if p.returncode == 0 else "exit")


def test_a_build_s_answer_is_its_artefact_or_the_step_that_failed(tmp_path: Path) -> None:
    (tmp_path / "recipe").mkdir()
    op = ops.BuildEngine(_build(tmp_path))
    assert op.changes and op.timeout_s == 3600.0
    built = op.parse(_run(op.command()))  # the real build script, in a real shell
    assert built.ok and built.step == "" and list(built.files) == ["bin/tensorfold"]
    assert built.files["bin/tensorfold"] == hashlib.sha256(b"#!/bin/sh\n").hexdigest()
    failed = ops.BuildEngine(_build(tmp_path, ZIG_FAILS))
    got = failed.parse(_run(failed.command()))
    assert not got.ok and got.step == "zig build" and got.digest is None
    assert got.tail == ["src/main.zig:2:5: error: no sm121 kernel", "Build Summary: 0/3 steps succeeded; 1 failed"]
    nothing = ops.BuildEngine(_build(tmp_path / "elsewhere"))
    got = nothing.parse(_run(nothing.command()))
    assert (got.ok, got.step) == (False, "prepare") and got.tail[0].endswith("no such directory on this node "
                                                                            f"(the parent of the build dir "
                                                                            f"{tmp_path}/elsewhere/recipe/TensorFold)")
    empty = ops.BuildEngine(_build(tmp_path, "true"))
    got = empty.parse(_run(empty.command()))
    assert (got.ok, got.step, got.tail) == (False, "hash the artefact", [
        f"the build installed nothing under {tmp_path}/recipe/TensorFold.sparkfleet-new/zig-out"])
    down = op.parse(Result("n1", False, error="unreachable", message="n1: connection refused (10.0.0.9:22)"))
    assert (down.ok, down.step, down.tail) == (False, "reach the node", ["n1: connection refused (10.0.0.9:22)"])


def test_install_remove_and_hash_a_build(tmp_path: Path) -> None:
    (tmp_path / "recipe").mkdir()
    b = _build(tmp_path)
    build, install, remove, hashed = ops.BuildEngine(b), ops.InstallBuild(b), ops.RemoveStage(b), ops.HashArtefact(b)
    assert install.changes and remove.changes and not hashed.changes
    assert hashed.stdin() == b.artefact_dir
    assert hashed.parse(_run(hashed.command(), hashed.stdin())) == {"dir": b.artefact_dir, "exists": False, "files": {}}
    assert build.parse(_run(build.command())).ok
    assert install.parse(_run(install.command())) is None
    got = hashed.parse(_run(hashed.command(), hashed.stdin()))
    assert got["exists"] and got["files"] == {"bin/tensorfold": hashlib.sha256(b"#!/bin/sh\n").hexdigest()}
    assert remove.parse(_run(remove.command())) is None
    assert install.parse(_run(install.command())) == f"mv: cannot stat '{b.stage}': No such file or directory"
    assert hashed.parse(Result("n1", False, error="timeout", message="n1: no answer in 60 s")) == "n1: no answer in 60 s"
    assert hashed.parse(Result("n1", True, stdout="", exit_code=0)) == "no answer"


# -- an NCCL all-reduce ------------------------------------------------------------------------------

def test_an_all_reduce_rank_reads_what_nccl_printed() -> None:
    from tests.test_nccl import RDMA, RECEIPT

    op = ops.AllReduceRank("docker run --rm ... 2>&1")
    assert op.changes and op.command() == "docker run --rm ... 2>&1"
    rdma = op.parse(Result("reddie", True, stdout=RDMA, exit_code=0))
    assert (rdma.network, rdma.gdrdma, rdma.result["latency_us"]) == ("IB", True, {"49152": 31.5, "409600": 58.25})
    h200 = op.parse(Result("h200", True, stdout=RECEIPT.read_text(), exit_code=0))  # the receipt: a socket fallback
    assert h200.network == "Socket" and h200.on_socket and h200.version == "2.28.9+cuda13.0"
    split = op.parse(Result("spark4", False, stdout='{"sparkfleet_nccl": {"rank": 3, "error": "DistBackendError"}}\n',
                            stderr="spark4:9:9 [0] NCCL WARN NET/IB : Got completion with error 12\n", exit_code=1,
                            error="exit"))
    assert split.result == {"rank": 3, "error": "DistBackendError"}
    assert split.warnings == ["NET/IB : Got completion with error 12"]
    down = op.parse(Result("bluey", False, error="unreachable", message="bluey: connection refused"))
    assert down.network is None and down.result is None and not down.via


# -- the fabric probe --------------------------------------------------------------------------------

def test_the_fabric_probe_s_answers(tmp_path: Path) -> None:
    """The helper itself (run as python3 FILE: the guard's hash check aside, the same bytes) on the op's stdin."""
    helper = REPO / "sparkfleet/fleet/nodeside/fabric_probe.py"

    def on_node(op) -> Result:
        return _run(f"python3 {helper}", op.stdin())

    refused = ops.FabricProbe({"mode": "drive", "source": "10.0.0.1", "peer": "8.8.8.8", "port": 29570,
                               "allow": ["10.0.0.1", "10.0.0.2"], "rtt_sizes": [49152], "rtt_count": 1,
                               "bulk_bytes": 1024, "connect_wait_s": 0.1})
    assert refused.changes and refused.command() == guard_command("fabric_probe.py")
    assert json.loads(refused.stdin()) == refused.request
    got = refused.parse(on_node(refused))
    assert got["error"] == "refused: 8.8.8.8 is not one of the lane's fabric addresses"
    quit_ = ops.FabricProbe({"mode": "quit", "bind": "127.0.0.1", "port": 9})  # nothing listens on discard
    got = quit_.parse(on_node(quit_))
    assert got["mode"] == "quit" and got["stopped"] is False and got["error"]
    bad = ops.FabricProbe({"mode": "flood"})
    assert bad.parse(on_node(bad)).startswith("fabric_probe.py: a request with mode serve, drive or quit is expected")
    assert bad.parse(Result("n1", True, stdout="", exit_code=0)) == "exit 0"  # ran, answered nothing
    assert bad.parse(Result("n1", False, error="timeout", message="timed out after 90 s")) == "timed out after 90 s"


# -- seeding the autotune cache ----------------------------------------------------------------------

def test_seeding_the_autotune_cache_answers_the_dirs_it_seeded(tmp_path: Path) -> None:
    cache = tmp_path / "vllm-cache/flashinfer"
    old, new = cache / "hash-old", cache / "hash-new"
    for d in (old, new):
        d.mkdir(parents=True)
    (old / "autotune_configs.json").write_text('{"configs": 168}')
    past = time.time() - 3600
    os.utime(old, (past, past))
    op = ops.SeedAutotune(str(tmp_path / "vllm-cache"), 5)
    assert op.changes and op.command() == autotune.seed_command(str(tmp_path / "vllm-cache"), 5)
    assert op.parse(_run(op.command())) == [str(new)]  # the real script, in a real shell
    assert op.parse(_run(op.command())) == []  # a second poll seeds nothing more
    assert (new / "autotune_configs.json").read_text() == '{"configs": 168}'
    assert op.parse(Result("station", True, stdout="", exit_code=0)) == []  # printed nothing: nothing seeded
    assert op.parse(Result("station", False, stdout='{"source": null, "seeded": ["/x"]}', exit_code=1,
                           error="exit")) == []


def test_when_each_rank_stopped_reads_as_times_not_text() -> None:
    """dockerd prints FinishedAt with Go's RFC3339Nano, which drops trailing zeros: `.12Z` is earlier than
    `.123456789Z` but sorts after it as text. The parse gives unix times that compare as times."""
    out = ("0 exited 2026-12-05T03:15:05.12Z\n"
           "1 exited 2026-12-05T03:15:05.123456789Z\n"
           "2 running 0001-01-01T00:00:00Z\n")
    rows = ops.Stopped("dcp2").parse(Result("n", True, out))
    assert [(r["rank"], r["state"], r["finished_at"]) for r in rows] == [
        ("0", "exited", "2026-12-05T03:15:05.12Z"), ("1", "exited", "2026-12-05T03:15:05.123456789Z"),
        ("2", "running", "0001-01-01T00:00:00Z")]
    assert rows[0]["finished_at"] > rows[1]["finished_at"]  # as text: the wrong order
    assert rows[0]["finished_s"] < rows[1]["finished_s"]  # as times: rank 0 stopped first
    assert rows[1]["finished_s"] - rows[0]["finished_s"] == pytest.approx(0.003456789, abs=1e-6)
    assert ops.Stopped("dcp2").parse(Result("n", False, "", "Cannot connect to the Docker daemon", exit_code=1)) \
        == "Cannot connect to the Docker daemon"


def test_the_clock_probe_s_command_and_answer() -> None:
    """up's probe step and `check --probe` run the same op: the sampler around the load, a change (it starts a
    container), and the sampler's document or why there is none."""
    from sparkfleet.fleet.nodeside import clock_probe

    op = ops.ClockProbe("sim-gpu-load 5")
    assert op.command() == clock_probe.probe_command("sim-gpu-load 5") and op.changes
    assert ops.on("x", {"n": op}, op.timeout_s).timeout_s == clock_probe.PROBE_MAX_S + 30
    doc = {"probe": "sparkfleet-clock-probe", "samples": []}
    assert op.parse(Result("n", True, "banner\n" + json.dumps(doc) + "\n")) == doc
    assert op.parse(Result("n", True, "")) == {"error": "the probe printed no result"}
    assert op.parse(Result("n", False, "", "python3: can't open file\n", exit_code=2)) == {
        "error": "exit 2: python3: can't open file"}
    assert op.parse(Result("n", False, "", "", error="timeout", message="n: timed out after 150 s")) == {
        "error": "n: timed out after 150 s"}
