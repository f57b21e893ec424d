"""LocalTransport (plain, and under a node `wrapper` as the sim uses) and transport_for: SSH's Result semantics."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from sparkfleet.fleet.connect import MixedTransport, transport_for
from sparkfleet.fleet.local import LocalTransport
from sparkfleet.fleet.ssh import SshTransport
from sparkfleet.schema.inventory import Node

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

NAMES = ["reddie", "asusi", "bluey", "spark4", "station"]


def make_node(name: str, wrapper: Path | None = None, transport: str = "local", port: int = 22) -> Node:
    return Node.model_validate({
        "name": name, "transport": transport, "wrapper": [str(wrapper)] if wrapper else None,
        "ssh": {"host": "127.0.0.1", "port": port}, "hardware": "gb10",
        "storage": {"model_root": "/tmp/models", "cache_dir": "/tmp/cache"},
    })


WRAPPER = """#!/bin/sh
# a node behind a wrapper: its own home and PATH (as a login would give), nothing else of the caller's env
[ -e {home}/../down ] && {{ echo "ssh: connect to host {name} port 22: No route to host" >&2; exit 255; }}
export NODE_NAME={name} HOME={home} PATH={home}/../bin:/usr/bin:/bin
cd "$HOME" && exec "$@"
"""


@pytest.fixture
def sim_nodes(tmp_path: Path) -> list[Node]:
    """Five nodes behind wrappers, each with a home and a `nvidia-smi` on its PATH that names its node."""
    nodes = []
    for name in NAMES:
        root = tmp_path / "nodes" / name
        (root / "bin").mkdir(parents=True)
        (root / "home").mkdir()
        shim = root / "bin" / "nvidia-smi"
        shim.write_text('#!/bin/sh\necho "nvidia-smi on $NODE_NAME"\n')
        shim.chmod(0o755)
        wrapper = root / "enter"
        wrapper.write_text(WRAPPER.format(name=name, home=root / "home"))
        wrapper.chmod(0o755)
        nodes.append(make_node(name, wrapper))
    return nodes


def home(node: Node) -> Path:
    return Path(node.wrapper[0]).parent / "home"


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


def test_runs_in_parallel_under_each_wrapper(sim_nodes, local, tmp_path, monkeypatch):
    monkeypatch.setenv("LEAKED_FROM_HOST", "yes")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # each command waits until all five started: serial execution would time out instead
    command = (f'touch {barrier}/"$NODE_NAME"; '
               f'while [ "$(ls {barrier} | wc -l)" -lt 5 ]; do sleep 0.02; done; '
               'nvidia-smi; echo "$HOME"; pwd; command -v nvidia-smi; echo "[$LEAKED_FROM_HOST]"')
    results = local.run(sim_nodes, command, timeout_s=15)
    assert list(results) == NAMES
    for node in sim_nodes:
        r = results[node.name]
        assert r.ok and r.exit_code == 0, r.message
        shim_line, home_dir, cwd, which, leaked = r.stdout.splitlines()
        assert shim_line == f"nvidia-smi on {node.name}"  # the wrapper's PATH
        assert home_dir == cwd == str(home(node))
        assert which == f"{home(node)}/../bin/nvidia-smi"
        assert leaked == "[]"  # like SSH, nothing of this machine's environment reaches the node


def test_plain_local_node_runs_here(local, monkeypatch):
    monkeypatch.setenv("SEEN_HERE", "yes")
    r = local.run([make_node("plain")], 'echo "[$SEEN_HERE]"; echo "$HOME"')["plain"]
    assert r.ok and r.stdout == f"[yes]\n{os.environ['HOME']}\n"


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
    results = local.run(sim_nodes, '[ "$NODE_NAME" = bluey ] && { echo out; echo oops >&2; exit 7; }; echo ok')
    bad = results["bluey"]
    assert not bad.ok and bad.error == "exit" and bad.exit_code == 7
    assert bad.stdout == "out\n" and bad.stderr == "oops\n" and "bluey" in bad.message and "oops" in bad.message
    assert all(results[n].ok and results[n].stdout == "ok\n" for n in NAMES if n != "bluey")


def test_timeout_kills_the_whole_command(sim_nodes, local, tmp_path):
    pidfile = tmp_path / "child.pid"
    command = (f'if [ "$NODE_NAME" = asusi ]; then echo started; sleep 30 & echo $! > {pidfile}; wait; fi; '
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


def test_put_lands_in_the_nodes_home(sim_nodes, local):
    data = bytes(range(256)) * 16
    results = local.put(sim_nodes, data, "~/.cache/sparkfleet/bin/facts.py", mode=0o750)
    for node in sim_nodes:
        r = results[node.name]
        target = home(node) / ".cache/sparkfleet/bin/facts.py"
        assert r.ok and r.extra["path"] == str(target), r.message
        assert target.read_bytes() == data and target.stat().st_mode & 0o7777 == 0o750
        assert os.listdir(target.parent) == ["facts.py"]
    # what put wrote under ~ is what a command finds under ~
    seen = local.run(sim_nodes, "sha256sum < ~/.cache/sparkfleet/bin/facts.py; stat -c %a ~/.cache/sparkfleet/bin/facts.py")
    assert len({r.stdout for r in seen.values()}) == 1 and next(iter(seen.values())).stdout.endswith("750\n")
    local.put(sim_nodes, b"v2", "~/.cache/sparkfleet/bin/facts.py", mode=0o600)
    target = home(sim_nodes[0]) / ".cache/sparkfleet/bin/facts.py"
    assert target.read_bytes() == b"v2" and target.stat().st_mode & 0o7777 == 0o600


def test_put_with_an_absolute_path_goes_through_the_wrapper(sim_nodes, local, tmp_path):
    target = tmp_path / "abs" / "rows.bin"
    r = local.put(sim_nodes[:1], b"rows", str(target))["reddie"]
    assert r.ok and r.extra["path"] == str(target) and target.read_bytes() == b"rows"
    assert local.put(sim_nodes[:1], b"x", "~other/f")["reddie"].error == "error"


def test_put_on_plain_local_node(local, tmp_path):
    target = tmp_path / "a" / "b" / "file"
    r = local.put([make_node("plain")], b"plain", str(target), mode=0o640)["plain"]
    assert r.ok and target.read_bytes() == b"plain" and target.stat().st_mode & 0o777 == 0o640


def test_wrapper_exit_255_is_unreachable(sim_nodes, local):
    (home(sim_nodes[0]).parent / "down").touch()
    r = local.run(sim_nodes[:2], "echo up")
    assert r["reddie"].error == "unreachable" and "No route to host" in r["reddie"].message
    assert r["asusi"].ok and r["asusi"].stdout == "up\n"
    assert local.put(sim_nodes[:1], b"x", "~/f")["reddie"].error == "unreachable"
    # a command of its own that exits 255 after printing is an exit, not a lost node
    (home(sim_nodes[0]).parent / "down").unlink()
    assert local.run(sim_nodes[:1], "echo out; exit 255")["reddie"].error == "exit"


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
        results = mixed.run([sim_nodes[0], ssh_node, sim_nodes[1]], 'echo "$NODE_NAME"')
        assert list(results) == ["reddie", "remote", "asusi"]
        assert results["reddie"].stdout == "reddie\n" and results["asusi"].stdout == "asusi\n"
        assert results["remote"].error == "unreachable" and "refused" in results["remote"].message
        put = mixed.put([sim_nodes[0], ssh_node], b"x", "~/f")
        assert put["reddie"].ok and put["remote"].error == "unreachable"
    finally:
        mixed.close()


def test_the_fanout_setting_bounds_how_many_nodes_run_at_once(sim_nodes, tmp_path, monkeypatch):
    """`fanout` (SPARKFLEET_FANOUT, the config file, default 64) is the transport's parallel bound: with 2, no
    node's command ever sees more than two running, although five nodes are asked at once."""
    running = tmp_path / "running"
    running.mkdir()
    command = (f'mkdir {running}/"$NODE_NAME"; ls {running} | wc -l; sleep 0.3; ls {running} | wc -l; '
               f'rmdir {running}/"$NODE_NAME"')
    seen = {}
    for bound in ("2", "64"):
        monkeypatch.setenv("SPARKFLEET_FANOUT", bound)
        transport = transport_for(sim_nodes)
        try:
            results = transport.run(sim_nodes, command, timeout_s=15)
        finally:
            transport.close()
        assert all(r.ok for r in results.values()), results
        seen[bound] = max(int(x) for r in results.values() for x in r.stdout.split())
    assert seen["2"] == 2 and seen["64"] == 5, seen
