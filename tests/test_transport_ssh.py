"""SshTransport and `sparkfleet trust` against real OpenSSH sshd nodes (tests/sshlab.py), host keys strict."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import paramiko
import pytest
import yaml

from sparkfleet.cli.main import main
from sparkfleet.fleet import hostkeys
from sparkfleet.fleet.ssh import SshTransport
from sparkfleet.schema.inventory import Node
from tests.sshlab import LOCK_DIR, SshLab, start_lab

REPO = Path(__file__).resolve().parents[1]
NAMES = ["node1", "node2", "node3", "node4", "node5"]


@pytest.fixture(scope="module")
def shims(tmp_path_factory) -> Path:
    """A bin dir with a `sim-probe` shim (as the sim puts nvidia-smi), first on node1's PATH through the lab's SetEnv."""
    shim_dir = tmp_path_factory.mktemp("simbin")
    shim = shim_dir / "sim-probe"
    shim.write_text('#!/bin/sh\necho "shim on $SPARKFLEET_NODE under $SPARKFLEET_SIM_ROOT"\n')
    shim.chmod(0o755)
    return shim_dir


@pytest.fixture(scope="module")
def lab(shims):
    lab = start_lab(NAMES, setenv={"node1": {"PATH": f"{shims}:/usr/bin:/bin", "SPARKFLEET_SIM_ROOT": "/sim/n1"}})
    yield lab
    lab.close()


@pytest.fixture(autouse=True)
def _heal(request):
    yield
    if "lab" in request.fixturenames:  # undo this test's faults for the next one
        request.getfixturevalue("lab").heal()


@pytest.fixture
def known_hosts(lab: SshLab, tmp_path: Path) -> Path:
    """A known_hosts pinning every node's current key (a test may change keys)."""
    return lab.write_known_hosts(tmp_path / "known_hosts")


@pytest.fixture
def nodes(lab: SshLab) -> list[Node]:
    return list(lab.inventory().nodes.values())


@pytest.fixture
def ssh(known_hosts: Path):
    transport = SshTransport(known_hosts, connect_timeout_s=2)
    yield transport
    transport.close()


def by_name(nodes: list[Node], *names: str) -> list[Node]:
    return [n for n in nodes if n.name in names]


# -- running commands -------------------------------------------------------------------------
def test_runs_on_every_node_in_parallel(lab, nodes, ssh, tmp_path):
    # A barrier: each node's command waits until all five have started. Run one after another,
    # the first would wait forever and time out, so five ok results prove they ran at once.
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    command = (f'touch {barrier}/"$SPARKFLEET_NODE"; '
               f'while [ "$(ls {barrier} | wc -l)" -lt 5 ]; do sleep 0.02; done; '
               'echo "$SPARKFLEET_NODE"; hostname')
    results = ssh.run(nodes, command, timeout_s=15)
    assert list(results) == NAMES
    for name, r in results.items():
        assert r.ok, r.message
        assert r.error is None and r.exit_code == 0
        node_env, host = r.stdout.split()
        assert node_env == name
        if lab.mode == "netns":  # each namespace has its own UTS hostname
            assert host == name


def test_lab_setenv_reaches_commands(lab, nodes, ssh, shims):
    results = ssh.run(nodes, "command -v sim-probe && sim-probe; echo \"$HOME\"")
    assert results["node1"].stdout == f"{shims}/sim-probe\nshim on node1 under /sim/n1\n{lab.nodes['node1'].dir}/home\n"
    assert results["node2"].stdout == f"{lab.nodes['node2'].dir}/home\n"  # no shim on node2's PATH


def test_connection_is_reused_until_close(nodes, ssh):
    first = ssh.run(nodes, 'echo "$SSH_CONNECTION"')
    second = ssh.run(nodes, 'echo "$SSH_CONNECTION"')
    for name in NAMES:
        assert first[name].stdout == second[name].stdout  # same client port: the same connection
    ssh.close()
    third = ssh.run(nodes, 'echo "$SSH_CONNECTION"')
    assert all(third[n].ok for n in NAMES)
    assert any(third[n].stdout != first[n].stdout for n in NAMES)


