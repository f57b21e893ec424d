"""SSH transport: one fabric/paramiko connection per node, commands run on all nodes in parallel.

Host keys are checked strictly against sparkfleet's known_hosts (`sparkfleet trust NODE` pins them):
fabric's default AutoAddPolicy is replaced before any connection opens, so an unknown key is refused
and a changed key is reported with both fingerprints. Every failure becomes that node's `Result`;
the other nodes' results always come back.

Commands run on a raw paramiko channel rather than through fabric's `Connection.run`: invoke feeds
stdin one byte per 10 ms from file-like objects and inlines env without quoting, and sparkfleet
sends scripts on stdin and secrets-bearing env values, so it does both itself.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import paramiko
from fabric import Config, Connection

from sparkfleet.fleet.forward import local_forward
from sparkfleet.fleet.hostkeys import default_known_hosts, fingerprint, host_entry
from sparkfleet.fleet.transport import Result, Transport, fan_out, telling_line
from sparkfleet.schema.inventory import Hop, Node
from sparkfleet.userconfig import fanout

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DRAIN_AFTER_EXIT_S = 2.0  # a background child that keeps stdout open must not hold a finished command


class UnknownHostKey(paramiko.SSHException):
    """The server's key is not in known_hosts (raised by the strict policy, carries the key offered)."""

    def __init__(self, hostname: str, key: paramiko.PKey):
        super().__init__(f"Server {hostname!r} not found in known_hosts")
        self.hostname = hostname
        self.key = key


class StalledConnection(TimeoutError):
    """An open connection stopped answering (the node or its link went down after we connected)."""

    def __init__(self, waited_s: float):
        super().__init__(f"no answer on the open connection within {waited_s:g}s")
        self.waited_s = waited_s


