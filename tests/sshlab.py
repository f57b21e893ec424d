"""SshLab: N real OpenSSH sshd "nodes" on this machine, for tests and benchmarks (not a conftest).

    from tests.sshlab import SshLab, start_lab

    with SshLab(["reddie", "asusi"]) as lab:        # or lab = start_lab(5) inside a test (skips off-CI)
        inv = lab.inventory()                       # sparkfleet Inventory with ssh host/port/user/key set
        lab.link_down("asusi"); lab.kill_sshd("reddie"); lab.change_host_key("asusi"); lab.heal()

As root, each node is its own network namespace on a bridge (10.77.<slot>.11, .12, ...; port 22)
with its own hostname (unshare --uts); otherwise each node is an sshd on its own 127.0.0.1 port.
Keys (one client key, one host key per node) and a known_hosts for them live in a temp dir.
Every node's sshd sets (SetEnv) SPARKFLEET_NODE=<name> and HOME=<lab dir>/<name>/home, since the
namespaces share one filesystem and real nodes do not share homes; `setenv={name: {...}}` adds or
overrides variables per node (SPARKFLEET_SIM_ROOT, PATH, ...) for the simulated lab over SSH.
Every lab holds a slot (a lock file), which names its interfaces and subnet, so labs in parallel
processes never collide and leftovers of a crashed run in the same slot are removed first.

$SPARKFLEET_SSHLAB_MODE=netns|loopback overrides the automatic choice.
When $CI is set, a missing sshd, root or netns support raises LabUnavailable (CI must not skip);
elsewhere `start_lab` turns it into a pytest skip with the reason.
"""

from __future__ import annotations

import atexit
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sparkfleet.schema.inventory import Inventory

Mode = Literal["auto", "netns", "loopback"]
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SLOTS = 200
LOCK_DIR = Path(tempfile.gettempdir()) / f"sparkfleet-sshlab-{os.getuid()}"


class LabUnavailable(RuntimeError):
    """This machine cannot host the lab (no sshd, no root/netns where required)."""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def start_lab(names: int | Sequence[str] = 5, **kwargs) -> SshLab:
    """Start a lab for a test: off CI an unavailable lab skips the test, on CI it fails it."""
    try:
        return SshLab(names, **kwargs).start()
    except LabUnavailable as exc:
        if in_ci():
            raise
        import pytest

        pytest.skip(f"sshlab unavailable: {exc}")


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


