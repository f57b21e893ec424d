"""Local transport: the same interface as SSH, running commands on this machine (the sim in local mode).

A node with `sim_root` set is a simulated node: its commands see SPARKFLEET_SIM_ROOT, SPARKFLEET_NODE,
HOME=<sim_root>/home and <sim_root>/bin first on PATH (where the sim's nvidia-smi/docker shims live),
and `~` in put() paths is <sim_root>/home, so `~/.cache/sparkfleet/bin` lands inside the sandbox and
the command that runs the helper from `~/...` finds it there. Writes outside the sandbox are refused.
A node without `sim_root` is a plain local run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from sparkfleet.fleet.hostkeys import write_atomic
from sparkfleet.fleet.ssh import DRAIN_AFTER_EXIT_S, ENV_NAME
from sparkfleet.fleet.transport import Result, fan_out
from sparkfleet.spec.inventory import Node

# Nodes run DGX OS, where root's login shell is bash; generated shell is bash-valid (set -euo pipefail).
SHELL = shutil.which("bash") or "/bin/sh"


class LocalTransport:
    """Run commands as local subprocesses, in parallel threads, with the SSH transport's Result semantics."""

    def __init__(self, *, max_parallel: int = 64, shell: str = SHELL) -> None:
        self.max_parallel = max_parallel
        self.shell = shell

    # -- public interface --------------------------------------------------------------
    def run(self, nodes: list[Node], command: str, *, stdin: str | None = None,
            timeout_s: float = 60.0, env: dict[str, str] | None = None) -> dict[str, Result]:
        """Run `command` with bash -c for every node at once; one Result per node, in input order."""
        for name in env or {}:
            if not ENV_NAME.match(name):
                raise ValueError(f"env name {name!r} is not a valid shell variable name")
        data = (stdin or "").encode()
        return self._each(nodes, lambda node: self._run_one(node, command, data, timeout_s, env or {}))

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

    def _sandbox(self, node: Node) -> Path | None:
        return Path(node.sim_root) if node.sim_root else None

    def _missing_sandbox(self, node: Node, root: Path) -> Result:
        return Result(node.name, False, error="unreachable",
                      message=f"{node.name}: simulated node's sandbox {root} does not exist; "
                      f"start the simulated lab with `sparkfleet sim up`")

    def node_env(self, node: Node) -> dict[str, str]:
        """The environment a command on this node sees (before the caller's env)."""
        env = dict(os.environ)
        root = self._sandbox(node)
        if root is not None:
            env.update(SPARKFLEET_SIM_ROOT=str(root), SPARKFLEET_NODE=node.name, HOME=str(root / "home"),
                       PATH=f"{root / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}")
        return env

    def _run_one(self, node: Node, command: str, stdin: bytes, timeout_s: float, extra: dict[str, str]) -> Result:
        root = self._sandbox(node)
        cwd = None
        if root is not None:
            if not root.is_dir():
                return self._missing_sandbox(node, root)
            cwd = root / "home"  # like an SSH login, start in the (sandbox) home
            cwd.mkdir(exist_ok=True)
        env = {**self.node_env(node), **extra}
        # Own session so a timeout kills the command's whole process group, not just the shell.
        proc = subprocess.Popen([self.shell, "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True)
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
        if timed_out:
            return Result(node.name, False, stdout, stderr, error="timeout",
                          message=f"{node.name}: command did not finish within {timeout_s:g}s (local); "
                          f"it was killed, output so far is kept")
        if code == 0:
            return Result(node.name, True, stdout, stderr, exit_code=0)
        last = stderr.strip().splitlines()[-1:] or stdout.strip().splitlines()[-1:]
        what = f"exited with status {code}" if code >= 0 else f"was killed by signal {-code}"
        return Result(node.name, False, stdout, stderr, exit_code=code, error="exit",
                      message=f"{node.name}: command {what}" + (f": {last[0][:200]}" if last else ""))

    def resolve(self, node: Node, remote_path: str) -> Path:
        """Where a node path lives on this machine: `~` (and relative paths) from the node's home."""
        root = self._sandbox(node)
        home = root / "home" if root is not None else Path.home()
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
        root = self._sandbox(node)
        if root is not None and not root.is_dir():
            return self._missing_sandbox(node, root)
        try:
            path = self.resolve(node, remote_path)
        except ValueError as exc:
            return Result(node.name, False, error="error", message=f"{node.name}: {exc}")
        if root is not None and not path.is_relative_to(Path(os.path.normpath(root))):
            # The simulated lab must never write to the real machine's /etc or /nvme.
            return Result(node.name, False, error="error",
                          message=f"{node.name}: {remote_path} is outside the simulated node's sandbox {root}; "
                          f"use ~/... or a path under the sandbox")
        try:
            write_atomic(path, data, mode=mode)
        except OSError as exc:
            return Result(node.name, False, error="error",
                          message=f"{node.name}: cannot write {path}: {exc.strerror or exc}")
        return Result(node.name, True, extra={"path": str(path), "bytes": len(data), "mode": oct(mode)})


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
