"""LocalTransport (the sim in local mode) and transport_for: the same Result semantics as SSH."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from sparkfleet.fleet.connect import MixedTransport, transport_for
from sparkfleet.fleet.local import LocalTransport
from sparkfleet.fleet.ssh import SshTransport
from sparkfleet.spec.inventory import Node

NAMES = ["reddie", "asusi", "bluey", "spark4", "station"]


def make_node(name: str, sim_root: Path | None = None, transport: str = "local", port: int = 22) -> Node:
    return Node.model_validate({
        "name": name, "transport": transport, "sim_root": str(sim_root) if sim_root else None,
        "ssh": {"host": "127.0.0.1", "port": port}, "hardware": "gb10",
        "storage": {"model_root": "/tmp/models", "cache_dir": "/tmp/cache"},
    })


@pytest.fixture
def sim_nodes(tmp_path: Path) -> list[Node]:
    """Five simulated nodes, each with a sandbox holding a `nvidia-smi` shim that names its node."""
    nodes = []
    for name in NAMES:
        root = tmp_path / "sim" / name
        (root / "bin").mkdir(parents=True)
        shim = root / "bin" / "nvidia-smi"
        shim.write_text('#!/bin/sh\necho "sim nvidia-smi on $SPARKFLEET_NODE"\n')
        shim.chmod(0o755)
        nodes.append(make_node(name, root))
    return nodes


@pytest.fixture
def local():
    transport = LocalTransport()
    yield transport
    transport.close()


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_runs_in_parallel_with_the_sim_environment(sim_nodes, local, tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # each command waits until all five started: serial execution would time out instead
    command = (f'touch {barrier}/"$SPARKFLEET_NODE"; '
               f'while [ "$(ls {barrier} | wc -l)" -lt 5 ]; do sleep 0.02; done; '
               'nvidia-smi; echo "$SPARKFLEET_SIM_ROOT"; echo "$HOME"; pwd; command -v nvidia-smi')
    results = local.run(sim_nodes, command, timeout_s=15)
    assert list(results) == NAMES
    for node in sim_nodes:
        r = results[node.name]
        assert r.ok and r.exit_code == 0, r.message
        shim_line, sim_root, home, cwd, which = r.stdout.splitlines()
        assert shim_line == f"sim nvidia-smi on {node.name}"  # the sandbox's bin comes first on PATH
        assert sim_root == node.sim_root
        assert home == cwd == f"{node.sim_root}/home"
        assert which == f"{node.sim_root}/bin/nvidia-smi"


def test_plain_local_node_has_no_sim_environment(local, monkeypatch):
    monkeypatch.delenv("SPARKFLEET_SIM_ROOT", raising=False)
    monkeypatch.delenv("SPARKFLEET_NODE", raising=False)
    r = local.run([make_node("plain")], 'echo "[$SPARKFLEET_SIM_ROOT][$SPARKFLEET_NODE]"; echo "$HOME"')["plain"]
    assert r.ok and r.stdout == f"[][]\n{os.environ['HOME']}\n"


def test_stdin_and_env_arrive_literally(sim_nodes, local):
    marker = Path(f"/tmp/pwned-{uuid.uuid4().hex[:8]}")
    env = {"EVIL": f"$(touch {marker}); rm -rf /", "QUOTES": "it's \"q\" `t` \\ $HOME", "MULTI": "a\nb"}
    stdin = "line 1\n$(not run) 'x'\nlast"
    results = local.run(sim_nodes, 'printf "%s\\0" "$EVIL" "$QUOTES" "$MULTI"; cat', stdin=stdin, env=env)
    for r in results.values():
        assert r.ok, r.message
        assert r.stdout.split("\0") == [env["EVIL"], env["QUOTES"], env["MULTI"], stdin]
    assert not marker.exists()
    with pytest.raises(ValueError):
        local.run(sim_nodes, "true", env={"BAD NAME": "x"})


def test_command_without_stdin_sees_eof(sim_nodes, local):
    assert local.run(sim_nodes[:1], "cat; echo end", timeout_s=5)["reddie"].stdout == "end\n"


def test_nonzero_exit(sim_nodes, local):
    results = local.run(sim_nodes, '[ "$SPARKFLEET_NODE" = bluey ] && { echo out; echo oops >&2; exit 7; }; echo ok')
    bad = results["bluey"]
    assert not bad.ok and bad.error == "exit" and bad.exit_code == 7
    assert bad.stdout == "out\n" and bad.stderr == "oops\n" and "bluey" in bad.message and "oops" in bad.message
    assert all(results[n].ok and results[n].stdout == "ok\n" for n in NAMES if n != "bluey")


def test_timeout_kills_the_whole_command(sim_nodes, local, tmp_path):
    pidfile = tmp_path / "child.pid"
    command = (f'if [ "$SPARKFLEET_NODE" = asusi ]; then echo started; sleep 30 & echo $! > {pidfile}; wait; fi; '
               'echo done')
    results = local.run(sim_nodes, command, timeout_s=0.5)
    slow = results["asusi"]
    assert not slow.ok and slow.error == "timeout" and slow.stdout == "started\n" and "asusi" in slow.message
    assert all(results[n].ok for n in NAMES if n != "asusi")
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 2
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(child)  # the background sleep died with its process group


def test_background_child_holding_stdout_does_not_hold_the_result(sim_nodes, local, tmp_path):
    pidfile = tmp_path / "daemon.pid"
    try:
        r = local.run(sim_nodes[:1], f"sleep 30 & echo $! > {pidfile}; echo launched", timeout_s=1)["reddie"]
        assert r.ok and r.exit_code == 0 and r.stdout == "launched\n"
    finally:
        os.kill(int(pidfile.read_text()), 9)


def test_put_lands_in_the_sandbox_home(sim_nodes, local):
    data = bytes(range(256)) * 16
    results = local.put(sim_nodes, data, "~/.cache/sparkfleet/bin/facts.py", mode=0o750)
    for node in sim_nodes:
        r = results[node.name]
        target = Path(node.sim_root) / "home/.cache/sparkfleet/bin/facts.py"
        assert r.ok and r.extra["path"] == str(target), r.message
        assert target.read_bytes() == data and target.stat().st_mode & 0o7777 == 0o750
        assert os.listdir(target.parent) == ["facts.py"]
    # what put wrote under ~ is what a command finds under ~
    seen = local.run(sim_nodes, "sha256sum < ~/.cache/sparkfleet/bin/facts.py; stat -c %a ~/.cache/sparkfleet/bin/facts.py")
    assert len({r.stdout for r in seen.values()}) == 1 and next(iter(seen.values())).stdout.endswith("750\n")
    local.put(sim_nodes, b"v2", "~/.cache/sparkfleet/bin/facts.py", mode=0o600)
    target = Path(sim_nodes[0].sim_root) / "home/.cache/sparkfleet/bin/facts.py"
    assert target.read_bytes() == b"v2" and target.stat().st_mode & 0o7777 == 0o600


def test_put_outside_the_sandbox_is_refused(sim_nodes, local, tmp_path):
    outside = tmp_path / "outside.txt"
    r = local.put(sim_nodes[:1], b"x", str(outside))["reddie"]
    assert not r.ok and r.error == "error" and "sandbox" in r.message
    assert not outside.exists()
    inside = Path(sim_nodes[0].sim_root) / "nvme/engram-local/rows.bin"
    assert local.put(sim_nodes[:1], b"rows", str(inside))["reddie"].ok and inside.read_bytes() == b"rows"


def test_put_on_plain_local_node(local, tmp_path):
    target = tmp_path / "a" / "b" / "file"
    r = local.put([make_node("plain")], b"plain", str(target), mode=0o640)["plain"]
    assert r.ok and target.read_bytes() == b"plain" and target.stat().st_mode & 0o777 == 0o640


def test_missing_sandbox_is_unreachable(local, tmp_path):
    ghost = make_node("ghost", tmp_path / "never-created")
    r = local.run([ghost], "true")["ghost"]
    assert not r.ok and r.error == "unreachable" and "sparkfleet sim up" in r.message


# -- transport_for ---------------------------------------------------------------------------------
def test_transport_for_picks_by_node_transport(sim_nodes, tmp_path):
    ssh_node = make_node("remote", transport="ssh", port=1)
    assert isinstance(transport_for(sim_nodes), LocalTransport)
    only_ssh = transport_for([ssh_node], known_hosts=tmp_path / "kh")
    assert isinstance(only_ssh, SshTransport) and only_ssh.known_hosts == tmp_path / "kh"
    mixed = transport_for([*sim_nodes[:2], ssh_node], known_hosts=tmp_path / "kh")
    assert isinstance(mixed, MixedTransport)


def test_mixed_group_runs_both_kinds_in_one_call(sim_nodes, tmp_path):
    # nothing listens on 127.0.0.1:1, so the SSH node is refused while the local ones run
    ssh_node = make_node("remote", transport="ssh", port=1)
    mixed = transport_for([sim_nodes[0], ssh_node, sim_nodes[1]], known_hosts=tmp_path / "kh")
    try:
        results = mixed.run([sim_nodes[0], ssh_node, sim_nodes[1]], 'echo "$SPARKFLEET_NODE"')
        assert list(results) == ["reddie", "remote", "asusi"]
        assert results["reddie"].stdout == "reddie\n" and results["asusi"].stdout == "asusi\n"
        assert results["remote"].error == "unreachable" and "refused" in results["remote"].message
        put = mixed.put([sim_nodes[0], ssh_node], b"x", "~/f")
        assert put["reddie"].ok and put["remote"].error == "unreachable"
    finally:
        mixed.close()
