"""Host keys: fetch a node's key without trusting it, fingerprint it, and pin it in sparkfleet's known_hosts.

sparkfleet keeps its own known_hosts (`state_dir()/known_hosts`, OpenSSH format) so that trusting a
lab node is an explicit step (`sparkfleet trust NODE`) and never a side effect of connecting.
Entries for port 22 are `host`, for other ports `[host]:port`, as OpenSSH and paramiko look them up.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry

from sparkfleet.root import state_dir

# paramiko logs every failed handshake with a traceback at ERROR; with no logging configured Python
# prints that to stderr. sparkfleet reports each failure as one line per node instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def default_known_hosts() -> Path:
    """sparkfleet's own known_hosts file (never ~/.ssh/known_hosts)."""
    return state_dir() / "known_hosts"


def host_entry(host: str, port: int) -> str:
    """The name a known_hosts line uses for host:port: `host` on 22, else `[host]:port`."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint: `SHA256:` + unpadded base64 of sha256(key blob)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass
class FetchedKey:
    host: str
    port: int
    key: paramiko.PKey

    @property
    def key_type(self) -> str:
        return self.key.get_name()

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key)


def fetch_host_key(host: str, port: int = 22, *, timeout_s: float = 10.0,
                   prefer: list[str] | None = None, sock=None) -> FetchedKey:
    """Run the SSH key exchange with host:port and return the server's host key, trusting nothing.

    No authentication happens and nothing is written. `prefer` puts those key types first in the
    negotiation, so a check against an already-pinned key compares keys of the same type. `sock`
    is an open channel to host:port (through a jump host) to use instead of connecting directly.
    Raises OSError (refused, unreachable, timeout) or paramiko.SSHException (not an SSH server).
    """
    if sock is None:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout_s
        transport.handshake_timeout = timeout_s
        if prefer:
            opts = transport.get_security_options()
            supported = list(opts.key_types)
            opts.key_types = [k for k in prefer if k in supported] + [k for k in supported if k not in prefer]
        transport.start_client(timeout=timeout_s)
        return FetchedKey(host, port, transport.get_remote_server_key())
    finally:
        transport.close()
        sock.close()


def load(path: Path) -> paramiko.HostKeys:
    """The keys in a known_hosts file (empty when the file does not exist yet)."""
    keys = paramiko.HostKeys()
    if path.is_file():
        keys.load(str(path))
    return keys


def pinned(path: Path, host: str, port: int) -> dict[str, paramiko.PKey]:
    """Keys pinned for host:port, by key type (hashed and plain entries both match)."""
    found = load(path).lookup(host_entry(host, port))
    return dict(found) if found is not None else {}


def _matches(line: str, name: str) -> bool:
    """Whether one known_hosts line names `name` (plain or hashed `|1|salt|hash`)."""
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return False
    try:
        entry = HostKeyEntry.from_line(stripped)
    except Exception:  # a line paramiko cannot parse is kept as it is, never matched
        return False
    if entry is None:
        return False
    for host in entry.hostnames:
        if host == name:
            return True
        if host.startswith("|1|") and paramiko.HostKeys.hash_host(name, host) == host:
            return True
    return False


def pin(path: Path, host: str, port: int, key: paramiko.PKey, *, replace: bool = False) -> None:
    """Add host:port's key to known_hosts, atomically (tmp file + rename, mode 0600).

    With `replace`, every existing line for host:port is dropped first (the key changed and the user
    verified the new one); otherwise other key types already pinned for the host stay.
    Lines for other hosts, comments and lines paramiko cannot parse are kept verbatim.
    """
    name = host_entry(host, port)
    lines = path.read_text().splitlines() if path.is_file() else []
    if replace:
        lines = [line for line in lines if not _matches(line, name)]
    new = f"{name} {key.get_name()} {key.get_base64()}"
    if new not in lines:
        lines.append(new)
    write_atomic(path, ("\n".join(lines) + "\n").encode(), mode=0o600)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write a file so readers see the old content or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
