"""The simulated lab as a whole: `up`, `down`, status, and faults per node (the API the CLI and tests use).

    from sparkfleet.sim import shim, lab
    sim = lab.up("lab", transport="local")     # builds <state_dir>/sim/; refuses if one exists (force=True)
    sim.fault("asusi", "clock-latch")          # or sim.fault("reddie", "port-taken", port=8410)
    sim.heal("asusi")                          # every fault on asusi; sim.heal() heals all
    inv = sim.inventory()                      # the generated inventory (transport local|ssh, sim_root)
    lab.down()                                 # stops every sshd, removes the sandboxes; idempotent
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
from pathlib import Path
from typing import Any, Literal

import yaml

from sparkfleet.root import find_root
from sparkfleet.sim import build, faults, paths, shim, sshd
from sparkfleet.spec.errors import UserError
from sparkfleet.spec.inventory import Inventory
from sparkfleet.spec.load import Spec

TransportKind = Literal["local", "ssh"]


class Sim:
    """A simulated lab that exists on disk (read from its manifest, sim.json)."""

    def __init__(self, manifest: dict[str, Any]):
        self.manifest = manifest

    @property
    def dir(self) -> Path:
        return paths.sim_dir()

    @property
    def transport(self) -> TransportKind:
        return self.manifest["transport"]

    @property
    def nodes(self) -> list[str]:
        return list(self.manifest["nodes"])

    @property
    def inventory_path(self) -> Path:
        return paths.sim_inventory_path()

    def inventory(self) -> Inventory:
        """The generated inventory, loaded and validated as sparkfleet loads any inventory file."""
        return Spec(self.dir).inventory(str(self.inventory_path))

    def _node(self, node: str) -> dict[str, Any]:
        if node not in self.manifest["nodes"]:
            raise UserError(f"unknown node {node!r} (simulated nodes: {', '.join(self.nodes)})")
        return self.manifest["nodes"][node]

    def root(self, node: str) -> Path:
        """Where the node's sandbox is now (in local mode an unreachable node's is parked elsewhere)."""
        self._node(node)
        home = paths.node_root(node)
        parked = paths.parked_root(node)
        return parked if parked.exists() and not home.exists() else home

    def faults(self, node: str) -> dict[str, dict[str, Any]]:
        return faults.active(self.root(node))

    def reachable(self, node: str) -> bool:
        if self.transport == "ssh":
            return self.sshd_pid(node) is not None
        return self.root(node) == paths.node_root(node)

    def sshd_pid(self, node: str) -> int | None:
        info = self._node(node).get("ssh")
        if not info:
            return None
        return sshd.owned_pid(Path(info["pid_file"]), Path(info["config"]))

    def _target(self, node: str) -> faults.Target:
        def disconnect() -> None:
            if self.transport == "ssh":
                info = self._node(node)["ssh"]
                sshd.stop(Path(info["pid_file"]), Path(info["config"]))
            else:
                faults.move_tree(paths.node_root(node), paths.parked_root(node))

        def reconnect() -> None:
            if self.transport == "ssh":
                start_node_sshd(node, self._node(node)["ssh"])
            elif paths.parked_root(node).exists():
                faults.move_tree(paths.parked_root(node), paths.node_root(node))

        return faults.Target(node, lambda: self.root(node), disconnect, reconnect)

    def fault(self, node: str, kind: str, **params: Any) -> dict[str, Any]:
        """Inject a fault on one node; returns the parameters it was recorded with."""
        self._node(node)
        if kind not in faults.KINDS:
            raise UserError(f"unknown fault kind {kind!r} (kinds: {', '.join(faults.KINDS)})")
        return faults.inject(self._target(node), kind, params)

    def heal(self, node: str | None = None, kind: str | None = None) -> list[tuple[str, str]]:
        """Heal one fault, every fault on one node, or everything; returns the (node, kind) pairs healed."""
        if kind is not None and kind not in faults.KINDS:
            raise UserError(f"unknown fault kind {kind!r} (kinds: {', '.join(faults.KINDS)})")
        healed = []
        for n in [node] if node else self.nodes:
            self._node(n)
            kinds = [kind] if kind else list(reversed(self.faults(n)))  # undo in reverse order of injection
            for k in kinds:
                if faults.heal(self._target(n), k):
                    healed.append((n, k))
        return healed

    def status(self) -> dict[str, Any]:
        nodes = {}
        for n in self.nodes:
            info = self._node(n)
            entry: dict[str, Any] = {"hardware": info["hardware"], "sim_root": str(paths.node_root(n)),
                                     "reachable": self.reachable(n), "faults": self.faults(n)}
            if info.get("ssh"):
                entry["sshd"] = {"address": "127.0.0.1", "port": info["ssh"]["port"], "pid": self.sshd_pid(n)}
            nodes[n] = entry
        return {"simulation": True, "dir": str(self.dir), "transport": self.transport,
                "inventory": str(self.inventory_path), "source_inventory": self.manifest["source_inventory"],
                "created_at": self.manifest["created_at"], "known_hosts": self.manifest.get("known_hosts"),
                "nodes": nodes}

    def down(self) -> bool:
        return down()


def current() -> Sim | None:
    """The simulated lab under the current state dir, or None."""
    try:
        return Sim(json.loads(paths.manifest_path().read_text()))
    except FileNotFoundError:
        return None


def require() -> Sim:
    sim = current()
    if sim is None:
        raise UserError(f"no simulated lab under {paths.sim_dir()}: run `sparkfleet sim up` first")
    return sim


def down() -> bool:
    """Stop every sshd the sim started, unpin its host keys, remove the sandboxes. True if anything was there."""
    d = paths.sim_dir()
    if not d.exists():
        return False
    stop_engines()
    ssh = paths.ssh_dir()
    if ssh.is_dir():  # also after a half-finished `up` that never wrote its manifest
        for conf in sorted(ssh.glob("*/sshd_config")):
            sshd.stop(conf.parent / "sshd.pid", conf)
    sshd.unpin_host_keys(paths.known_hosts_path())
    build.remove_tree(d)
    return True


def start_node_sshd(node: str, info: dict[str, Any]) -> int:
    sshd_bin = sshd.find_sshd()
    if sshd_bin is None:
        raise UserError("ssh mode needs OpenSSH's sshd (apt-get install openssh-server)")
    return sshd.start(sshd_bin, Path(info["config"]), Path(info["pid_file"]), Path(info["log"]), info["port"])


def _setup_ssh(nodes: list[str]) -> dict[str, dict[str, Any]]:
    """Keys, one sshd_config per node, start every sshd, pin their host keys. Returns manifest entries."""
    if sshd.find_sshd() is None:
        raise UserError("ssh mode needs OpenSSH's sshd (apt-get install openssh-server), or use --transport local")
    ssh = paths.ssh_dir()
    client_key = ssh / "id_ed25519"
    sshd.keygen(client_key, "sparkfleet-sim-client")
    authorized = ssh / "authorized_keys"
    authorized.write_text(sshd.public_key(client_key) + " sparkfleet-sim-client\n")
    out: dict[str, dict[str, Any]] = {}
    pins: dict[str, tuple[int, str]] = {}
    for node in nodes:
        ndir = ssh / node
        host_key = ndir / "ssh_host_ed25519_key"
        sshd.keygen(host_key, f"sparkfleet-sim-{node}")
        info = {"port": 0, "config": str(ndir / "sshd_config"), "pid_file": str(ndir / "sshd.pid"),
                "log": str(ndir / "sshd.log"), "key": str(client_key), "user": getpass.getuser()}
        for attempt in range(3):  # a port picked free can be taken before sshd binds it
            info["port"] = sshd.free_port()
            sshd.write_config(Path(info["config"]), node=node, root=paths.node_root(node), port=info["port"],
                              host_key=host_key, authorized_keys=authorized, pid_file=Path(info["pid_file"]))
            try:
                start_node_sshd(node, info)
                break
            except UserError:
                if attempt == 2:
                    raise
        out[node] = info
        pins[node] = (info["port"], sshd.public_key(host_key))
    sshd.pin_host_keys(paths.known_hosts_path(), pins)
    return out


def _inventory_yaml(inv: Inventory, transport: TransportKind, ssh: dict[str, dict[str, Any]]) -> str:
    data = inv.model_dump(mode="json", exclude_none=True)
    data["name"] = "sim"
    data["example"] = False  # addresses, keys and roots below are the simulation's own, not placeholders
    user = getpass.getuser()
    for name, node in data["nodes"].items():
        node["transport"] = transport
        node["sim_root"] = str(paths.node_root(name))
        if transport == "ssh":
            info = ssh[name]
            node["ssh"] = {"host": "127.0.0.1", "port": info["port"], "user": info["user"], "key": info["key"]}
        else:
            node["ssh"] = {"host": "127.0.0.1", "user": user}  # unused: transport local runs on this machine
    head = ("# SIMULATION: generated by `sparkfleet sim up` from inventory "
            f"{inv.name!r} ({transport} transport). Not a real lab.\n"
            "# Same node names, groups, hardware and storage paths as the source; each node's files live\n"
            "# under its sim_root. Rebuilt by `sparkfleet sim up --force`; removed by `sparkfleet sim down`.\n")
    return head + yaml.safe_dump(data, sort_keys=False, width=120)


def up(inventory: str = "lab", *, transport: TransportKind = "local", ops_root: str | Path | None = None,
       force: bool = False) -> Sim:
    """Build the simulated lab of `inventory` (a name under inventories/ or a YAML file)."""
    if transport not in ("local", "ssh"):
        raise UserError(f"unknown transport {transport!r} (local or ssh)")
    d = paths.sim_dir()
    if d.exists() and any(d.iterdir()):
        if not force:
            existing = current()
            what = (f"{len(existing.nodes)} nodes, transport {existing.transport}" if existing
                    else "left over from an unfinished `sim up`")
            raise UserError(f"a simulated lab already exists in {d} ({what}); run `sparkfleet sim down` first, "
                            "or pass --force to tear it down and build a new one")
        down()
    spec = Spec(find_root(str(ops_root) if ops_root else None))
    inv = spec.inventory(inventory)
    lanes = build.load_lanes(spec)
    paths.nodes_dir().mkdir(parents=True)
    try:
        for ordinal, node in enumerate(inv.nodes.values(), start=1):
            build.build_node(paths.node_root(node.name), inv, node, ordinal, lanes)
        ssh = _setup_ssh(list(inv.nodes)) if transport == "ssh" else {}
        paths.sim_inventory_path().write_text(_inventory_yaml(inv, transport, ssh))
        manifest = {
            "simulation": True, "transport": transport, "source_inventory": str(spec.inventory_path(inventory)),
            "ops_root": str(spec.root), "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "known_hosts": str(paths.known_hosts_path()) if transport == "ssh" else None,
            "skipped_profiles": lanes.skipped,
            "nodes": {n.name: {"hardware": n.hardware, **({"ssh": ssh[n.name]} if ssh else {})}
                      for n in inv.nodes.values()},
        }
        shim.write_bytes(paths.manifest_path(), (json.dumps(manifest, indent=2) + "\n").encode())
        sim = Sim(manifest)
        sim.inventory()  # the generated file must load like any inventory; fail now rather than later
    except BaseException:
        down()  # leave nothing half-built or running
        raise
    return sim


def stop_engines() -> None:
    """End every sim engine a `docker run` started on any node (parked sandboxes included)."""
    import signal

    for docker_json in sorted(paths.nodes_dir().glob("*/state/docker.json")):
        try:
            docker = json.loads(docker_json.read_text())
        except (OSError, ValueError):
            continue
        for c in docker.get("containers", []):
            if c.get("SimProcess") and c["State"].get("Running"):
                shim.stop_engine(c, 2.0, signal.SIGTERM)
