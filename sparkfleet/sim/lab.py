"""The simulated lab as a whole: `up`, `down`, status, and faults per node (the API the CLI and tests use).

    from sparkfleet.sim import dockerd, shim, lab
    sim = lab.up("lab", transport="local")     # builds <state_dir>/sim/; refuses if one exists (force=True)
    sim.fault("asusi", "clock-latch")          # or sim.fault("reddie", "port-taken", port=8410)
    sim.heal("asusi")                          # every fault on asusi; sim.heal() heals all
    inv = sim.inventory()                      # the generated inventory (local: each node's `wrapper`)
    lab.down()                                 # ends every node, its namespaces and dirs; idempotent
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Literal

import yaml

from sparkfleet.opsdir import Spec
from sparkfleet.root import find_root, sim_inventory_path
from sparkfleet.schema.errors import UserError
from sparkfleet.schema.inventory import Inventory
from sparkfleet.sim import dockerd, faults, llama, netlab, node, paths, registry, sandbox, shim, sshd, vllmlab
from sparkfleet.sim import slurm as sim_slurm

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
        return sim_inventory_path()

    def inventory(self) -> Inventory:
        """The generated inventory, loaded and validated as sparkfleet loads any inventory file."""
        return Spec(self.dir).inventory(str(self.inventory_path))

    def _node(self, node: str) -> dict[str, Any]:
        if node not in self.manifest["nodes"]:
            raise UserError(f"unknown node {node!r} (simulated nodes: {', '.join(self.nodes)})")
        return self.manifest["nodes"][node]

    def root(self, name: str) -> Path:
        """The node's own tree on this machine (R)."""
        self._node(name)
        return paths.node_root(name)

    def state_dir(self, name: str) -> Path:
        """The node's sim state on this machine (docker.json, logs/, net.json, ...): R/var/lib/sparkfleet-sim."""
        return self.root(name) / shim.STATE

    def faults(self, name: str) -> dict[str, dict[str, Any]]:
        return faults.active(self.root(name))

    def reachable(self, name: str) -> bool:
        d = paths.node_dir(name)
        if node.running_pid(d) is None or (d / "unreachable").exists():
            return False
        return self.transport != "ssh" or self.sshd_pid(name) is not None

    def sshd_pid(self, name: str) -> int | None:
        """The node's sshd (a pid inside the node), while it runs."""
        info = self._node(name).get("ssh")
        if not info:
            return None
        r = node.run_in(paths.node_dir(name), ["/bin/sh", "-c", f"kill -0 $(cat {info['pid_file']}) && "
                                                             f"cat {info['pid_file']}"])
        return int(r.stdout) if r is not None and r.returncode == 0 and r.stdout.strip().isdigit() else None

    def _target(self, name: str) -> faults.Target:
        d = paths.node_dir(name)

        def disconnect() -> None:
            if self.transport == "ssh":
                info = self._node(name)["ssh"]
                node.run_in(d, ["/bin/sh", "-c", f"kill $(cat {info['pid_file']})"])
            else:
                (d / "unreachable").write_text("sparkfleet sim: unreachable fault\n")

        def reconnect() -> None:
            if self.transport == "ssh":
                start_node_sshd(name, self._node(name)["ssh"])
            (d / "unreachable").unlink(missing_ok=True)

        return faults.Target(name, lambda: self.root(name), disconnect, reconnect, d)

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
            entry: dict[str, Any] = {"hardware": info["hardware"], "dir": str(paths.node_dir(n)),
                                     "reachable": self.reachable(n), "faults": self.faults(n)}
            if info.get("ssh"):
                entry["sshd"] = {"address": info["ssh"]["host"], "port": info["ssh"]["port"], "pid": self.sshd_pid(n)}
            nodes[n] = entry
        return {"simulation": True, "dir": str(self.dir), "transport": self.transport,
                "inventory": str(self.inventory_path), "source_inventory": self.manifest["source_inventory"],
                "created_at": self.manifest["created_at"], "known_hosts": self.manifest.get("known_hosts"),
                "nodes": nodes, **({"slurm": self.manifest["slurm"]} if self.manifest.get("slurm") else {})}

    def down(self) -> bool:
        return down()

    @property
    def docker(self) -> str:
        """The lab's docker: "daemon" (each node's own real dockerd) or "shim"."""
        return self.manifest.get("docker") or "shim"

    def exec(self, name: str, argv: list[str], *, timeout_s: float | None = 60.0,
             capture: bool = True) -> subprocess.CompletedProcess:
        """Run a command inside a node as the controller's commands run there (its root, namespaces, PATH),
        entered as the node's console is, so also while the unreachable fault cuts the node off from the
        controller; `capture=False`: its streams are this process's (`sim exec`)."""
        if name not in self.nodes:
            raise UserError(f"sim exec: no node {name!r} in the simulated lab (nodes: {', '.join(self.nodes)})")
        return subprocess.run([str(node.enter_path(paths.node_dir(name))), *argv], capture_output=capture,
                              timeout=timeout_s, env={node.CONSOLE_ENV: "1"})


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
    """End every node (its init and every process in it), remove the lab's namespaces and links, unpin its
    host keys, remove its directory. True if anything was there. Also cleans up after a half-finished `up`."""
    d = paths.sim_dir()
    had = d.exists()
    sim_slurm.stop(None)  # slurmctld and munged on this machine, by their pid files (issue 30)
    registry.stop()  # the lab's image registry, by its pid file
    if paths.nodes_dir().is_dir():
        nds = sorted(p for p in paths.nodes_dir().iterdir() if p.is_dir())
        # A lab going away needs no graceful stop of its daemons: killing each node's init ends every process
        # in its pid namespace at once (dockerd, containerd, the shims, each container's nested namespace),
        # its mount namespace with them; what is left on this machine is each node's container cgroups, now
        # empty, and its tree. (A dockerd's SIGTERM stopped the containers with a grace first: 6.9 s for 4.)
        node.stop_all(nds)
        for nd in nds:
            dockerd.remove_cgroups(dockerd.cgroup_parent(nd.name))
    had = netlab.remove() or had
    if not had:
        return False
    sshd.unpin_host_keys(paths.known_hosts_path())
    sandbox.remove_tree(d)
    return True