@dataclass
class LabNode:
    name: str
    index: int
    host: str
    port: int
    dir: Path
    setenv: dict[str, str]
    netns: str | None = None
    veth: str | None = None  # host-side end of the node's veth pair (link faults)
    proc: subprocess.Popen | None = None
    frozen: bool = False

    @property
    def config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"

    @property
    def host_entry(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def known_hosts_line(self) -> str:
        key_type, b64 = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"{self.host_entry} {key_type} {b64}"

    def fingerprint(self) -> str:
        out = _sh("ssh-keygen", "-l", "-E", "sha256", "-f", str(self.host_key.with_suffix(".pub"))).stdout
        return out.split()[1]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class SshLab:
    """N sshd nodes with fault injection; see the module docstring. Use as a context manager or close()."""

    names: int | Sequence[str] = 5
    mode: Mode = "auto"
    setenv: dict[str, dict[str, str]] = field(default_factory=dict)  # per node: extra sshd SetEnv lines
    trust: bool = True  # write known_hosts with every node's key; False: an empty file
    prefix: str = "sfl"  # interface/netns name prefix (<= 6 chars: names stay <= 15)
    user: str | None = None
    inventory_name: str = "sshlab"
    want_slot: int | None = None  # take exactly this slot (fails if a live lab holds it); default: first free

    def __post_init__(self) -> None:
        if isinstance(self.names, int):
            self.names = [f"node{i + 1}" for i in range(self.names)]
        self.names = list(self.names)
        if not re.fullmatch(r"[a-z]{1,6}", self.prefix):
            raise ValueError("prefix: 1-6 lowercase letters (interface names are limited to 15 chars)")
        self.nodes: dict[str, LabNode] = {}
        self.dir: Path | None = None
        self.slot: int | None = None
        self._lock_fd: int | None = None
        self._closed = False

    # -- paths ---------------------------------------------------------------------------
    @property
    def client_key(self) -> Path:
        return self.dir / "client_key"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}{self.slot}br"

    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.77.{self.slot}.0/24")

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> SshLab:
        """Check the machine, take a slot, make keys, start every sshd and wait until each answers."""
        if not (os.access(SSHD, os.X_OK) and shutil.which("ssh-keygen")):
            raise LabUnavailable("OpenSSH server not installed (apt-get install -y openssh-server)")
        mode = self._choose_mode()
        self.mode = mode
        if self.user is None:
            self.user = "root" if os.geteuid() == 0 else os.environ.get("USER") or _username()
        self._take_slot()
        atexit.register(self.close)
        try:
            self.dir = Path(tempfile.mkdtemp(prefix=f"sshlab-{self.prefix}{self.slot}-"))
            self._slot_file("json").write_text(json.dumps({"prefix": self.prefix, "dir": str(self.dir)}))
            self._keys()
            if mode == "netns":
                self._network()
            for node in self.nodes.values():
                self._start_sshd(node)
            self._wait_ready(list(self.nodes.values()))
            self.write_known_hosts(self.known_hosts, names=list(self.nodes) if self.trust else [])
        except BaseException:
            self.close()
            raise
        return self

    def _choose_mode(self) -> Mode:
        if self.mode == "auto" and os.environ.get("SPARKFLEET_SSHLAB_MODE") in ("netns", "loopback"):
            self.mode = os.environ["SPARKFLEET_SSHLAB_MODE"]  # a developer's explicit choice
        root = os.geteuid() == 0
        netns_ok = root and shutil.which("ip") is not None and shutil.which("unshare") is not None
        if self.mode == "netns" or (self.mode == "auto" and in_ci()):
            if not netns_ok:
                raise LabUnavailable("needs root, iproute2 and unshare for network namespaces"
                                     + (" (CI must run as root)" if in_ci() else ""))
            return "netns"
        if self.mode == "auto":
            return "netns" if netns_ok else "loopback"
        return "loopback"

    def _take_slot(self) -> None:
        LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        for slot in ([self.want_slot] if self.want_slot is not None else range(SLOTS)):
            fd = os.open(LOCK_DIR / f"slot-{slot}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if self.want_slot is not None:
                    raise LabUnavailable(f"sshlab slot {slot} is held by a live lab") from None
                continue  # a live lab in another process holds it
            self.slot, self._lock_fd = slot, fd
            self._clean_stale()
            # a subnet someone else routes (not a stale lab of ours, just removed) is not ours to take
            if self.mode == "netns" and f"10.77.{slot}.0/24" in _sh("ip", "-4", "route", "show", check=False).stdout:
                os.close(fd)
                self.slot, self._lock_fd = None, None
                continue
            return
        raise LabUnavailable(f"no free sshlab slot (tried {self.want_slot if self.want_slot is not None else SLOTS})")

    def _slot_file(self, suffix: str) -> Path:
        return LOCK_DIR / f"slot-{self.slot}.{suffix}"

    def _clean_stale(self) -> None:
        """Remove what a crashed earlier lab in this slot left: processes, namespaces, links, its dir.

        Only names the crashed lab recorded for this slot (its prefix) are touched, never another
        live lab's: that one would hold the slot's lock.
        """
        pids = self._slot_file("pids")
        if pids.is_file():
            for line in pids.read_text().split():
                _kill_tree(int(line), only_if="sshd")
            pids.unlink()
        state = self._slot_file("json")
        if not state.is_file():
            return
        try:
            old = json.loads(state.read_text())
            prefix, old_dir = old["prefix"], Path(old["dir"])
        except (ValueError, KeyError, TypeError):
            state.unlink()
            return
        if shutil.which("ip") and os.geteuid() == 0 and re.fullmatch(r"[a-z]{1,6}", prefix):
            for ns in _sh("ip", "netns", "list", check=False).stdout.splitlines():
                ns = ns.split(" ")[0]
                if ns.startswith(f"{prefix}{self.slot}-"):
                    _kill_netns(ns)
            pattern = re.compile(rf"^{prefix}{self.slot}(br|h\d+)$")
            for line in _sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
                ifname = line.split(":")[1].strip().split("@")[0]
                if pattern.match(ifname):
                    _sh("ip", "link", "del", ifname, check=False)
        if old_dir.name.startswith("sshlab-") and old_dir.is_dir():
            shutil.rmtree(old_dir, ignore_errors=True)
        state.unlink()

    def _keys(self) -> None:
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sshlab-client", "-f", str(self.client_key))
        (self.dir / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        base = ipaddress.IPv4Network(f"10.77.{self.slot}.0/24")
        for i, name in enumerate(self.names):
            node_dir = self.dir / name
            node_dir.mkdir()
            # Each node its own HOME: the namespaces share one filesystem, and real nodes do not share
            # homes (it also keeps the host's ~/.bashrc out of every command).
            (node_dir / "home").mkdir()
            env = {"SPARKFLEET_NODE": name, "HOME": str(node_dir / "home"), **self.setenv.get(name, {})}
            for k, v in env.items():
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or any(c in v for c in '"\n\\'):
                    raise ValueError(f"setenv {name}: {k}={v!r}: plain names and values without quotes")
            if self.mode == "netns":
                node = LabNode(name, i, str(base[11 + i]), 22, node_dir, env,
                               netns=f"{self.prefix}{self.slot}-{name}", veth=f"{self.prefix}{self.slot}h{i}")
            else:
                node = LabNode(name, i, "127.0.0.1", 0, node_dir, env)
            self._new_host_key(node)
            self.nodes[name] = node

    def _new_host_key(self, node: LabNode) -> None:
        for p in (node.host_key, node.host_key.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"sshlab-{node.name}", "-f", str(node.host_key))

    def _network(self) -> None:
        """Bridge + one namespace and veth pair per node (TESTBED.md)."""
        br = self.bridge
        _sh("ip", "link", "add", br, "type", "bridge")
        _sh("ip", "addr", "add", f"10.77.{self.slot}.1/24", "dev", br)
        _sh("ip", "link", "set", br, "up")
        for node in self.nodes.values():
            ns, peer = node.netns, f"{self.prefix}{self.slot}n{node.index}"
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", node.veth, "type", "veth", "peer", "name", peer, "netns", ns)
            _sh("ip", "link", "set", node.veth, "master", br)
            _sh("ip", "link", "set", node.veth, "up")
            _sh("ip", "-n", ns, "link", "set", peer, "name", "eth0")
            _sh("ip", "-n", ns, "addr", "add", f"{node.host}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")

    def _write_config(self, node: LabNode) -> None:
        listen = "0.0.0.0" if self.mode == "netns" else "127.0.0.1"
        lines = [
            f"Port {node.port}", f"ListenAddress {listen}", f"HostKey {node.host_key}", "PidFile none",
            "UsePAM no", "StrictModes no",  # keys live under /tmp (TESTBED.md)
            "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            "UseDNS no", "PrintMotd no", "PrintLastLog no", "Subsystem sftp internal-sftp",
            "MaxStartups 200", "MaxSessions 100", "LogLevel INFO",
            # one SetEnv line: sshd keeps only the first SetEnv keyword it reads
            "SetEnv " + " ".join(f'"{k}={v}"' for k, v in node.setenv.items()),
        ]
        node.config.write_text("\n".join(lines) + "\n")

    def _start_sshd(self, node: LabNode) -> None:
        if self.mode == "loopback" and node.port == 0:
            node.port = _free_port()  # a restarted node keeps its port, so its known_hosts entry still applies
        self._write_config(node)
        sshd = [SSHD, "-D", "-f", str(node.config), "-E", str(node.log)]
        if self.mode == "netns":
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
            inner = f"hostname {node.name} && exec " + " ".join(sshd)
            argv = ["ip", "netns", "exec", node.netns, "unshare", "--uts", "sh", "-c", inner]
        else:
            argv = sshd
        node.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        node.frozen = False
        with open(self._slot_file("pids"), "a") as f:
            f.write(f"{node.proc.pid}\n")

    def _wait_ready(self, nodes: list[LabNode], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(nodes)
        while pending:
            for node in list(pending):
                if node.proc.poll() is not None:
                    if self.mode == "loopback" and "Address already in use" in _tail(node.log):
                        node.port = 0  # another process took the port between pick and bind: pick again
                        self._start_sshd(node)
                        continue
                    raise LabUnavailable(f"sshd for {node.name} exited ({node.proc.returncode}): {_tail(node.log)}")
                if _banner(node.host, node.port):
                    pending.remove(node)
            if pending and time.monotonic() > deadline:
                raise LabUnavailable(f"sshd not answering on {[n.host_entry for n in pending]}")
            if pending:
                time.sleep(0.02)

    def close(self) -> None:
        """Stop every sshd and every process in the namespaces, delete namespaces, links, keys. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for node in self.nodes.values():
            if node.proc is not None:
                _kill_tree(node.proc.pid)
                node.proc.wait()
            if node.netns:
                _kill_netns(node.netns)
                if node.veth:
                    _sh("ip", "link", "del", node.veth, check=False)  # normally gone with the namespace
        if self.mode == "netns" and self.slot is not None:
            _sh("ip", "link", "del", self.bridge, check=False)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.slot is not None:
            for suffix in ("pids", "json"):
                self._slot_file(suffix).unlink(missing_ok=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the slot
            self._lock_fd = None
        atexit.unregister(self.close)

    def __enter__(self) -> SshLab:
        return self if self.nodes else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what tests and tools use ---------------------------------------------------------
    def write_known_hosts(self, path: Path | None = None, names: Sequence[str] | None = None) -> Path:
        """A known_hosts with the nodes' current keys (all nodes by default); returns its path."""
        path = Path(path) if path is not None else self.known_hosts
        chosen = list(self.nodes) if names is None else list(names)
        path.write_text("".join(self.nodes[n].known_hosts_line() + "\n" for n in chosen))
        return path

    def inventory_dict(self, *, node_extra: dict[str, dict] | None = None,
                       groups: dict[str, list[str]] | None = None) -> dict:
        """The YAML-shaped dict of a sparkfleet inventory for these nodes (group `all` holds them all)."""
        nodes = {}
        for name, node in self.nodes.items():
            entry = {
                "ssh": {"host": node.host, "port": node.port, "user": self.user, "key": str(self.client_key)},
                "hardware": "gb10",
                "storage": {"model_root": str(node.dir / "models"), "cache_dir": str(node.dir / "cache")},
            }
            nodes[name] = _merge(entry, (node_extra or {}).get(name, {}))
        return {"name": self.inventory_name, "nodes": nodes, "groups": {"all": list(self.nodes), **(groups or {})}}

    def inventory(self, **kwargs) -> Inventory:
        return Inventory.model_validate(self.inventory_dict(**kwargs))

    def ssh_argv(self, name: str, command: str, known_hosts: Path | None = None) -> list[str]:
        """A plain OpenSSH client command for one node, strict host keys, no user config."""
        node = self.nodes[name]
        return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={known_hosts or self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR", "-i", str(self.client_key),
                "-p", str(node.port), f"{self.user}@{node.host}", command]

    # -- faults -------------------------------------------------------------------------
    def link_down(self, name: str) -> None:
        """The node stops answering, new and open connections alike.

        netns: its veth goes down. loopback: its sshd and every session under it are frozen (SIGSTOP).
        """
        node = self.nodes[name]
        if node.veth:
            _sh("ip", "link", "set", node.veth, "down")
        elif node.proc is not None:
            _signal_tree(node.proc.pid, signal.SIGSTOP)
        node.frozen = True

    def link_up(self, name: str) -> None:
        node = self.nodes[name]
        if node.veth:
            _sh("ip", "link", "set", node.veth, "up")
            # forget the failed ARP entry, else the first new connection waits ~1 s for a retry
            _sh("ip", "neigh", "flush", "to", node.host, "dev", self.bridge, check=False)
        elif node.proc is not None and node.running():
            _signal_tree(node.proc.pid, signal.SIGCONT)
        node.frozen = False

    def kill_sshd(self, name: str, *, sessions: bool = False) -> None:
        """Kill the node's sshd listener (new connections are refused); `sessions` also ends open ones."""
        node = self.nodes[name]
        if node.proc is None:
            return
        if sessions:
            _kill_tree(node.proc.pid)
        else:
            os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait()

    def start_sshd(self, name: str) -> None:
        """Start the node's sshd again (after kill_sshd) and wait until it answers."""
        node = self.nodes[name]
        if not node.running():
            self._start_sshd(node)
            self._wait_ready([node])

    def change_host_key(self, name: str) -> str:
        """Give the node a new host key (as a reinstall would) and restart its sshd; returns the new fingerprint."""
        self.kill_sshd(name)
        self._new_host_key(self.nodes[name])
        self.start_sshd(name)
        return self.nodes[name].fingerprint()

    def heal(self) -> None:
        """Undo link and sshd faults: every link up, every sshd running (host keys stay as they are)."""
        for name, node in self.nodes.items():
            if node.frozen:
                self.link_up(name)
            if not node.running():
                self.start_sshd(name)


# -- helpers ----------------------------------------------------------------------------------
def _username() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _banner(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.settimeout(0.5)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _signal_tree(pid: int, sig: int) -> None:
    """Signal a process and all its descendants (sshd's session children outlive the listener)."""
    tree = _children()
    todo, victims = [pid], []
    while todo:
        p = todo.pop()
        victims.append(p)
        todo.extend(tree.get(p, []))
    for p in victims:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_tree(pid: int, only_if: str | None = None) -> None:
    """SIGKILL a process tree; with `only_if`, only when the pid still runs that program (pids get reused)."""
    if only_if is not None:
        try:
            if only_if not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return
        except OSError:
            return
    _signal_tree(pid, signal.SIGKILL)


def _kill_netns(ns: str) -> None:
    """TESTBED.md order: kill everything in the namespace, then delete it."""
    for _ in range(20):
        pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
        if not pids:
            break
        for p in pids:
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        time.sleep(0.01)
    _sh("ip", "netns", "del", ns, check=False)


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