class StrictPolicy(paramiko.RejectPolicy):
    """paramiko's RejectPolicy, raising an exception that keeps the offered key for the message."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(hostname, key)


def env_prefix(env: dict[str, str] | None) -> str:
    """`export K='v' ...` plus a newline, every value shlex-quoted (sshd's AcceptEnv is usually off).

    A newline rather than `&&` so the export covers the whole command, including `a & b` forms.
    """
    if not env:
        return ""
    for name in env:
        if not ENV_NAME.match(name):
            raise ValueError(f"env name {name!r} is not a valid shell variable name")
    return "export " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items()) + "\n"


def where(node: Node) -> str:
    at = f"{node.ssh.user}@{node.ssh.host}:{node.ssh.port}"
    return at + "".join(f" via {hop}" for hop in reversed(node.ssh.jump))


class HopFailed(Exception):
    """Connecting to a jump host (ProxyJump) on the way to a node failed; `cause` says how."""

    def __init__(self, hop: Hop, cause: BaseException):
        super().__init__(f"jump host {hop}: {cause}")
        self.hop = hop
        self.cause = cause


class SshTransport(Transport):
    """Run commands and copy files over SSH with strict host-key checking; see the module docstring."""

    def __init__(self, known_hosts: Path | str | None = None, *, connect_timeout_s: float = 10.0,
                 put_timeout_s: float = 120.0, max_parallel: int | None = None, wait_once: bool = False) -> None:
        self.known_hosts = Path(known_hosts) if known_hosts is not None else default_known_hosts()
        self.connect_timeout_s = connect_timeout_s
        # wait_once: a node whose connect timed out (nothing came back: a blackhole, not a refusal) is not
        # waited for again by this transport; its later calls fail at once with that answer. For one run
        # (runner/run.py), so each of its steps does not pay the connect timeout again for the same node.
        self.wait_once = wait_once
        self._silent: dict[str, Result] = {}
        self.put_timeout_s = put_timeout_s
        self.max_parallel = fanout() if max_parallel is None else max_parallel  # the operator's `fanout` setting
        self._conns: dict[str, tuple[tuple, Connection]] = {}
        self._hops: dict[tuple, Connection] = {}  # jump host connections, shared by the nodes behind them
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    # -- public interface --------------------------------------------------------------
    def run_each(self, nodes: list[Node], commands: Mapping[str, str], *,
                 stdin: Mapping[str, str] | None = None, timeout_s: float = 60.0,
                 env: dict[str, str] | None = None) -> dict[str, Result]:
        """Each node's own command (and stdin), all at once over its connection; one Result per node."""
        prefix = env_prefix(env)
        stdin = stdin or {}
        return self._each([n for n in nodes if n.name in commands], lambda conn, node: self._exec(
            conn, node, prefix + commands[node.name], (stdin.get(node.name) or "").encode(), timeout_s))

    def put(self, nodes: list[Node], data: bytes, remote_path: str, *, mode: int = 0o644) -> dict[str, Result]:
        """Write `data` to `remote_path` on every node: parents created, tmp file + rename, `mode` applied.

        `~/...` and relative paths are taken from the login shell's $HOME on the node.
        """
        return self._each(nodes, lambda conn, node: self._put(conn, node, data, remote_path, mode))

    @contextmanager
    def forward(self, node: Node, remote_port: int, remote_host: str = "127.0.0.1") -> Iterator[int]:
        """A local port on 127.0.0.1 forwarded to remote_host:remote_port as the node sees it, over the
        node's pinned connection (host key checked as for every command); closed when the block ends.
        How a loopback-bound head's API is reached from here (`ssh -L`)."""
        self._connection(node)  # connect now: a node that cannot be reached fails here, not at the first use
        # each connection through the forward goes over the node's connection of that moment (reconnected
        # when a timed-out command dropped the old one), not the one open when the forward began
        with local_forward(lambda: self._connection(node).transport, remote_host, remote_port) as local_port:
            yield local_port

    def close(self) -> None:
        """Close every open connection; the transport can still be used (it reconnects)."""
        with self._guard:
            conns, self._conns = list(self._conns.values()), {}
            hops, self._hops = list(self._hops.values()), {}
        for _, conn in conns:
            _quiet_close(conn)
        for conn in reversed(hops):  # the last hop first: its channel runs through the ones before
            _quiet_close(conn)

    def __enter__(self) -> SshTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- per node ----------------------------------------------------------------------
    def _each(self, nodes: list[Node], work) -> dict[str, Result]:
        def one(node: Node) -> Result:
            with self._guard:
                silent = self._silent.get(node.name)
            if silent is not None:
                return silent
            try:
                conn = self._connection(node)
            except Exception as exc:  # noqa: BLE001 - every failure becomes this node's Result
                result = connect_failure(node, exc, self.known_hosts, self.connect_timeout_s)
                if self.wait_once and isinstance(exc, TimeoutError):
                    with self._guard:
                        self._silent[node.name] = Result(
                            node.name, False, error=result.error, extra=result.extra,
                            message=f"{result.message} (earlier in this run: not waited for again)")
            else:
                try:
                    result = work(conn, node)
                except Exception as exc:  # noqa: BLE001
                    self._drop(node)  # the connection may be dead; the next call reconnects
                    result = session_failure(node, exc)
                else:
                    if result.error == "timeout":
                        # maybe a slow command, maybe a dead link: a fresh connection tells them apart
                        # within the connect timeout next time instead of hanging a whole command timeout
                        self._drop(node)
            return result

        return fan_out(nodes, one, self.max_parallel)

    def _connection(self, node: Node) -> Connection:
        """The node's open connection, opened on first use and reused until close()."""
        params = (node.ssh.host, node.ssh.port, node.ssh.user, node.ssh.key, str(self.known_hosts),
                  tuple(map(str, node.ssh.jump)))
        with self._guard:
            lock = self._locks.setdefault(node.name, threading.Lock())
        with lock:  # one connection per node even when two calls race for it
            with self._guard:
                cached = self._conns.get(node.name)
            if cached is not None:
                old_params, conn = cached
                if old_params == params and conn.transport is not None and conn.transport.is_active():
                    return conn
                _quiet_close(conn)
            conn = self._open(node)
            with self._guard:
                self._conns[node.name] = (params, conn)
            return conn

    def _gateway(self, hops: list[Hop]) -> Connection | None:
        """The open connection to the last of `hops` (each through the one before), host keys strict."""
        gateway = None
        for n, hop in enumerate(hops):
            key = tuple(map(str, hops[:n + 1])) + ((hop.key or ""),)
            with self._guard:
                lock = self._locks.setdefault(f"hop:{key}", threading.Lock())
            with lock:
                with self._guard:
                    conn = self._hops.get(key)
                if conn is None or conn.transport is None or not conn.transport.is_active():
                    try:
                        conn = self._connect(hop.host, hop.port, hop.user, hop.key, gateway)
                    except Exception as exc:  # noqa: BLE001 - reported as this hop's failure
                        raise HopFailed(hop, exc) from exc
                    with self._guard:
                        self._hops[key] = conn
            gateway = conn
        return gateway

    def _open(self, node: Node) -> Connection:
        gateway = self._gateway(node.ssh.jump) if node.ssh.jump else None
        return self._connect(node.ssh.host, node.ssh.port, node.ssh.user, node.ssh.key, gateway)

    def _connect(self, host: str, port: int, user: str, key: str | None, gateway: Connection | None) -> Connection:
        """One strict connection to host:port, directly or through `gateway`'s direct-tcpip channel."""
        timeout = self.connect_timeout_s
        kwargs: dict = {
            # fabric's connect_timeout is cast to int; paramiko takes float seconds here
            "timeout": timeout, "banner_timeout": timeout, "auth_timeout": timeout, "channel_timeout": timeout,
        }
        if key:
            # like IdentitiesOnly: the inventory's key and nothing else, so auth failures are clear
            kwargs.update(key_filename=os.path.expanduser(key), look_for_keys=False, allow_agent=False)
        # An empty, explicit SSHConfig: fleet/sshconfig.py already applied the operator's file to the
        # inventory (fabric's own reading would also follow ProxyJump with unchecked host keys).
        config = Config(ssh_config=paramiko.SSHConfig(), lazy=True)
        # with a gateway Connection, fabric opens a direct-tcpip channel through it as the socket
        conn = Connection(host, user=user, port=port, config=config, connect_kwargs=kwargs, gateway=gateway)
        # Strict host keys: replace fabric's AutoAddPolicy before the connection opens.
        if self.known_hosts.is_file():
            conn.client.load_host_keys(str(self.known_hosts))
        conn.client.set_missing_host_key_policy(StrictPolicy())
        try:
            conn.open()
        except BaseException:
            _quiet_close(conn)
            raise
        # A command is several small packets in a row (open, exec, EOF); without this, Nagle plus
        # the server's delayed ACK adds ~40 ms to some commands.
        if isinstance(conn.transport.sock, socket.socket):  # not when tunnelled through a gateway
            conn.transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _drop(self, node: Node) -> None:
        with self._guard:
            cached = self._conns.pop(node.name, None)
        if cached is not None:
            _quiet_close(cached[1])

    def _exec(self, conn: Connection, node: Node, command: str, stdin: bytes, timeout_s: float) -> Result:
        start = time.monotonic()
        deadline = start + timeout_s
        try:
            chan = conn.transport.open_session(timeout=min(self.connect_timeout_s, timeout_s))
        except paramiko.SSHException as exc:
            if "Timeout opening channel" not in str(exc):
                raise
            raise StalledConnection(min(self.connect_timeout_s, timeout_s)) from exc
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            chan.exec_command(command)
            threads = [
                threading.Thread(target=_pump, args=(chan.recv, out), daemon=True),
                threading.Thread(target=_pump, args=(chan.recv_stderr, err), daemon=True),
                threading.Thread(target=_feed, args=(chan, stdin), daemon=True),
            ]
            for t in threads:
                t.start()
            exited = chan.status_event.wait(max(0.0, deadline - time.monotonic()))
            if exited:
                drain_until = min(deadline, time.monotonic() + DRAIN_AFTER_EXIT_S)
                for t in threads[:2]:
                    t.join(max(0.0, drain_until - time.monotonic()))
        finally:
            if not chan.status_event.is_set():
                # Timed out (or failed): closing the channel is what SSH offers; the remote command
                # sees EOF / SIGPIPE and a later `stop` step cleans up what it started.
                chan.close()
        stdout = b"".join(out).decode(errors="replace")
        stderr = b"".join(err).decode(errors="replace")
        if not exited:
            return Result(node.name, False, stdout, stderr, error="timeout",
                          message=f"{node.name}: command did not finish within {timeout_s:g}s on {where(node)}; "
                          f"output so far is kept (raise the timeout or check the node)")
        code = chan.recv_exit_status()
        chan.close()
        if code == 0:
            return Result(node.name, True, stdout, stderr, exit_code=0)
        last = [line] if (line := telling_line(stderr, stdout)) else []
        what = f"exited with status {code}" if code >= 0 else "was killed by a signal (no exit status)"
        return Result(node.name, False, stdout, stderr, exit_code=code, error="exit",
                      message=f"{node.name}: command {what}" + (f": {last[0][:200]}" if last else ""))

    def _home(self, conn: Connection, node: Node, sftp: paramiko.SFTPClient) -> str:
        """The login shell's $HOME, so `~` in put() is the `~` commands see (sshd SetEnv may move it)."""
        home = getattr(conn, "sparkfleet_home", None)
        if home is None:
            probe = self._exec(conn, node, 'printf %s "$HOME"', b"", self.connect_timeout_s)
            # an SFTP session starts in the passwd home dir: the fallback when the shell says nothing
            home = probe.stdout if probe.ok and probe.stdout.startswith("/") else sftp.normalize(".")
            conn.sparkfleet_home = home
        return home

    def _put(self, conn: Connection, node: Node, data: bytes, remote_path: str, mode: int) -> Result:
        try:
            sftp = conn.sftp()
        except (paramiko.SSHException, EOFError) as exc:
            if not conn.transport.is_active():
                raise  # the connection died: a session failure, not a missing SFTP server
            return Result(node.name, False, error="error",
                          message=f"{node.name}: no SFTP on {where(node)} ({exc or type(exc).__name__}); "
                          f"enable `Subsystem sftp` in the node's sshd_config")
        sftp.get_channel().settimeout(self.put_timeout_s)
        if remote_path.startswith("~") and not (remote_path == "~" or remote_path.startswith("~/")):
            return Result(node.name, False, error="error",
                          message=f"{node.name}: put {remote_path}: only ~/ (the login user's home) is supported")
        path = remote_path
        if path.startswith("~"):
            path = path[2:] if len(path) > 1 else "."
        if not path.startswith("/"):
            path = posixpath.join(self._home(conn, node, sftp), path)
        path = posixpath.normpath(path)
        parent, base = posixpath.split(path)
        try:
            _makedirs(sftp, parent)
            tmp = posixpath.join(parent, f".{base}.sparkfleet-{uuid.uuid4().hex[:8]}.tmp")
            try:
                with sftp.open(tmp, "wb") as f:
                    f.chmod(mode)  # before the bytes go in, so a 0600 secret is never world-readable
                    f.set_pipelined(True)
                    f.write(data)
                sftp.posix_rename(tmp, path)  # atomic replace (OpenSSH's posix-rename extension)
            except BaseException:
                try:
                    sftp.remove(tmp)
                except Exception:  # noqa: BLE001 - the original error matters, not the cleanup's
                    pass
                raise
        except TimeoutError:
            raise  # a stalled node is a session failure ('timeout'), not a write error
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            return Result(node.name, False, error="error",
                          message=f"{node.name}: cannot write {path} on {where(node)}: {reason}")
        return Result(node.name, True, extra={"path": path, "bytes": len(data), "mode": oct(mode)})


# -- helpers -----------------------------------------------------------------------------
def _pump(recv, sink: list[bytes]) -> None:
    """Read one stream of a channel until EOF (or the channel closes)."""
    try:
        while True:
            chunk = recv(65536)
            if not chunk:
                return
            sink.append(chunk)
    except (OSError, EOFError, paramiko.SSHException):
        return


def _feed(chan: paramiko.Channel, data: bytes) -> None:
    """Send stdin, then EOF, so commands that read stdin (cat, python3 -) finish."""
    try:
        if data:
            chan.sendall(data)
        chan.shutdown_write()
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the command exited without reading it all, or the channel was closed on timeout


def _makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """`mkdir -p` over SFTP."""
    try:
        sftp.stat(path)
        return
    except FileNotFoundError:
        pass
    parent = posixpath.dirname(path)
    if parent and parent != path:
        _makedirs(sftp, parent)
    try:
        sftp.mkdir(path)
    except OSError:
        sftp.stat(path)  # another writer made it meanwhile; anything else re-raises from stat


def _quiet_close(conn: Connection) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - closing a dead connection may fail in many ways; it is closed
        pass


def connect_failure(node: Node, exc: BaseException, known_hosts: Path, timeout_s: float) -> Result:
    """Turn a connect-time exception into the node's Result: error kind plus a one-line remedy."""
    if isinstance(exc, HopFailed):  # judged as if the jump host were the node, then named as the hop
        hop = exc.hop
        via = node.model_copy(update={"ssh": node.ssh.model_copy(update={
            "host": hop.host, "port": hop.port, "user": hop.user, "key": hop.key, "jump": []})})
        inner = connect_failure(via, exc.cause, known_hosts, timeout_s)
        message = inner.message.removeprefix(f"{node.name}: ")
        return Result(node.name, False, error=inner.error, extra={**inner.extra, "jump_host": str(hop)},
                      message=f"{node.name}: jump host {hop} (ProxyJump): {message}")
    name, at = node.name, where(node)
    entry = host_entry(node.ssh.host, node.ssh.port)

    def fail(kind, message: str, **extra) -> Result:
        return Result(name, False, error=kind, message=message, extra=extra)

    if isinstance(exc, paramiko.BadHostKeyException):
        expected, got = fingerprint(exc.expected_key), fingerprint(exc.key)
        return fail("hostkey-changed",
                    f"{name}: HOST KEY CHANGED for {entry}: expected {expected} ({exc.expected_key.get_name()}), "
                    f"got {got} ({exc.key.get_name()}); the node was reinstalled or someone is in between: "
                    f"verify the new key out of band, then re-pin with `sparkfleet trust {name} --replace`",
                    expected=expected, got=got)
    if isinstance(exc, UnknownHostKey):
        got = fingerprint(exc.key)
        return fail("hostkey-unknown",
                    f"{name}: host key of {entry} ({exc.key.get_name()} {got}) is not pinned in {known_hosts}; "
                    f"check it and pin it with `sparkfleet trust {name}`", got=got)
    if isinstance(exc, paramiko.AuthenticationException) or (
            isinstance(exc, paramiko.SSHException) and "No authentication methods" in str(exc)):
        key = f"key {node.ssh.key}" if node.ssh.key else "the agent / default keys"
        return fail("auth", f"{name}: {at} refused {key}: {exc}; add the public key to "
                    f"{node.ssh.user}'s authorized_keys on the node or set ssh.key in the inventory")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        if codes == {errno.ECONNREFUSED}:
            return fail("unreachable", f"{name}: connection refused by {at}; is sshd running on the node?")
        return fail("unreachable", f"{name}: cannot reach {at} ({_reason(exc)}); check the node is up and "
                    f"the address in the inventory")
    if isinstance(exc, TimeoutError):  # socket.timeout is TimeoutError
        return fail("unreachable", f"{name}: no answer from {at} within {timeout_s:g}s "
                    f"(node down, link down or firewalled); check the node and its network")
    if isinstance(exc, socket.gaierror):
        return fail("unreachable", f"{name}: cannot resolve {node.ssh.host}: {exc.strerror}; fix ssh.host in "
                    f"the inventory")
    if isinstance(exc, OSError):
        return fail("unreachable", f"{name}: cannot reach {at}: {_reason(exc)}; check the node and its network")
    # The peer closed the connection mid-handshake: EOFError from the transport thread, or paramiko's
    # banner read wrapping it ("Error reading SSH protocol banner" + str(EOFError()), i.e. nothing after it).
    # A reset there (the peer closed with our banner unread) is the same hang-up.
    hung_up = exc.__context__ if isinstance(exc.__context__, EOFError | ConnectionResetError) else None
    if isinstance(exc, EOFError) or hung_up is not None or str(exc) == "Error reading SSH protocol banner":
        how = "reset" if isinstance(hung_up, ConnectionResetError) else "EOF"
        return fail("unreachable", f"{name}: {at} accepted TCP, then closed the connection during the SSH "
                    f"handshake ({how}); check sshd on the node (MaxStartups, a tcpwrapper or fail2ban ban, "
                    f"or not sshd)")
    # paramiko's start_client() returns on timeout without an error; the next step then finds
    # "No existing session": both mean the SSH handshake did not finish in time.
    stalled = ("banner", "No existing session")
    if isinstance(exc, paramiko.SSHException) and any(s in str(exc) for s in stalled):
        return fail("unreachable", f"{name}: {at} accepted TCP but did not complete the SSH handshake within "
                    f"{timeout_s:g}s; check sshd on the node (hung, overloaded, or not sshd)")
    return fail("error", f"{name}: SSH to {at} failed: {type(exc).__name__}: {exc}")


def session_failure(node: Node, exc: BaseException) -> Result:
    """An exception after the connection was up (channel refused, connection lost, SFTP timeout)."""
    if isinstance(exc, StalledConnection):
        return Result(node.name, False, error="unreachable",
                      message=f"{node.name}: {where(node)} stopped answering ({exc}); the node or its link is "
                      f"down: check it (the next command reconnects)")
    if isinstance(exc, TimeoutError):
        return Result(node.name, False, error="timeout",
                      message=f"{node.name}: {where(node)} stopped answering (timed out); check the node and link")
    return Result(node.name, False, error="unreachable",
                  message=f"{node.name}: connection to {where(node)} lost: {type(exc).__name__}: {exc}; "
                  f"it will reconnect on the next command")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "; ".join(e.strerror or str(e) for e in exc.errors.values())
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
