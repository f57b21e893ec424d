"""A local port forward over an open SSH transport (`ssh -L 127.0.0.1:LOCAL:HOST:PORT`), as OpenSSH does it.

Each connection to the local port opens its own `direct-tcpip` channel. When the far end refuses (a head
that is not listening yet, a rank that died), that one connection is closed and the forward keeps
accepting: a readiness poll that starts before the engine serves must see "not answering" and try again,
not a forward that stopped accepting (fabric's forward_local ends its accept loop on the first refused
channel, and every later connection then waits in the listen backlog forever).
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import paramiko

CHANNEL_OPEN_TIMEOUT_S = 10.0  # the far end answers a direct-tcpip open at once; a dead link fails here
POLL_S = 0.2  # how often the accept loop and the pumps look at the stop flag


def _pump(client: socket.socket, channel: paramiko.Channel, stop: threading.Event) -> None:
    """Copy bytes both ways until either side closes (or the forward ends)."""
    try:
        while not stop.is_set():
            ready, _, _ = select.select([client, channel], [], [], POLL_S)
            for src, dst in ((client, channel), (channel, client)):
                if src in ready:
                    data = src.recv(65536)
                    if not data:
                        return
                    dst.sendall(data)
    except (OSError, paramiko.SSHException):
        return  # this connection is over; the forward goes on
    finally:
        channel.close()
        client.close()


@contextmanager
def local_forward(transport: Callable[[], paramiko.Transport], remote_host: str, remote_port: int) -> Iterator[int]:
    """A port on 127.0.0.1 (chosen by the kernel) forwarded to remote_host:remote_port as the far end sees
    it, for the block's duration; every connection through it is closed when the block ends.

    `transport()` is asked for the SSH transport at each new connection, not once: the node's connection may
    be replaced while the forward lives (SshTransport drops a connection after a command timed out on it, and
    reconnects at the next use), and a forward bound to the closed one would refuse every later connection
    while the head still serves (a lane's gates then failed with "Server disconnected" on a busy machine)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(POLL_S)
    stop = threading.Event()
    pumps: list[threading.Thread] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                client, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed
            client.settimeout(None)  # blocking; the pump selects before it reads
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as OpenSSH's forwarded sockets
            try:
                channel = transport().open_channel("direct-tcpip", (remote_host, remote_port), peer,
                                                   timeout=CHANNEL_OPEN_TIMEOUT_S)
            except (paramiko.SSHException, OSError, EOFError):
                client.close()  # refused there (nothing listening yet): this client sees a reset
                continue
            pump = threading.Thread(target=_pump, args=(client, channel, stop), daemon=True,
                                    name=f"forward-{remote_port}")
            pump.start()
            pumps.append(pump)

    acceptor = threading.Thread(target=accept, daemon=True, name=f"forward-accept-{remote_port}")
    acceptor.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        acceptor.join(POLL_S * 5)
        listener.close()
        for pump in pumps:
            pump.join(POLL_S * 5)