def test_stdin_and_env_arrive_literally(nodes, ssh):
    marker = Path(f"/tmp/pwned-{uuid.uuid4().hex[:8]}")
    env = {
        "EVIL": f"$(touch {marker}); rm -rf /",
        "QUOTES": "it's \"quoted\" `tick` \\back $HOME",
        "MULTI": "line one\nline two",
        "EMPTY": "",
    }
    stdin = "first line\n'single' \"double\" $(not run)\n\ttab\nno newline at end"
    command = ('printf "%s\\0" "$EVIL" "$QUOTES" "$MULTI" "$EMPTY" "$SPARKFLEET_NODE"; '
               'printf "STDIN\\0"; cat')
    results = ssh.run(nodes, command, stdin=stdin, env=env)
    for name, r in results.items():
        assert r.ok, r.message
        fields = r.stdout.split("\0")
        assert fields[:5] == [env["EVIL"], env["QUOTES"], env["MULTI"], "", name]
        assert fields[5] == "STDIN"
        assert fields[6] == stdin
    assert not marker.exists()


def test_large_stdin_round_trip(nodes, ssh):
    data = "".join(f"{i:08d} some payload line\n" for i in range(40000))  # ~1.1 MB
    results = ssh.run(nodes[:2], "sha256sum", stdin=data)
    for r in results.values():
        assert r.ok, r.message
        assert r.stdout.split()[0] == hashlib.sha256(data.encode()).hexdigest()


def test_command_without_stdin_sees_eof(nodes, ssh):
    results = ssh.run(nodes[:1], "cat; echo end", timeout_s=5)
    assert results["node1"].ok and results["node1"].stdout == "end\n"


def test_bad_env_name_is_a_caller_error(nodes, ssh):
    with pytest.raises(ValueError, match="not a valid shell variable name"):
        ssh.run(nodes, "true", env={"A;rm -rf /": "x"})


def test_nonzero_exit_keeps_output_and_code(nodes, ssh):
    results = ssh.run(nodes, '[ "$SPARKFLEET_NODE" = node2 ] && { echo out; echo oops >&2; exit 3; }; echo fine')
    bad = results["node2"]
    assert not bad.ok and bad.error == "exit" and bad.exit_code == 3
    assert bad.stdout == "out\n" and bad.stderr == "oops\n"
    assert "node2" in bad.message and "3" in bad.message and "oops" in bad.message
    assert all(results[n].ok and results[n].stdout == "fine\n" for n in NAMES if n != "node2")


def test_command_timeout(nodes, ssh):
    results = ssh.run(nodes, 'if [ "$SPARKFLEET_NODE" = node3 ]; then echo started; sleep 5; fi; echo done',
                      timeout_s=0.5)
    slow = results["node3"]
    assert not slow.ok and slow.error == "timeout" and slow.exit_code is None
    assert slow.stdout == "started\n"  # output so far is kept
    assert "node3" in slow.message and "0.5s" in slow.message
    assert all(results[n].ok for n in NAMES if n != "node3")
    # the node is fine: the next command reconnects and runs
    assert ssh.run(by_name(nodes, "node3"), "echo again")["node3"].stdout == "again\n"


# -- put -------------------------------------------------------------------------------------
def test_put_writes_exact_bytes_atomically_with_mode(lab, nodes, ssh):
    data = bytes(range(256)) * 64 + b"\x00end"
    results = ssh.put(nodes, data, "~/.cache/sparkfleet/bin/blob.py", mode=0o750)
    for name, r in results.items():
        assert r.ok, r.message
        target = lab.nodes[name].dir / "home" / ".cache/sparkfleet/bin/blob.py"  # each node's own HOME
        assert r.extra["path"] == str(target)
        assert target.read_bytes() == data
        assert target.stat().st_mode & 0o7777 == 0o750
        assert os.listdir(target.parent) == ["blob.py"]  # no temp file left behind
    # replace: new bytes and a tighter mode, seen by the node itself
    ssh.put(nodes, b"second", "~/.cache/sparkfleet/bin/blob.py", mode=0o600)
    seen = ssh.run(nodes, "stat -c %a ~/.cache/sparkfleet/bin/blob.py; cat ~/.cache/sparkfleet/bin/blob.py")
    assert all(seen[n].stdout == "600\nsecond" for n in NAMES)


