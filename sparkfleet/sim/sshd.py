"""ssh mode: one real OpenSSH sshd per simulated node on a 127.0.0.1 port, with pinned host keys.

No root needed (TESTBED.md): each sshd runs as the invoking user with UsePAM no and StrictModes no,
serves only that user, and puts the node's sandbox on the session's environment with SetEnv
(SPARKFLEET_SIM_ROOT, SPARKFLEET_NODE, PATH with R/bin first, HOME=R/home). SFTP starts in R/home too,
so `put` to `~/...` lands in the sandbox. Host keys are pinned in state_dir()/known_hosts, tagged so
`sim down` removes exactly the lines the sim added.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from sparkfleet.spec.errors import UserError

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


def _no_space(*paths: Path) -> None:
    for p in paths:
        if any(ch.isspace() for ch in str(p)) or '"' in str(p):
            raise UserError(f"ssh mode needs a state directory without spaces or quotes (sshd_config cannot say "
                            f"{str(p)!r}); set SPARKFLEET_STATE to another directory")


def write_config(conf: Path, *, node: str, root: Path, port: int, host_key: Path, authorized_keys: Path,
                 pid_file: Path) -> None:
    _no_space(conf, root, host_key, authorized_keys, pid_file)
    env = (f"SPARKFLEET_SIM_ROOT={root} SPARKFLEET_NODE={node} PATH={root / 'bin'}:{SYSTEM_PATH} "
           f"HOME={root / 'home'}")
    conf.write_text(
        f"# sparkfleet simulation: sshd for simulated node {node}\n"
        f"Port {port}\n"
        "ListenAddress 127.0.0.1\n"
        f"HostKey {host_key}\n"
        f"PidFile {pid_file}\n"
        f"AuthorizedKeysFile {authorized_keys}\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "UsePAM no\n"
        "StrictModes no\n"  # the keys live in a state dir that may be group-writable (tests' tmp dirs)
        "X11Forwarding no\n"
        "PrintMotd no\n"
        "PrintLastLog no\n"
        "MaxStartups 100:30:200\n"
        f"SetEnv {env}\n"
        f"Subsystem sftp internal-sftp -d {root / 'home'}\n"
    )


def ensure_privsep_dir() -> None:
    """Root's sshd refuses to start without /run/sshd (TESTBED.md); an unprivileged one does not need it."""
    if os.geteuid() != 0 or os.path.isdir("/run/sshd"):
        return
    try:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create /run/sshd for sshd: {exc}") from None


def start(sshd: str, conf: Path, pid_file: Path, log: Path, port: int, timeout_s: float = 10.0) -> int:
    """Start a daemonised sshd and wait until it answers with an SSH banner; returns its pid."""
    ensure_privsep_dir()
    with contextlib.suppress(FileNotFoundError):
        pid_file.unlink()
    proc = subprocess.run([sshd, "-f", str(conf), "-E", str(log)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or _tail(log)).splitlines()[-1:] or ["no output"]
        raise UserError(f"sshd for {conf.parent.name} did not start (exit {proc.returncode}): {tail[0]}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pid_file.is_file() and pid_file.read_text().strip() and _banner(port):
            return int(pid_file.read_text().strip())
        time.sleep(0.02)
    raise UserError(f"sshd for {conf.parent.name} did not answer on 127.0.0.1:{port} within {timeout_s:g} s: "
                    f"{_tail(log)}")


def _tail(log: Path) -> str:
    try:
        lines = log.read_text().strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def alive(pid: int) -> bool:
    """Running and not a zombie (an orphaned sshd can linger as one until init reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (an sshd's per-connection children and the sessions they run)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def owned_pid(pid_file: Path, conf: Path) -> int | None:
    """The pid in pid_file, only if that process is the sshd started with this config (pids get reused)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) and str(conf) in _cmdline(pid) else None


def stop(pid_file: Path, conf: Path, timeout_s: float = 5.0) -> bool:
    """Stop the node's sshd and whatever sessions it still runs; True when one was running."""
    pid = owned_pid(pid_file, conf)
    if pid is None:
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
        return False
    victims = [pid] + descendants(pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for v in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(v, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(alive(v) for v in victims):
            time.sleep(0.02)
        if not any(alive(v) for v in victims):
            break
    with contextlib.suppress(FileNotFoundError):
        pid_file.unlink()
    return True


def pin_host_keys(known_hosts: Path, entries: dict[str, tuple[int, str]]) -> None:
    """Add `[127.0.0.1]:PORT KEY sparkfleet-sim:NODE` per node, replacing older lines for those hosts."""
    hosts = {f"[127.0.0.1]:{port}" for port, _ in entries.values()}
    kept = [line for line in _lines(known_hosts)
            if not (line.split() and line.split()[0] in hosts) and KNOWN_HOSTS_TAG not in line]
    kept += [f"[127.0.0.1]:{port} {key} {KNOWN_HOSTS_TAG}{node}" for node, (port, key) in entries.items()]
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