def start_node_sshd(name: str, info: dict[str, Any]) -> None:
    """(Re)start the node's sshd inside the node and wait for its banner."""
    argv = [sshd.find_sshd() or "/usr/sbin/sshd", "-f", info["config"], "-E", info["log"]]
    node.run_in(paths.node_dir(name), argv)
    sshd.wait_banner(name, info["host"], info["port"])


def _ssh_config(nodes: list[str], netns: bool) -> dict[str, dict[str, Any]]:
    """Keys and one sshd_config per node (inside the node's tree); the sshd starts with the node."""
    if sshd.find_sshd() is None:
        raise UserError("ssh mode needs OpenSSH's sshd (apt-get install openssh-server), or use --transport local")
    ssh = paths.ssh_dir()
    client_key = ssh / "id_ed25519"
    sshd.keygen(client_key, "sparkfleet-sim-client")
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(nodes):
        inside_dir = f"/{shim.STATE}/ssh"
        host_dir = paths.node_root(name) / shim.STATE / "ssh"
        host_key = host_dir / "ssh_host_ed25519_key"
        sshd.keygen(host_key, f"sparkfleet-sim-{name}")
        (host_dir / "authorized_keys").write_text(sshd.public_key(client_key) + " sparkfleet-sim-client\n")
        host, port = (netlab.mgmt_ip(i), 22) if netns else ("127.0.0.1", sshd.free_port())
        info = {"host": host, "port": port, "config": f"{inside_dir}/sshd_config", "pid_file": "/run/sshd.pid",
                "log": f"{inside_dir}/sshd.log", "key": str(client_key), "user": getpass.getuser(),
                "host_key": sshd.public_key(host_key)}
        # as on a real node, the netns node's sshd listens on every address it has (management and fabric)
        sshd.write_config(host_dir / "sshd_config", node=name, listen="0.0.0.0" if netns else host, port=port,
                          host_key=f"{inside_dir}/ssh_host_ed25519_key",
                          authorized_keys=f"{inside_dir}/authorized_keys", pid_file=info["pid_file"])
        out[name] = info
    return out