def test_put_absolute_path_and_write_errors(lab, nodes, ssh, tmp_path):
    target = tmp_path / "deep" / "er" / "file.txt"
    results = ssh.put(nodes[:1], b"abs", str(target))
    assert results["node1"].ok and target.read_bytes() == b"abs"
    (tmp_path / "blocker").write_text("a file, not a directory")
    failed = ssh.put(nodes[:1], b"x", str(tmp_path / "blocker" / "f"))["node1"]
    assert not failed.ok and failed.error == "error" and "node1" in failed.message


# -- host keys ---------------------------------------------------------------------------------
def test_unknown_host_key_is_refused_others_run(lab, nodes, tmp_path):
    partial = lab.write_known_hosts(tmp_path / "kh", names=[n for n in NAMES if n != "node3"])
    with SshTransport(partial, connect_timeout_s=2) as ssh:
        results = ssh.run(nodes, "echo ran")
    r = results["node3"]
    assert not r.ok and r.error == "hostkey-unknown" and r.stdout == ""
    assert "`sparkfleet trust node3`" in r.message
    assert r.extra["got"] == lab.nodes["node3"].fingerprint()
    assert all(results[n].ok and results[n].stdout == "ran\n" for n in NAMES if n != "node3")


def test_missing_known_hosts_file_trusts_nothing(nodes, tmp_path):
    with SshTransport(tmp_path / "absent", connect_timeout_s=2) as ssh:
        results = ssh.run(nodes, "echo ran")
    assert {r.error for r in results.values()} == {"hostkey-unknown"}


def test_changed_host_key_is_refused_with_both_fingerprints(lab, nodes, known_hosts):
    old = lab.nodes["node2"].fingerprint()
    new = lab.change_host_key("node2")
    with SshTransport(known_hosts, connect_timeout_s=2) as ssh:
        results = ssh.run(nodes, "echo ran")
    r = results["node2"]
    assert not r.ok and r.error == "hostkey-changed"
    assert old in r.message and new in r.message and "CHANGED" in r.message
    assert "sparkfleet trust node2" in r.message
    assert all(results[n].ok for n in NAMES if n != "node2")


