"""Pick the transport for a set of nodes: SSH, local, srun, or several behind one interface."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from sparkfleet.fleet.local import LocalTransport
from sparkfleet.fleet.srun import SrunTransport
from sparkfleet.fleet.ssh import SshTransport
from sparkfleet.fleet.transport import Forwards, Result, Transport
from sparkfleet.placement import endpoint, loopback_bound
from sparkfleet.schema.inventory import Node


class MixedTransport(Transport):
    """Dispatches each node to the transport its `transport:` field names; the parts run at once."""

    def __init__(self, known_hosts: Path | None = None, *, connect_timeout_s: float = 10.0,
                 wait_once: bool = False) -> None:
        self.parts: dict[str, Transport] = {
            "ssh": SshTransport(known_hosts, connect_timeout_s=connect_timeout_s, wait_once=wait_once),
            "local": LocalTransport(),
            "srun": SrunTransport(),
        }

    def _split(self, nodes: list[Node]) -> dict[str, list[Node]]:
        groups: dict[str, list[Node]] = {}
        for node in nodes:
            groups.setdefault(node.transport, []).append(node)
        return groups

    def _fan(self, nodes: list[Node], call) -> dict[str, Result]:
        groups = self._split(nodes)
        with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
            futures = [pool.submit(call, self.parts[kind], members) for kind, members in groups.items()]
            merged: dict[str, Result] = {}
            for f in futures:
                merged.update(f.result())
        return {n.name: merged[n.name] for n in nodes if n.name in merged}  # the caller's order

    def run_each(self, nodes: list[Node], commands: Mapping[str, str], *,
                 stdin: Mapping[str, str] | None = None, timeout_s: float = 60.0,
                 env: dict[str, str] | None = None) -> dict[str, Result]:
        return self._fan(nodes, lambda t, ns: t.run_each(ns, commands, stdin=stdin, timeout_s=timeout_s, env=env))

    def put(self, nodes: list[Node], data: bytes, remote_path: str, *, mode: int = 0o644) -> dict[str, Result]:
        return self._fan(nodes, lambda t, ns: t.put(ns, data, remote_path, mode=mode))

    def forward(self, node: Node, remote_port: int, remote_host: str = "127.0.0.1") -> AbstractContextManager[int]:
        return self.parts[node.transport].forward(node, remote_port, remote_host)

    def close(self) -> None:
        for part in self.parts.values():
            part.close()


def transport_for(nodes: list[Node], known_hosts: Path | None = None, *,
                  connect_timeout_s: float = 10.0, wait_once: bool = False) -> Transport:
    """The transport for these nodes: SshTransport, LocalTransport, SrunTransport, or a MixedTransport when
    they mix.

    `known_hosts` defaults to sparkfleet's own (state_dir()/known_hosts). `wait_once`: an SSH node whose
    connect timed out is not waited for again by this transport (SshTransport; one run's transport).
    """
    kinds = {n.transport for n in nodes}
    if kinds == {"local"}:
        return LocalTransport()
    if kinds == {"srun"}:
        return SrunTransport()
    if kinds == {"ssh"}:
        return SshTransport(known_hosts, connect_timeout_s=connect_timeout_s, wait_once=wait_once)
    return MixedTransport(known_hosts, connect_timeout_s=connect_timeout_s, wait_once=wait_once)


@contextmanager
def api_base(head: Node, port: int, host: str | None, transport: Forwards | None = None,
             on_tunnel=None) -> Iterator[str]:
    """The lane's OpenAI-compatible base URL as seen from this machine, for the block's duration: for a
    head that binds its API to loopback (`host: 127.0.0.1`) behind SSH, a local port forward over the
    head's pinned connection (closed when the block ends; `transport` is used when given, else one of its
    own; a run's executor shows it under --dry-run instead, and the URL is then the head's own); else
    http://HEAD:PORT (sparkfleet.placement.endpoint). `on_tunnel(url)` is told of a tunnel.
    The one rule `up`'s readiness and gates, `gates`, `bench` and `status` use; --endpoint overrides it."""

    if not (loopback_bound(host) and head.transport == "ssh"):
        yield endpoint(head, port)
        return
    own: Transport | None = None  # a transport of its own, closed at the end
    if transport is None:
        transport = own = transport_for([head])
    try:
        with transport.forward(head, port) as local:
            if local is None:  # shown, not opened (--dry-run)
                yield endpoint(head, port)
                return
            url = f"http://127.0.0.1:{local}"
            if on_tunnel is not None:
                on_tunnel(url)
            yield url
    finally:
        if own is not None:
            own.close()
