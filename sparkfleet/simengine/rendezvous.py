"""The ranks' rendezvous over TCP on the master port (a stand-in for torch.distributed's TCPStore).

Rank 0 listens on master-addr:master-port; every worker connects, says `join`, and is answered
`welcome`, then `go` once the whole world has joined. Workers report their KV size and `ready`;
the head answers `shutdown` when it stops. The protocol is JSON lines.

While serving, each request's first engine step is a round trip to every worker (`step` n, answered
`stepped` n): vLLM's head broadcasts every step's scheduler output to all ranks and the step's
collectives need them all (MultiprocExecutor.collective_rpc, v1/executor/multiproc_executor.py). A
worker that is gone (its connection closed) or frozen (a node that lost power: nothing closes) never
answers, so the step waits; nothing else on the head notices (see main.py HeadRank).

As in the seeds' relaunch race, a head that is already serving still accepts joins: a new worker
that finds an old head on the port gets the same `welcome`/`go` a fresh head would send, so it
cannot tell it joined the wrong lane.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class Link:
    """One JSON-lines connection; sends are serialised, receives happen on one reader thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.lock = threading.Lock()
        self.peer = "?"
        try:
            self.peer = sock.getpeername()[0]
        except OSError:
            pass

    def send(self, msg: dict) -> bool:
        data = (json.dumps(msg) + "\n").encode()
        with self.lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False

    def recv(self) -> dict | None:
        """The next message, or None when the peer is gone."""
        try:
            line = self.reader.readline()
        except (OSError, ValueError):
            return None
        if not line:
            return None
        try:
            msg = json.loads(line)
        except ValueError:
            return None
        return msg if isinstance(msg, dict) else None

    def close(self) -> None:
        for fn in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.reader.close, self.sock.close):
            try:
                fn()
            except OSError:
                pass


@dataclass
class Member:
    rank: int
    link: Link
    pid: int
    kv: int | None = None
    ready: bool = False
    lost_at: float | None = None  # monotonic time its connection closed
    hung: bool = False  # the rank-hang fault: this worker stopped taking part in steps
    stepped: int = 0  # the last engine step this worker answered


@dataclass
class HeadState:
    members: dict[int, Member] = field(default_factory=dict)  # the world, ranks 1..N-1
    extras: list[Member] = field(default_factory=list)  # late joiners for ranks already present
    lost: list[Member] = field(default_factory=list)
    go: bool = False
    closing: bool = False
    steps: int = 0  # engine steps sent
    pending: dict[int, float] = field(default_factory=dict)  # step -> when it was sent, until all answered


