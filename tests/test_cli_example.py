"""No silent example fleet: the shipped `lab` inventory (example addresses) left as the default is never dialled,
and an SSH peer that hangs up during the handshake is reported as that."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from sparkfleet.cli.main import main

REPO = Path(__file__).resolve().parent.parent
MESSAGE = (f"sparkfleet: example inventory: set SPARKFLEET_INVENTORY or -i (the default {REPO}/inventories/lab.yaml "
           "holds example addresses; `sparkfleet config` shows where the default comes from)")

# every verb that contacts nodes, as an operator would first type it
CONTACTS = [
    ["status"], ["status", "--json"], ["logs", "--profile", "dcp2"], ["facts"], ["facts", "--profile", "dcp2"],
    ["check", "--profile", "dcp2"], ["trust", "--all", "--yes"], ["up", "--profile", "dcp2"],
    ["down", "--profile", "dcp2"], ["play", "up", "--profile", "dcp2"], ["restore", "dcp2"],
    ["watch", "--profile", "dcp2"], ["watch", "--profile", "dcp2", "--unit"], ["gates", "--profile", "dcp2"],
    ["bench", "--profile", "dcp2"], ["patches", "verify", "--profile", "exl3tp3"],
    ["engram-local", "--profile", "dcp2"], ["exporter", "--once"], ["pin", "--profile", "dcp2"],
]


@pytest.fixture
def unchosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No -i, no $SPARKFLEET_INVENTORY, no config file: the built-in default `lab` (example: true)."""
    monkeypatch.delenv("SPARKFLEET_INVENTORY", raising=False)
    monkeypatch.delenv("SPARKFLEET_ROOT", raising=False)
    monkeypatch.setenv("SPARKFLEET_CONFIG", str(tmp_path / "no-config.yaml"))
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))

    def dial(*args, **kwargs):
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", dial)
    monkeypatch.setattr(socket, "create_connection", dial)


@pytest.mark.parametrize("argv", CONTACTS, ids=[" ".join(a) for a in CONTACTS])
def test_the_example_default_is_refused_before_connecting(argv: list[str], unchosen, capsys) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [MESSAGE]
    assert captured.out == ""


def test_plan_still_reads_the_example(unchosen, capsys) -> None:
    assert main(["plan", "--profile", "dcp2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inventory"] == "lab"


@pytest.mark.parametrize("how", ["-i", "env", "config"])
def test_chosen_lab_is_used(how: str, unchosen, tmp_path: Path, monkeypatch, capsys) -> None:
    """Chosen by any of the three ways, the same inventory passes the gate and is dialled (here: the refused socket)."""
    argv = ["facts", "--json"]
    if how == "-i":
        argv += ["-i", "lab"]
    elif how == "env":
        monkeypatch.setenv("SPARKFLEET_INVENTORY", "lab")
    else:
        conf = tmp_path / "config.yaml"
        conf.write_text("inventory: lab\n")
        monkeypatch.setenv("SPARKFLEET_CONFIG", str(conf))
    assert main(argv) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {n: d["message"] for n, d in doc.items()}["reddie"] == (
        "reddie: SSH to root@10.10.0.11:22 failed: AssertionError: a connection was attempted")


class HangUp:
    """A TCP server that accepts every connection and ends it at once (sshd over its MaxStartups does)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.shutdown(socket.SHUT_WR)  # EOF first, then wait for the client to go: no reset races it
            conn.settimeout(10)
            try:
                while conn.recv(4096):
                    pass
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=5)


def test_eof_during_the_ssh_handshake_is_said(tmp_path: Path, monkeypatch, capsys) -> None:
    server = HangUp()
    try:
        inv = tmp_path / "one.yaml"
        inv.write_text(f"name: one\nnodes:\n  n1:\n    ssh: {{host: 127.0.0.1, port: {server.port}, user: me}}\n"
                       "    hardware: gb10\n    storage: {model_root: /m, cache_dir: /c}\ngroups:\n  g: [n1]\n")
        monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
        (tmp_path / "ssh_config").write_text("")
        monkeypatch.setenv("SPARKFLEET_SSH_CONFIG", str(tmp_path / "ssh_config"))
        assert main(["status", "-i", str(inv), "--json"]) == 1
    finally:
        server.close()
    rows = json.loads(capsys.readouterr().out)["containers"]
    assert rows == [{"node": "n1", "error": f"n1: me@127.0.0.1:{server.port} accepted TCP, then closed the "
                     "connection during the SSH handshake (EOF); check sshd on the node (MaxStartups, a "
                     "tcpwrapper or fail2ban ban, or not sshd)", "state": "unreachable, may be running"}]
