"""The operator's ~/.ssh/config: Host aliases, HostName/User/Port/IdentityFile, ProxyJump through a real
jump host (two sshds in network namespaces, the inner one reachable only through the other), strict host
keys on every hop, and `trust --from-known-hosts`."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkfleet.cli.main import main
from sparkfleet.fleet import hostkeys
from tests.sshlab import SshLab, start_lab

REPO = Path(__file__).resolve().parents[1]
STORAGE = {"model_root": "/models", "cache_dir": "/var/cache/x"}


def _inventory(tmp: Path, nodes: dict, **top) -> Path:
    path = tmp / "inv.yaml"
    doc = {"name": "jumplab", **top, "groups": {"all": list(nodes)},
           "nodes": {n: {"hardware": "gb10", "storage": STORAGE, **v} for n, v in nodes.items()}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _plan_inventory(capsys, inv: Path) -> dict:
    """The inventory as sparkfleet resolved it (no node is contacted to load it)."""
    from sparkfleet.opsdir import Spec

    capsys.readouterr()
    return {n: node.ssh for n, node in Spec(REPO).inventory(str(inv)).nodes.items()}


# -- resolution (nothing contacted) ----------------------------------------------------------------------

def test_config_values_apply_and_inventory_values_win(tmp_path: Path, capsys, monkeypatch) -> None:
    key = tmp_path / "id_lab"
    key.write_text("not a real key")
    conf = tmp_path / "ssh_config"
    conf.write_text(f"""
Host bastion
    HostName 192.0.2.1
    User jumper
    Port 2200
Host reddie asusi
    User admin
    Port 2222
    IdentityFile {tmp_path}/missing_key
    IdentityFile {key}
    ProxyJump bastion,ops@192.0.2.9:2022
Host reddie
    HostName 10.0.0.11
Host *
    User fallback
""")
    monkeypatch.setenv("SPARKFLEET_SSH_CONFIG", str(conf))
    inv = _inventory(tmp_path, {
        "reddie": {"ssh": {"alias": "reddie"}},
        "asusi": {"ssh": {"host": "asusi", "user": "root", "port": 22, "proxy_jump": "none"}},
        "bluey": {"ssh": {"host": "10.0.0.13"}},
    })
    ssh = _plan_inventory(capsys, inv)
    r = ssh["reddie"]
    assert (r.host, r.user, r.port, r.key) == ("10.0.0.11", "admin", 2222, str(key))
    assert [str(h) for h in r.jump] == ["jumper@192.0.2.1:2200", "ops@192.0.2.9:2022"]
    a = ssh["asusi"]  # the inventory's user, port and proxy_jump override the file's
    assert (a.host, a.user, a.port, a.jump) == ("asusi", "root", 22, [])
    b = ssh["bluey"]
    assert (b.host, b.user, b.port, b.jump) == ("10.0.0.13", "fallback", 22, [])


def test_no_config_file_changes_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("SPARKFLEET_SSH_CONFIG", raising=False)
    monkeypatch.delenv("SPARKFLEET_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/config
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    inv = _inventory(tmp_path, {"reddie": {"ssh": {"host": "10.0.0.11", "port": 2201}}})
    r = _plan_inventory(capsys, inv)["reddie"]
    assert (r.host, r.user, r.port, r.key, r.jump) == ("10.0.0.11", "root", 2201, None, [])


@pytest.mark.parametrize("command", [["plan", "--profile", "dcp2"], ["trust", "--all", "--yes"],
                                     ["facts"], ["check", "--profile", "dcp2"]])
def test_alias_not_in_the_config_is_one_line_exit_2_nothing_contacted(command, tmp_path: Path, capsys,
                                                                      monkeypatch) -> None:
    import sparkfleet.fleet.connect as connect
    import sparkfleet.fleet.hostkeys as hk

    conf = tmp_path / "ssh_config"
    conf.write_text("Host bastion reddie-bmc\n    User root\n")
    inv = _inventory(tmp_path, {"reddie": {"ssh": {"alias": "redie"}}}, ssh_config=str(conf))
    monkeypatch.setattr(connect, "transport_for", lambda *a, **k: pytest.fail("a node was contacted"))
    monkeypatch.setattr(hk, "fetch_host_key", lambda *a, **k: pytest.fail("a node was contacted"))
    assert main([command[0], "--root", str(REPO), "--inventory", str(inv), *command[1:]]) == 2
    captured = capsys.readouterr()
    line = 1 + inv.read_text().splitlines().index("      alias: redie")
    assert captured.err == (f"sparkfleet: {inv}:{line}: nodes.reddie.ssh.alias: SSH alias 'redie' is not a Host in "
                            f"{conf} (Hosts there: bastion, reddie-bmc)\n")
    assert captured.out == ""


# -- two real sshds: inner is reachable only through bastion ---------------------------------------------

@pytest.fixture(scope="module")
def jumplab():
    lab = start_lab(["bastion", "inner"], mode="netns", prefix="sfj")
    inner = lab.nodes["inner"].host
    # the controller (this namespace) cannot reach inner; bastion, on the lab bridge, can
    subprocess.run(["ip", "route", "add", "blackhole", f"{inner}/32"], check=True)
    try:
        yield lab
    finally:
        subprocess.run(["ip", "route", "del", "blackhole", f"{inner}/32"], check=False)
        lab.close()


@pytest.fixture
def jump_env(jumplab: SshLab, tmp_path: Path, monkeypatch) -> dict:
    b, i = jumplab.nodes["bastion"], jumplab.nodes["inner"]
    conf = tmp_path / "ssh_config"
    conf.write_text(f"""Host bastion
    HostName {b.host}
    User {jumplab.user}
    IdentityFile {jumplab.client_key}
