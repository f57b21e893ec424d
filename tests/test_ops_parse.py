"""The node operations that were inline commands (fleet/ops/: helper, facts, patches, build, nccl, probe,
autotune): each one's command as the caller ran it, and its pure `parse` fed the output shapes the other
tests capture from the real tools and helpers (test_gather.py, test_patches.py, test_build.py, test_nccl.py,
test_fabric_probe.py, test_autotune.py)."""

from __future__ import annotations

import json

from sparkfleet.fleet import ops
from sparkfleet.fleet.facts import NodeFacts
from sparkfleet.fleet.ship import guard_command, helper_bytes, inline_command, remote_path
from sparkfleet.fleet.transport import Result

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