class Head:
    """Rank 0's side: accept workers, track the world, broadcast go/shutdown."""

    def __init__(self, addr: str, port: int, world_size: int, on_join: Callable[[Member, bool], None]) -> None:
        self.world_size = world_size
        self.on_join = on_join
        self.cond = threading.Condition()
        self.state = HeadState()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((addr, port))  # EADDRINUSE when an old head still listens: the caller reports it
            self.sock.listen(64)
        except OSError:
            self.sock.close()
            raise
        self.thread = threading.Thread(target=self._accept, name="rendezvous-accept", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(Link(conn),), daemon=True).start()

    def _serve(self, link: Link) -> None:
        hello = link.recv()
        if not hello or hello.get("op") != "join":
            link.close()
            return
        member = Member(int(hello.get("rank", -1)), link, int(hello.get("pid", 0)))
        with self.cond:
            if self.state.closing:
                link.send({"op": "shutdown"})
                link.close()
                return
            present = self.state.members.get(member.rank)
            extra = present is not None and present not in self.state.lost
            if extra:
                self.state.extras.append(member)
            else:
                self.state.members[member.rank] = member
            go = self.state.go
            self.cond.notify_all()
        link.send({"op": "welcome", "world_size": self.world_size})
        if go:
            link.send({"op": "go"})
        self.on_join(member, extra)
        while True:
            msg = link.recv()
            if msg is None:
                break
            with self.cond:
                if msg.get("op") == "kv":
                    member.kv = int(msg.get("tokens", 0))
                elif msg.get("op") == "ready":
                    member.ready = True
                elif msg.get("op") == "hang":
                    member.hung = True
                elif msg.get("op") == "stepped":
                    member.stepped = max(member.stepped, int(msg.get("n", 0)))
                self.cond.notify_all()
        with self.cond:
            if not self.state.closing:
                member.lost_at = time.monotonic()
                self.state.lost.append(member)
            self.cond.notify_all()

    # ------------------------------------------------------------------------------------ waits

    def _world(self) -> list[Member]:
        return [self.state.members[r] for r in range(1, self.world_size) if r in self.state.members]

    def joined(self) -> int:
        with self.cond:
            return 1 + len(self._world())

    def wait(self, test: Callable[[list[Member]], bool], timeout: float, abort: Callable[[], bool]) -> bool:
        """Wait until `test(world)` holds; False on timeout or when abort() says so."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                world = self._world()
                if len(world) == self.world_size - 1 and test(world):
                    return True
                if abort() or time.monotonic() >= deadline:
                    return False
                self.cond.wait(0.05)

    def wait_rank(self, rank: int, timeout: float, abort: Callable[[], bool]) -> bool:
        """Wait until `rank` has joined; False on timeout or when abort() says so."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while rank not in self.state.members:
                if abort() or time.monotonic() >= deadline:
                    return False
                self.cond.wait(0.05)
            return True

    def lost(self, after: float = 0.0) -> list[Member]:
        """Workers whose connection closed at least `after` seconds ago (NCCL notices at the next collective)."""
        now = time.monotonic()
        with self.cond:
            return [m for m in self.state.lost if m.lost_at is not None and now - m.lost_at >= after]

    def step(self, abort: Callable[[], bool]) -> bool:
        """One engine step's round trip to every worker of the world: True once all answered. It blocks while
        one does not (gone or frozen), as vLLM's step does, until abort() says stop (then False)."""
        with self.cond:
            self.state.steps += 1
            n = self.state.steps
            world = self._world()
            self.state.pending[n] = time.monotonic()
        for m in world:
            m.link.send({"op": "step", "n": n})
        with self.cond:
            try:
                while not all(m.stepped >= n for m in world):
                    if abort():
                        return False
                    self.cond.wait(0.05)
                return True
            finally:
                del self.state.pending[n]

    def stuck_since(self) -> float | None:
        """When the oldest step still unanswered by some worker was sent (monotonic), or None."""
        with self.cond:
            return min(self.state.pending.values(), default=None)

    def send_go(self) -> None:
        with self.cond:
            self.state.go = True
            everyone = list(self.state.members.values()) + list(self.state.extras)
        for m in everyone:
            m.link.send({"op": "go"})

    def any_hung(self) -> bool:
        """A worker hit the rank-hang fault: the lane's steps never complete."""
        with self.cond:
            return any(m.hung for m in self.state.members.values())

    def shutdown(self) -> None:
        """Tell every connected worker to exit, then stop listening."""
        with self.cond:
            self.state.closing = True
            everyone = list(self.state.members.values()) + list(self.state.extras)
        for m in everyone:
            m.link.send({"op": "shutdown"})
        self.close()
        for m in everyone:
            m.link.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Worker:
    """A worker's side: connect (retrying until the head listens), join, then follow the head."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.welcome = threading.Event()
        self.go = threading.Event()
        self.shutdown = threading.Event()
        self.head_lost = threading.Event()
        self.lost_at = 0.0
        threading.Thread(target=self._read, name="rendezvous-reader", daemon=True).start()

    @classmethod
    def connect(cls, addr: str, port: int, deadline: float, stop: threading.Event) -> Worker | None:
        """Connect to the master port; None when the deadline passes or stop is set."""
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                sock = socket.create_connection((addr, port), timeout=2)
            except OSError:
                stop.wait(0.05)  # the head is not listening yet: workers start first
                continue
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return cls(Link(sock))
        return None

    def _read(self) -> None:
        while True:
            msg = self.link.recv()
            if msg is None:
                if not self.shutdown.is_set():
                    self.lost_at = time.monotonic()
                    self.head_lost.set()
                return
            op = msg.get("op")
            if op == "welcome":
                self.welcome.set()
            elif op == "go":
                self.go.set()
            elif op == "step":  # this rank's part of an engine step (answered while the process runs)
                self.link.send({"op": "stepped", "n": msg.get("n", 0)})
            elif op == "shutdown":
                self.shutdown.set()
                return

    def send(self, msg: dict) -> bool:
        return self.link.send(msg)
