"""A throwaway fabric of this test's own: network namespaces on a bridge, each with a fabric IP.

Names carry this process's pid, so parallel runs never collide and nothing fixed is claimed. The
transport runs each node's commands inside its namespace (`ip netns exec`), with a HOME of the test's
own, so node-side helpers ship and run exactly as over SSH. Everything is removed on close.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from sparkfleet.fleet.transport import Result, RunEachByRun, fan_out
from sparkfleet.placement import Rank
from sparkfleet.schema.inventory import Node, Ssh, Storage

SUBNET = "10.250.77"  # a private test subnet, only on the lab's own bridge


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


class NetnsLab(RunEachByRun):
    def __init__(self, n: int, home: Path, tag: str = "") -> None:
        self.tag = f"{os.getpid() % 100000}{tag}"
        self.bridge = f"sfbr{self.tag}"[:15]
        self.home = home
        self.names = [f"n{i}" for i in range(n)]
        self.ns = {name: f"sf-fab-{self.tag}-{name}" for name in self.names}
        self.ips = {name: f"{SUBNET}.{11 + i}" for i, name in enumerate(self.names)}
        self.iface = "fab0"
        self.nodes = [Node(name=name, ssh=Ssh(host="127.0.0.1"), fabric_ip=self.ips[name], hardware="gb10",
                           storage=Storage(model_root="/models", cache_dir="/cache")) for name in self.names]
        self.ranks = [Rank(i, node) for i, node in enumerate(self.nodes)]
        try:
            self._up()
        except BaseException:
            self.destroy()
            raise

    def _up(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            ns, host_end = self.ns[name], f"sfv{self.tag}{i}"[:15]
            ip("netns", "add", ns)
            ip("link", "add", host_end, "type", "veth", "peer", "name", self.iface, "netns", ns)
            ip("link", "set", host_end, "master", self.bridge, "up")
            ip("-n", ns, "addr", "add", f"{self.ips[name]}/24", "dev", self.iface)
            ip("-n", ns, "link", "set", self.iface, "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def host_end(self, name: str) -> str:
        return f"sfv{self.tag}{self.names.index(name)}"[:15]

    def shape(self, name: str, rate: str, burst: str = "256kbit") -> None:
        """tc tbf on the node's fabric interface (its egress), as the sim's slow-link fault does."""
        subprocess.run(["ip", "netns", "exec", self.ns[name], "tc", "qdisc", "replace", "dev", self.iface, "root",
                        "tbf", "rate", rate, "burst", burst, "latency", "400ms"], check=True,
                       capture_output=True, timeout=30)

    def destroy(self) -> None:
        for name in self.names:
            ns = self.ns[name]
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
            for pid in pids.split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            ip("netns", "del", ns, check=False)
            ip("link", "del", self.host_end(name), check=False)
        ip("link", "del", self.bridge, check=False)

    # -- the transport ---------------------------------------------------------------------------

    def run(self, nodes: list[Node], command: str, *, stdin: str | None = None, timeout_s: float = 60.0,
            env: dict[str, str] | None = None) -> dict[str, Result]:
        def one(node: Node) -> Result:
            try:
                p = subprocess.run(["ip", "netns", "exec", self.ns[node.name], "sh", "-c", command],
                                   input=stdin or "", capture_output=True, text=True, timeout=timeout_s,
                                   env={**os.environ, "HOME": str(self.home), **(env or {})})
            except subprocess.TimeoutExpired:
                return Result(node.name, False, error="timeout", message=f"timed out after {timeout_s:g} s")
            return Result(node.name, p.returncode == 0, p.stdout, p.stderr, p.returncode,
                          None if p.returncode == 0 else "exit")
        return fan_out(nodes, one, len(nodes))  # every rank at once: the probe's servers and clients overlap

    def put(self, nodes: list[Node], data: bytes, remote_path: str, *, mode: int = 0o644) -> dict[str, Result]:
        path = Path(remote_path.replace("~", str(self.home), 1))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
        return {n.name: Result(n.name, True) for n in nodes}

    def close(self) -> None:
        pass  # the transport holds nothing open; destroy() removes the lab