def _inventory_yaml(inv: Inventory, transport: TransportKind, ssh: dict[str, dict[str, Any]],
                    slurm: dict[str, Any] | None = None) -> str:
    data = inv.model_dump(mode="json", exclude_none=True)
    data.update(sim_slurm.inventory_keys(slurm))
    data["name"] = "sim"
    data["example"] = False  # addresses, keys and wrappers below are the simulation's own, not placeholders
    user = getpass.getuser()
    for name, n in data["nodes"].items():
        n["transport"] = transport
        n["simulation"] = True
        if transport == "ssh":
            info = ssh[name]
            n["ssh"] = {"host": info["host"], "port": info["port"], "user": info["user"], "key": info["key"]}
        else:
            n["ssh"] = {"host": "127.0.0.1", "user": user}  # unused: the local transport enters the node
            n["wrapper"] = [str(node.enter_path(paths.node_dir(name)))]
    head = ("# SIMULATION: generated by `sparkfleet sim up` from inventory "
            f"{inv.name!r} ({transport} transport). Not a real lab.\n"
            "# Same node names, groups, hardware and storage paths as the source; each node is a sandbox on this\n"
            "# machine (docs/sim-layout.md). Rebuilt by `sparkfleet sim up --force`; removed by\n"
            "# `sparkfleet sim down`.\n")
    return head + yaml.safe_dump(data, sort_keys=False, width=120)


def without_root(transport: TransportKind, root: bool) -> list[str]:
    """The parts of the lab this user does not get, and why (empty as root). Everything else, the local
    lab whole, works the same without root: the nodes live in user namespaces this user owns."""
    if root or transport != "ssh":
        return []
    return ["per-node networks: each node's own network namespace, bridge and veth pair need root (ip netns), so "
            "the nodes' sshd listen on 127.0.0.1 ports and share this machine's network, and the slow-link fault "
            "(tc on a node's own link) is refused",
            "root on the nodes: each sshd must switch to the login user, and a user namespace made without root "
            "maps one uid, so sessions run as you, not root, and what needs root there fails as on a real node "
            "(up's drop_caches: sysctl: permission denied); the local transport has root on its nodes"]


DOCKER_MODES = ("shim", "daemon")


DOCKER_ENV = "SPARKFLEET_SIM_DOCKER"  # overrides the default docker mode of `sim up` (and of the suite's labs)


def default_docker() -> str:
    """$SPARKFLEET_SIM_DOCKER when set; else each node's own real dockerd where this machine can run one (root,
    Debian's docker.io and docker-registry: dockerd.missing() and registry.missing() say nothing), the docker
    shim where it cannot (no root: `make demo` as a user)."""
    return os.environ.get(DOCKER_ENV) or ("shim" if dockerd.missing() or registry.missing() else "daemon")