def test_wrong_client_key_is_auth_error(lab, nodes, ssh, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    stranger = nodes[0].model_copy(update={"ssh": nodes[0].ssh.model_copy(update={"key": str(other)})})
    r = ssh.run([stranger], "true")["node1"]
    assert not r.ok and r.error == "auth" and "node1" in r.message


# -- faults ----------------------------------------------------------------------------------
def test_link_down_is_unreachable_within_connect_timeout(lab, nodes, known_hosts):
    lab.link_down("node4")
    with SshTransport(known_hosts, connect_timeout_s=1) as ssh:
        results = ssh.run(nodes, "echo ran", timeout_s=10)
    r = results["node4"]
    assert not r.ok and r.error in ("unreachable", "timeout") and "node4" in r.message
    assert all(results[n].ok for n in NAMES if n != "node4")


def test_link_down_on_open_connection_times_out_then_recovers(lab, nodes, ssh):
    assert ssh.run(nodes, "true")["node5"].ok  # connections are open now
    lab.link_down("node5")
    results = ssh.run(nodes, "echo ran", timeout_s=1)
    assert results["node5"].error in ("timeout", "unreachable") and "node5" in results["node5"].message
    assert all(results[n].ok for n in NAMES if n != "node5")
    lab.link_up("node5")
    assert ssh.run(by_name(nodes, "node5"), "echo back")["node5"].stdout == "back\n"


def test_killed_sshd_is_unreachable(lab, nodes, ssh):
    lab.kill_sshd("node1")
    results = ssh.run(nodes, "echo ran")
    r = results["node1"]
    assert not r.ok and r.error == "unreachable" and "refused" in r.message
    assert all(results[n].ok for n in NAMES if n != "node1")


# -- hostkeys helpers ----------------------------------------------------------------------------
def test_fingerprint_matches_ssh_keygen(lab):
    node = lab.nodes["node1"]
    got = hostkeys.fetch_host_key(node.host, node.port, timeout_s=2)
    assert got.fingerprint == node.fingerprint()
    assert got.key_type == "ssh-ed25519"


def test_pin_writes_bracketed_entries_and_replaces_hashed_ones(tmp_path):
    path = tmp_path / "state" / "known_hosts"
    key1, key2 = paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)
    path.parent.mkdir()
    hashed = paramiko.HostKeys.hash_host("[10.0.0.9]:2222")
    path.write_text(f"# comment kept\n{hashed} {key1.get_name()} {key1.get_base64()}\n"
                    f"other.host {key1.get_name()} {key1.get_base64()}\n")
    assert hostkeys.pinned(path, "10.0.0.9", 2222)[key1.get_name()] == key1
    hostkeys.pin(path, "10.0.0.9", 2222, key2, replace=True)
    text = path.read_text()
    assert hashed not in text and "# comment kept" in text and "other.host" in text
    assert f"[10.0.0.9]:2222 {key2.get_name()} {key2.get_base64()}" in text
    assert hostkeys.pinned(path, "10.0.0.9", 2222) == {key2.get_name(): key2}
    assert path.stat().st_mode & 0o777 == 0o600
    hostkeys.pin(path, "10.0.0.10", 22, key1)
    assert f"\n10.0.0.10 {key1.get_name()} " in path.read_text()


# -- sparkfleet trust --------------------------------------------------------------------------
@pytest.fixture
def inventory_file(lab: SshLab, tmp_path: Path) -> Path:
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(lab.inventory_dict()))
    return path