Host inner
    HostName {i.host}
    User {jumplab.user}
    IdentityFile {jumplab.client_key}
    ProxyJump bastion
""")
    monkeypatch.setenv("SPARKFLEET_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("SPARKFLEET_SSH_CONFIG", str(conf))
    inv = _inventory(tmp_path, {"inner": {"ssh": {"alias": "inner"}}})
    return {"inv": inv, "kh": tmp_path / "state" / "known_hosts", "conf": conf}


def _run(capsys, *argv: str, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_inner_is_unreachable_directly(jumplab: SshLab) -> None:
    with pytest.raises(OSError):
        socket.create_connection((jumplab.nodes["inner"].host, 22), timeout=2).close()


def test_trust_then_facts_through_the_jump_host(jumplab: SshLab, jump_env: dict, capsys) -> None:
    inv, kh = jump_env["inv"], jump_env["kh"]
    b, i = jumplab.nodes["bastion"], jumplab.nodes["inner"]
    rc, out, err = _run(capsys, "trust", "--root", str(REPO), "--inventory", str(inv), "--all", "--yes", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert [(r["node"], r["status"], r["fingerprint"]) for r in doc["nodes"]] == [
        ("inner", "pinned", i.fingerprint())]
    assert doc["nodes"][0]["via"] == [f"{jumplab.user}@{b.host}:22"]
    assert [(r["host"], r["status"], r["fingerprint"]) for r in doc["jump_hosts"]] == [
        (b.host, "pinned", b.fingerprint())]
    assert f"jump host {jumplab.user}@{b.host}:22" in err  # each key shown before it is pinned
    assert set(hostkeys.pinned(kh, i.host, 22)) == {"ssh-ed25519"} and hostkeys.pinned(kh, b.host, 22)

    rc, out, err = _run(capsys, "facts", "--root", str(REPO), "--inventory", str(inv), "--json", "--timeout", "20")
    assert rc == 0, out + err
    facts = json.loads(out)
    assert facts["inner"]["hostname"] == "inner"  # the inner namespace's own hostname: it ran there


def test_every_hop_key_is_checked_strictly(jumplab: SshLab, jump_env: dict, capsys, tmp_path: Path) -> None:
    inv, kh = jump_env["inv"], jump_env["kh"]
    b, i = jumplab.nodes["bastion"], jumplab.nodes["inner"]
    # the jump host is unknown: nothing reaches inner
    jumplab.write_known_hosts(kh.parent.mkdir(parents=True, exist_ok=True) or kh, names=["inner"])
    rc, out, _ = _run(capsys, "facts", "--root", str(REPO), "--inventory", str(inv), "--json", "--timeout", "10")
    r = json.loads(out)["inner"]
    assert rc == 1 and r["error"] == "hostkey-unknown"
    assert r["message"].startswith(f"inner: jump host {jumplab.user}@{b.host}:22 (ProxyJump): host key of {b.host} ")
    # the jump host's pinned key is another one: refused as a changed key
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kh.write_text(i.known_hosts_line() + "\n" + f"{b.host} " + " ".join(
        other.with_suffix(".pub").read_text().split()[:2]) + "\n")
    rc, out, _ = _run(capsys, "facts", "--root", str(REPO), "--inventory", str(inv), "--json", "--timeout", "10")
    r = json.loads(out)["inner"]
    assert rc == 1 and r["error"] == "hostkey-changed" and "HOST KEY CHANGED" in r["message"]
    # the jump host is pinned, inner is not: inner's own key is refused
    jumplab.write_known_hosts(kh, names=["bastion"])
    rc, out, _ = _run(capsys, "facts", "--root", str(REPO), "--inventory", str(inv), "--json", "--timeout", "10")
    r = json.loads(out)["inner"]
    assert rc == 1 and r["error"] == "hostkey-unknown" and r["message"].startswith(f"inner: host key of {i.host} ")


def test_trust_from_known_hosts_imports_hashed_entries(jumplab: SshLab, jump_env: dict, capsys, tmp_path: Path,
                                                       monkeypatch) -> None:
    inv, kh = jump_env["inv"], jump_env["kh"]
    b, i = jumplab.nodes["bastion"], jumplab.nodes["inner"]
    theirs = jumplab.write_known_hosts(tmp_path / "openssh_known_hosts")
    with theirs.open("a") as f:
        f.write("# a comment\n10.9.9.9 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJ3nCw5IxGlQuUM+p6lFlZzu3yTBs0eH5q6V4h2P1Vo\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(theirs)], check=True, capture_output=True)
    assert b.host not in theirs.read_text()  # hashed, as Debian's ssh writes them
    # asked, and answered no: nothing pinned
    rc, out, err = _run(capsys, "trust", "--root", str(REPO), "--inventory", str(inv), "--all",
                        "--from-known-hosts", str(theirs), stdin="n\nn\n", monkeypatch=monkeypatch)
    assert rc == 1 and f"{b.fingerprint()}  (from {theirs})" in out and f"{i.fingerprint()}  (from {theirs})" in out
    assert err.count("[y/N]") == 2 and not kh.exists()
    rc, out, err = _run(capsys, "trust", "--root", str(REPO), "--inventory", str(inv), "--all",
                        "--from-known-hosts", str(theirs), "--yes", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert [(r["status"], r["fingerprint"]) for r in doc["jump_hosts"] + doc["nodes"]] == [
        ("pinned", b.fingerprint()), ("pinned", i.fingerprint())]
    assert sorted(kh.read_text().split("\n")) == sorted(["", f"{b.host} " + b.known_hosts_line().split(" ", 1)[1],
                                                         f"{i.host} " + i.known_hosts_line().split(" ", 1)[1]])
    # what was imported is what the transport accepts, on both hops
    rc, out, err = _run(capsys, "facts", "--root", str(REPO), "--inventory", str(inv), "--json", "--timeout", "20")
    assert rc == 0 and json.loads(out)["inner"]["hostname"] == "inner"


def test_from_known_hosts_without_an_entry_pins_nothing(jumplab: SshLab, jump_env: dict, capsys,
                                                        tmp_path: Path) -> None:
    theirs = jumplab.write_known_hosts(tmp_path / "kh_bastion_only", names=["bastion"])
    rc, out, err = _run(capsys, "trust", "--root", str(REPO), "--inventory", str(jump_env["inv"]), "--all",
                        "--from-known-hosts", str(theirs), "--yes", "--json")
    doc = json.loads(out)
    assert rc == 1 and [r["status"] for r in doc["nodes"]] == ["not-in-file"]
    assert doc["jump_hosts"][0]["status"] == "pinned"
