"""ssh mode: one real OpenSSH sshd per simulated node, running inside that node, with pinned host keys.

The sshd is a process of the node (node.py starts it with the node's init), so every session lands in
the node's root, processes and hostname, and as root in its network namespace (port 22 on the node's
management address); without root it listens on a 127.0.0.1 port (UsePAM no, StrictModes no, serving
only the invoking user). Host keys are pinned in state_dir()/known_hosts, tagged so `sim down` removes
exactly the lines the sim added.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from sparkfleet.schema.errors import UserError

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")
KNOWN_HOSTS_TAG = "sparkfleet-sim:"  # known_hosts comment field: which lines the sim owns
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def find_sshd() -> str | None:
    """sshd must be run by absolute path (it re-executes itself per connection)."""
    for c in SSHD_CANDIDATES:
        if os.access(c, os.X_OK):
            return c
    found = shutil.which("sshd")
    return os.path.abspath(found) if found else None


def keygen(path: Path, comment: str) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, capture_output=True)


def public_key(path: Path) -> str:
    """`type base64` of a key pair's public half (no comment)."""
    kind, blob = Path(str(path) + ".pub").read_text().split()[:2]
    return f"{kind} {blob}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(conf: Path, *, node: str, listen: str, port: int, host_key: str, authorized_keys: str,
                 pid_file: str) -> None:
    """The node's sshd_config (paths are the node's own)."""
    conf.write_text(
        f"# sparkfleet simulation: sshd of simulated node {node}\n"
        f"Port {port}\n"
        f"ListenAddress {listen}\n"
        f"HostKey {host_key}\n"
        f"PidFile {pid_file}\n"
        f"AuthorizedKeysFile {authorized_keys}\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "X11Forwarding no\n"
        "AllowTcpForwarding yes\n"
        "PrintMotd no\n"
        "PrintLastLog no\n"
        "MaxStartups 100:30:200\n"
        "Subsystem sftp internal-sftp\n"
    )


def wait_banner(node: str, host: str, port: int, timeout_s: float = 30.0) -> None:
    """Wait until the node's sshd answers with an SSH banner."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _banner(host, port):
            return
        time.sleep(0.02)
    raise UserError(f"sshd of simulated node {node} did not answer on {host}:{port} within {timeout_s:g} s")


def _banner(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def host_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def pin_host_keys(known_hosts: Path, entries: dict[str, tuple[str, int, str]]) -> None:
    """Add `HOST KEY sparkfleet-sim:NODE` per node, replacing older lines for those hosts."""
    hosts = {host_entry(h, p) for h, p, _ in entries.values()}
    kept = [line for line in _lines(known_hosts)
            if not (line.split() and line.split()[0] in hosts) and KNOWN_HOSTS_TAG not in line]
    kept += [f"{host_entry(h, p)} {key} {KNOWN_HOSTS_TAG}{node}" for node, (h, p, key) in entries.items()]
    _write_lines(known_hosts, kept)


def unpin_host_keys(known_hosts: Path) -> None:
    if not known_hosts.is_file():
        return
    lines = _lines(known_hosts)
    kept = [line for line in lines if KNOWN_HOSTS_TAG not in line]
    if kept != lines:
        _write_lines(known_hosts, kept)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def _write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)