def trust(capsys, inventory_file: Path, known_hosts: Path, *args: str, answer: str | None = None,
          monkeypatch=None) -> tuple[int, str, str]:
    if answer is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(answer))
    rc = main(["trust", "--root", str(REPO), "--inventory", str(inventory_file),
               "--known-hosts", str(known_hosts), "--timeout", "2", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_trust_yes_pins_and_second_run_says_already_pinned(lab, nodes, capsys, inventory_file, tmp_path):
    kh = tmp_path / "state" / "known_hosts"
    rc, out, err = trust(capsys, inventory_file, kh, "--all", "--yes")
    assert rc == 0, err
    for name, node in lab.nodes.items():
        assert name in out and node.fingerprint() in out and f"{node.host}:{node.port}" in out
    assert out.count("pinned in") == 5
    with SshTransport(kh, connect_timeout_s=2) as ssh:  # what trust pinned is what the transport accepts
        assert all(r.ok for r in ssh.run(nodes, "true").values())
    before = kh.read_text()
    rc, out, _ = trust(capsys, inventory_file, kh, "node1", "--yes")
    assert rc == 0 and "already pinned" in out
    assert kh.read_text() == before


def test_trust_refuses_changed_key_without_replace(lab, nodes, capsys, inventory_file, known_hosts):
    lab.change_host_key("node2")
    before = known_hosts.read_text()
    rc, out, err = trust(capsys, inventory_file, known_hosts, "node2", "--yes")
    assert rc == 1
    assert "HOST KEY CHANGED" in err and "--replace" in out
    assert known_hosts.read_text() == before
    rc, out, err = trust(capsys, inventory_file, known_hosts, "node2", "--yes", "--replace")
    assert rc == 0 and "replaced" in out
    assert known_hosts.read_text().count(lab.nodes["node2"].host_entry + " ") == 1
    with SshTransport(known_hosts, connect_timeout_s=2) as ssh:
        assert ssh.run(by_name(nodes, "node2"), "true")["node2"].ok


def test_trust_prompt_no_pins_nothing_and_yes_pins(lab, capsys, inventory_file, tmp_path, monkeypatch):
    kh = tmp_path / "kh"
    rc, out, err = trust(capsys, inventory_file, kh, "node1", answer="n\n", monkeypatch=monkeypatch)
    assert rc == 1 and "Pin this key for node1? [y/N]" in err and "not pinned" in out
    assert not kh.exists()
    rc, out, err = trust(capsys, inventory_file, kh, "node1", answer="y\n", monkeypatch=monkeypatch)
    assert rc == 0 and hostkeys.pinned(kh, lab.nodes["node1"].host, lab.nodes["node1"].port)
    rc, *_ = trust(capsys, inventory_file, tmp_path / "kh2", "node1", answer="", monkeypatch=monkeypatch)
    assert rc == 1 and not (tmp_path / "kh2").exists()  # no answer (EOF) is no


def test_trust_unknown_node_is_one_line_usage_error(capsys, inventory_file, tmp_path):
    rc, out, err = trust(capsys, inventory_file, tmp_path / "kh", "nosuch", "--yes")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "nosuch" in err and "node1, node2, node3, node4, node5" in err
    rc, _, err = trust(capsys, inventory_file, tmp_path / "kh")
    assert rc == 2 and "--all" in err


def test_trust_unreachable_node_reported_others_pinned(lab, capsys, inventory_file, tmp_path):
    lab.kill_sshd("node3")
    kh = tmp_path / "kh"
    rc, out, err = trust(capsys, inventory_file, kh, "--all", "--yes", "--json")
    assert rc == 1
    doc = json.loads(out)
    status = {row["node"]: row["status"] for row in doc["nodes"]}
    assert status == {"node1": "pinned", "node2": "pinned", "node3": "unreachable", "node4": "pinned",
                      "node5": "pinned"}
    row = next(r for r in doc["nodes"] if r["node"] == "node1")
    assert row["fingerprint"] == lab.nodes["node1"].fingerprint() and row["key_type"] == "ssh-ed25519"
    assert doc["known_hosts"] == str(kh)


def test_trust_help_shows_an_example(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["trust", "--help"])
    assert exc.value.code == 0
    assert "examples:\n  sparkfleet trust reddie" in capsys.readouterr().out


# -- the lab itself ------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_lab_teardown_leaves_nothing_running(lab):
    with SshLab(["a", "b"], prefix="sft", mode=lab.mode) as small:
        pids = [n.proc.pid for n in small.nodes.values()]
        namespaces = [n.netns for n in small.nodes.values() if n.netns]
        workdir = small.dir
    assert not any(_alive(p) for p in pids)
    assert not workdir.exists()
    if lab.mode == "netns":
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        assert not any(ns in listed for ns in namespaces)
        assert f"sft{small.slot}br" not in links and f"sft{small.slot}h0" not in links


def test_lab_removes_leftovers_of_a_crashed_run(lab):
    # A lab in a child process that dies by SIGKILL leaves sshd, namespaces and links behind;
    # the next lab in the same slot removes them before it starts.
    code = ("import sys, time\nfrom tests.sshlab import SshLab\n"
            f"lab = SshLab(['x'], prefix='sfc', mode={lab.mode!r}).start()\n"
            "print(lab.slot, lab.nodes['x'].proc.pid, lab.dir, flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        slot, pid, workdir = child.stdout.readline().split()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    slot, pid = int(slot), int(pid)
    assert _alive(pid)  # the crash left the sshd running
    with SshLab(["y"], prefix="sfl", mode=lab.mode, want_slot=slot) as again:
        deadline = time.monotonic() + 2
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _alive(pid)
        assert not Path(workdir).exists()
        if lab.mode == "netns":
            listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            assert f"sfc{slot}-x" not in listed
        answer = subprocess.run(again.ssh_argv("y", "echo $SPARKFLEET_NODE"), capture_output=True, text=True)
        assert answer.stdout == "y\n", answer.stderr
    assert not (LOCK_DIR / f"slot-{slot}.json").exists()


@contextmanager
def loopback_server(ssh, node, tmp_path: Path, port: int, text: str):
    """python3 -m http.server on the node's 127.0.0.1:PORT serving `text`, listening when the block starts."""
    (tmp_path / "index.html").write_text(text)
    started = ssh.run([node], f"cd {tmp_path} && (setsid python3 -m http.server {port} --bind 127.0.0.1 "
                      f">/dev/null 2>&1 & echo $!)")[node.name]
    assert started.ok, started
    try:
        ready = ssh.run([node], f"for i in $(seq 100); do python3 -c 'import socket; socket.create_connection("
                        f"(\"127.0.0.1\", {port}), 1)' 2>/dev/null && exit 0; sleep 0.1; done; exit 1")[node.name]
        assert ready.ok, ready
        yield
    finally:
        ssh.run([node], f"kill {started.stdout.strip()}")


def test_forward_reaches_a_loopback_only_server_on_the_node_and_closes(lab, nodes, ssh, tmp_path):
    """`ssh -L` over the node's pinned connection: how a loopback-bound head's API is reached. The server
    binds the node's 127.0.0.1 (its own network namespace when the lab has them)."""
    import httpx

    (node,) = by_name(nodes, "node2")
    port = 18080
    with loopback_server(ssh, node, tmp_path, port, "served on node2's loopback"):
        with ssh.forward(node, port) as local:
            assert local != port
            assert httpx.get(f"http://127.0.0.1:{local}/", timeout=10).text == "served on node2's loopback"
        with pytest.raises(httpx.ConnectError):  # the tunnel is gone with the block
            httpx.get(f"http://127.0.0.1:{local}/", timeout=5)


def test_a_forward_opened_before_the_server_listens_keeps_working_once_it_does(lab, nodes, ssh, tmp_path):
    """Readiness polls through the tunnel while the head still boots: a refused connection is one failed
    request, and the same forward reaches the server once it listens (fabric's forward_local stopped
    accepting after the first refusal, and every later request hung in the listen backlog)."""
    import httpx

    (tmp_path / "index.html").write_text("late server")
    (node,) = by_name(nodes, "node2")
    port = 18081
    with ssh.forward(node, port) as local:
        for _ in range(3):  # nothing listens on the node yet: each request fails at once, none hangs
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError)):
                httpx.get(f"http://127.0.0.1:{local}/", timeout=10)
        started = ssh.run([node], f"cd {tmp_path} && (setsid python3 -m http.server {port} --bind 127.0.0.1 "
                          f">/dev/null 2>&1 & echo $!)")["node2"]
        assert started.ok, started
        pid = started.stdout.strip()
        got = None
        try:
            for _ in range(100):
                try:
                    got = httpx.get(f"http://127.0.0.1:{local}/", timeout=10).text
                    break
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError):
                    time.sleep(0.1)
            assert got == "late server"
        finally:
            ssh.run([node], f"kill {pid}")


def test_a_forward_outlives_the_connection_a_timed_out_command_dropped(lab, nodes, ssh, tmp_path):
    """A command on the node times out while a forward to it is open (a slow read of the head in a busy run):
    the transport drops that connection and reconnects at the next use. The forward goes on over the new
    one; bound to the dropped one, every later request failed with "Server disconnected" while the server
    still listened (a lane's gates failed so, under load, in CI)."""
    import httpx

    (node,) = by_name(nodes, "node2")
    port = 18082
    with loopback_server(ssh, node, tmp_path, port, "still here"), ssh.forward(node, port) as local:
        assert httpx.get(f"http://127.0.0.1:{local}/", timeout=10).text == "still here"
        timed_out = ssh.run([node], "sleep 5", timeout_s=0.5)["node2"]
        assert timed_out.error == "timeout", timed_out  # and its connection was dropped
        assert httpx.get(f"http://127.0.0.1:{local}/", timeout=10).text == "still here"
