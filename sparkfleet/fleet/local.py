"""Local transport: the same interface as SSH, running commands on this machine.

A node with a `wrapper` (an argv, e.g. a script that enters a container or namespace) runs every
command as `WRAPPER... bash -c COMMAND`, with only the caller's env (as over SSH: nothing of this
machine's environment), and `put` writes through the same wrapper (`cat` into the node's path, `~`
being the node's home). A wrapper that exits 255 could not reach its node, as ssh's exit 255 means.
A wrapper also gets a status pipe, its fd number in $SPARKFLEET_NOT_RUN_FD: whatever it writes there
means it could not run the command at all (it could not enter the node, or not start the command's
shell there); it closes that fd before the command starts, so nothing the command prints is taken for it.
A node without a wrapper is a plain local run.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from sparkfleet.fleet.hostkeys import write_atomic
from sparkfleet.fleet.ssh import DRAIN_AFTER_EXIT_S, ENV_NAME
from sparkfleet.fleet.transport import Result, Transport, fan_out, telling_line
from sparkfleet.schema.inventory import Node
from sparkfleet.userconfig import fanout

NOT_RUN_FD = "SPARKFLEET_NOT_RUN_FD"  # names the wrapper's status pipe (see above)
NOT_RUN_MAX = 4096  # bytes of the wrapper's reason kept

# Nodes run DGX OS, where root's login shell is bash; generated shell is bash-valid (set -euo pipefail).
SHELL = shutil.which("bash") or "/bin/sh"


class LocalTransport(Transport):
    """Run commands as local subprocesses, in parallel threads, with the SSH transport's Result semantics."""

    def __init__(self, *, max_parallel: int | None = None, shell: str = SHELL) -> None:
        self.max_parallel = fanout() if max_parallel is None else max_parallel  # the operator's `fanout` setting
        self.shell = shell

    # -- public interface --------------------------------------------------------------
    @contextmanager
    def forward(self, node: Node, remote_port: int, remote_host: str = "127.0.0.1") -> Iterator[int]:
        """A local node's loopback is this machine's: nothing to forward."""
        yield remote_port

    def run_each(self, nodes: list[Node], commands: Mapping[str, str], *,
                 stdin: Mapping[str, str] | None = None, timeout_s: float = 60.0,
                 env: dict[str, str] | None = None) -> dict[str, Result]:
        """Each node's own command (and stdin) with bash -c, all at once; one Result per node, in input order."""
        for name in env or {}:
            if not ENV_NAME.match(name):
                raise ValueError(f"env name {name!r} is not a valid shell variable name")
        stdin = stdin or {}
        return self._each([n for n in nodes if n.name in commands], lambda node: self._run_one(
            node, commands[node.name], (stdin.get(node.name) or "").encode(), timeout_s, env or {}))

    def put(self, nodes: list[Node], data: bytes, remote_path: str, *, mode: int = 0o644) -> dict[str, Result]:
        """Write `data` atomically to the node's path (`~` = the sandbox home for simulated nodes)."""
        return self._each(nodes, lambda node: self._put_one(node, data, remote_path, mode))

    def close(self) -> None:
        """Nothing is held open between calls."""

    def __enter__(self) -> LocalTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- per node ----------------------------------------------------------------------
    def _each(self, nodes: list[Node], work) -> dict[str, Result]:
        def one(node: Node) -> Result:
            try:
                return work(node)
            except OSError as exc:  # e.g. the shell cannot start: this node's failure, not everyone's
                return Result(node.name, False, error="error", message=f"{node.name}: local run failed: {exc}")

        return fan_out(nodes, one, self.max_parallel)

    def wrapper(self, node: Node, timeout_s: float) -> list[str] | None:
        """The argv that enters the node (the command follows as `bash -c COMMAND`); None: run here."""
        return node.wrapper

    def node_env(self, node: Node) -> dict[str, str]:
        """The environment a command on this node sees (before the caller's env)."""
        return {} if node.wrapper else dict(os.environ)

    def argv(self, wrapper: list[str] | None, command: str) -> list[str]:
        return [*(wrapper or []), self.shell if not wrapper else "bash", "-c", command]

    def _run_one(self, node: Node, command: str, stdin: bytes, timeout_s: float, extra: dict[str, str]) -> Result:
        env = {**self.node_env(node), **extra}
        wrapper = self.wrapper(node, timeout_s)  # asked once: srun's is built per command
        wrapped = wrapper is not None
        status_r, status_w = os.pipe() if wrapped else (-1, -1)
        if wrapped:
            env[NOT_RUN_FD] = str(status_w)
        # Own session so a timeout kills the command's whole process group, not just the shell.
        try:
            proc = subprocess.Popen(self.argv(wrapper, command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env, start_new_session=True,
                                    pass_fds=(status_w,) if wrapped else ())
        except BaseException:
            _close(status_r)
            raise
        finally:
            _close(status_w)
        out: list[bytes] = []
        err: list[bytes] = []
        threads = [threading.Thread(target=_pump, args=(proc.stdout, out), daemon=True),
                   threading.Thread(target=_pump, args=(proc.stderr, err), daemon=True),
                   threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        try:
            code = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            code = proc.wait()
        # Drain output; a background child that inherited stdout must not hold a finished command.
        drain_until = min(deadline, time.monotonic() + DRAIN_AFTER_EXIT_S) if not timed_out else time.monotonic() + 1
        for t in threads[:2]:
            t.join(max(0.0, drain_until - time.monotonic()))
        stdout = b"".join(out).decode(errors="replace")
        stderr = b"".join(err).decode(errors="replace")
        not_run = _read_status(status_r) if wrapped else ""
        if not_run and code != 0:
            return Result(node.name, False, stdout, stderr, exit_code=code, error="not-run",
                          message=f"{node.name}: the command could not be run on the node: {not_run[:300]}")
        if timed_out:
            return Result(node.name, False, stdout, stderr, error="timeout",
                          message=f"{node.name}: command did not finish within {timeout_s:g}s (local); "
                          f"it was killed, output so far is kept")
        if code == 0:
            return Result(node.name, True, stdout, stderr, exit_code=0)
        last = [line] if (line := telling_line(stderr, stdout)) else []
        if code == 255 and wrapped and not stdout:
            return Result(node.name, False, stdout, stderr, exit_code=code, error="unreachable",
                          message=f"{node.name}: unreachable" + (f": {last[0][:200]}" if last else ""))
        what = f"exited with status {code}" if code >= 0 else f"was killed by signal {-code}"
        return Result(node.name, False, stdout, stderr, exit_code=code, error="exit",
                      message=f"{node.name}: command {what}" + (f": {last[0][:200]}" if last else ""))

    def resolve(self, node: Node, remote_path: str) -> Path:
        """Where a path of a node without a wrapper lives on this machine: `~` (and relative paths) from home."""
        home = Path.home()
        if remote_path == "~" or remote_path.startswith("~/"):
            path = home / remote_path[2:]
        elif remote_path.startswith("~"):
            raise ValueError(f"put {remote_path}: only ~/ (the login user's home) is supported")
        elif not remote_path.startswith("/"):
            path = home / remote_path
        else:
            path = Path(remote_path)
        return Path(os.path.normpath(path))

    def _put_one(self, node: Node, data: bytes, remote_path: str, mode: int) -> Result:
        if remote_path.startswith("~") and not (remote_path == "~" or remote_path.startswith("~/")):
            return Result(node.name, False, error="error",
                          message=f"{node.name}: put {remote_path}: only ~/ (the login user's home) is supported")
        if self.wrapper(node, 60.0) is not None:
            return self._put_wrapped(node, data, remote_path, mode)
        try:
            path = self.resolve(node, remote_path)
            write_atomic(path, data, mode=mode)
        except OSError as exc:
            return Result(node.name, False, error="error",
                          message=f"{node.name}: cannot write {remote_path}: {exc.strerror or exc}")
        return Result(node.name, True, extra={"path": str(path), "bytes": len(data), "mode": oct(mode)})

    def _put_wrapped(self, node: Node, data: bytes, remote_path: str, mode: int) -> Result:
        """Write through the wrapper: the node's own `cat` into a temp file, chmod, rename (atomic there)."""
        rel = remote_path[2:] if remote_path.startswith("~/") else remote_path
        target = f'"$HOME"/{shlex.quote(rel)}' if not rel.startswith("/") else shlex.quote(rel)
        script = (f"set -e; p={target}; mkdir -p \"$(dirname \"$p\")\"; t=\"$p.tmp.$$\"; cat > \"$t\"; "
                  f"chmod {mode:o} \"$t\"; mv -f \"$t\" \"$p\"; printf %s \"$p\"")
        r = self._run_one(node, script, data, 60.0, {})
        if not r.ok:
            return Result(node.name, False, error=r.error if r.error in ("unreachable", "not-run") else "error",
                          message=f"{node.name}: cannot write {remote_path}: {r.message}")
        return Result(node.name, True, extra={"path": r.stdout.strip(), "bytes": len(data), "mode": oct(mode)})


def _close(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


def _read_status(fd: int) -> str:
    """What the wrapper wrote on its status pipe (its last line), without waiting: a command that kept the
    fd open (a wrapper that does not know the pipe) must not hold the result."""
    try:
        os.set_blocking(fd, False)
        data = os.read(fd, NOT_RUN_MAX)
    except (BlockingIOError, OSError):
        data = b""
    finally:
        os.close(fd)
    lines = data.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def _pump(stream, sink: list[bytes]) -> None:
    """Read a pipe until EOF; raw reads so output arrives as produced."""
    fd = stream.fileno()
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            sink.append(chunk)
    except OSError:
        return
    finally:
        stream.close()


def _feed(stream, data: bytes) -> None:
    """Write stdin, then close it (EOF), ignoring a command that exits without reading."""
    try:
        if data:
            stream.write(data)
        stream.close()
    except (BrokenPipeError, OSError, ValueError):
        pass
