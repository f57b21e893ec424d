"""Pick the transport for a set of nodes: SSH, local, or both behind one interface."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sparkfleet.fleet.local import LocalTransport
from sparkfleet.fleet.ssh import SshTransport
from sparkfleet.fleet.transport import Result, Transport
from sparkfleet.spec.inventory import Node


class MixedTransport:
    """Dispatches each node to the transport its `transport:` field names; both halves run at once."""

    def __init__(self, known_hosts: Path | None = None, *, connect_timeout_s: float = 10.0) -> None:
        self.parts: dict[str, Transport] = {
            "ssh": SshTransport(known_hosts, connect_timeout_s=connect_timeout_s),
            "local": LocalTransport(),
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

    def run(self, nodes: list[Node], command: str, *, stdin: str | None = None,
            timeout_s: float = 60.0, env: dict[str, str] | None = None) -> dict[str, Result]:
        return self._fan(nodes, lambda t, ns: t.run(ns, command, stdin=stdin, timeout_s=timeout_s, env=env))

    def put(self, nodes: list[Node], data: bytes, remote_path: str, *, mode: int = 0o644) -> dict[str, Result]:
        return self._fan(nodes, lambda t, ns: t.put(ns, data, remote_path, mode=mode))

    def close(self) -> None:
        for part in self.parts.values():
            part.close()


def transport_for(nodes: list[Node], known_hosts: Path | None = None, *,
                  connect_timeout_s: float = 10.0) -> Transport:
    """The transport for these nodes: SshTransport, LocalTransport, or a MixedTransport when they mix.

    `known_hosts` defaults to sparkfleet's own (state_dir()/known_hosts).
    """
    kinds = {n.transport for n in nodes}
    if kinds == {"local"}:
        return LocalTransport()
    if kinds == {"ssh"}:
        return SshTransport(known_hosts, connect_timeout_s=connect_timeout_s)
    return MixedTransport(known_hosts, connect_timeout_s=connect_timeout_s)