def up(inventory: str = "lab", *, transport: TransportKind = "local", ops_root: str | Path | None = None,
       force: bool = False, docker: str | None = None, launcher: str = "ssh") -> Sim:
    """Build the simulated lab of `inventory` (a name under inventories/ or a YAML file) and start its nodes.
    `docker`: "daemon" gives every node its own real dockerd (root); "shim" the docker stand-in; None:
    default_docker() ($SPARKFLEET_SIM_DOCKER, else daemon as root with docker.io, else shim). `launcher`:
    "slurm" adds a real Slurm (sim/slurm.py)."""
    docker = docker or default_docker()
    if transport not in ("local", "ssh"):
        raise UserError(f"unknown transport {transport!r} (local or ssh)")
    if docker not in DOCKER_MODES:
        raise UserError(f"unknown docker mode {docker!r} (shim or daemon)")
    if docker == "daemon" and dockerd.missing():
        raise UserError("a real Docker daemon per node needs " + "; ".join(dockerd.missing())
                        + " (nothing was created)")
    daemon = docker == "daemon"
    root = os.geteuid() == 0
    netns = transport == "ssh" and root  # as root each ssh node gets its own network
    if daemon and netns and registry.missing():
        raise UserError("a real Docker daemon per node on the lab's network needs " + "; ".join(registry.missing())
                        + ", the lab's image registry (nothing was created)")
    missing = node.missing_privileges(netns=False)
    if missing:
        raise UserError("cannot build simulated nodes on this machine: missing " + "; ".join(missing)
                        + " (nothing was created)")
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
    lanes = sandbox.load_lanes(spec)
    if launcher == "slurm" and not netns:
        raise UserError("--launcher slurm needs --transport ssh as root (each slurmd in its node's own network)")
    if netns:
        netlab.check_free()
    paths.nodes_dir().mkdir(parents=True)
    try:
        names = list(inv.nodes)
        checkpoints: dict = {}  # one stand-in checkpoint per lab, linked into every node that holds it
        for ordinal, n in enumerate(inv.nodes.values(), start=1):
            sandbox.build_node(paths.node_dir(n.name), inv, n, ordinal, lanes, netns=netns, checkpoints=checkpoints,
                             dockerd=dockerd.cgroup_parent(n.name) if daemon else None,
                             registry=registry.address() if daemon and netns else None)
        ssh = _ssh_config(names, netns) if transport == "ssh" else {}
        if netns:
            netlab.create(inv, names)
        slurm = sim_slurm.prepare(inv, names) if launcher == "slurm" else None
        for n in inv.nodes.values():
            nd = paths.node_dir(n.name)
            ns = netlab.netns_name(n.name) if netns else None
            node.enter_path(nd).write_text(node.enter_script(nd, n.name, netns=netns, userns=not root,
                                                          root=node.node_root_user(ssh=transport == "ssh")))
            node.enter_path(nd).chmod(0o755)
            info = ssh.get(n.name)
            sshd_argv = ([sshd.find_sshd() or "/usr/sbin/sshd", "-D", "-f", info["config"], "-E", info["log"]]
                         if info else None)
            node.start(nd, n.name, netns=ns, sshd=sshd_argv, dockerd=daemon)
        if daemon:
            pushed: set[str] = set()
            if netns:  # the lab's registry: real RepoDigests on every node (sim/registry.py)
                registry.start()
            for n in inv.nodes.values():
                dockerd.wait_ready(paths.node_dir(n.name), n.name)
                specs = sandbox.image_specs(inv, n, lanes)
                dockerd.load_images(paths.node_dir(n.name), n.name, sandbox.images_archive(specs))
                if netns:
                    registry.publish(paths.node_dir(n.name), n.name, sorted(specs), pushed)
        for name, info in ssh.items():
            sshd.wait_banner(name, info["host"], info["port"])
        if ssh:
            sshd.pin_host_keys(paths.known_hosts_path(), {name: (info["host"], info["port"], info["host_key"])
                                                          for name, info in ssh.items()})
        slurm = sim_slurm.start(names) if slurm else None
        sim_inventory_path().write_text(_inventory_yaml(inv, transport, ssh, slurm))
        manifest = {
            "simulation": True, "transport": transport, "source_inventory": str(spec.inventory_path(inventory)),
            "ops_root": str(spec.root), "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "known_hosts": str(paths.known_hosts_path()) if transport == "ssh" else None,
            "netns": netns, "docker": docker, "skipped_profiles": lanes.skipped,
            "engines_missing": [why for why in (llama.missing(lanes.profiles), vllmlab.missing(lanes.profiles))
                                if why],
            "without_root": without_root(transport, root),
            "nodes": {n.name: {"hardware": n.hardware, **({"ssh": ssh[n.name]} if ssh else {})}
                      for n in inv.nodes.values()},
            **({"slurm": slurm} if slurm else {}),
        }
        shim.write_bytes(paths.manifest_path(), (json.dumps(manifest, indent=2) + "\n").encode())
        sim = Sim(manifest)
        sim.inventory()  # the generated file must load like any inventory; fail now rather than later
    except BaseException:
        down()  # leave nothing half-built or running
        raise
    return sim
