"""Where the simulated lab lives: everything under `<state_dir>/sim/` (state_dir() honours $SPARKFLEET_STATE)."""

from __future__ import annotations

from pathlib import Path

from sparkfleet.root import state_dir


def sim_dir() -> Path:
    """The simulated lab's directory: sandboxes, ssh keys and configs, the manifest, the inventory."""
    return state_dir() / "sim"


def sim_inventory_path() -> Path:
    """The inventory `sim up` writes for itself; `--inventory sim` resolves here."""
    return sim_dir() / "inventory.yaml"


def manifest_path() -> Path:
    """sim.json: transport, source inventory, nodes and their sshd ports."""
    return sim_dir() / "sim.json"


def nodes_dir() -> Path:
    return sim_dir() / "nodes"


def node_dir(node: str) -> Path:
    """A node's directory on this machine: fs/ (its own files), bin/ (shims), enter, init.json, node.log."""
    return nodes_dir() / node


def node_root(node: str) -> Path:
    """R in docs/sim-layout.md: the node's own tree; its top-level dirs are the node's /nvme, /root, /var ..."""
    return node_dir(node) / "fs"


def ssh_dir() -> Path:
    """ssh mode: the client key, authorized_keys and one directory per node (config, host key, pid, log)."""
    return sim_dir() / "ssh"


def known_hosts_path() -> Path:
    """The known_hosts file sparkfleet checks host keys against; the sim pins its sshd keys here."""
    return state_dir() / "known_hosts"


def inside(root: Path, node_path: str) -> Path:
    """A node's absolute path `/x/y` as it lies in the sandbox: `R/x/y`."""
    if not node_path.startswith("/"):
        raise ValueError(f"{node_path!r}: expected an absolute path")
    return root / node_path.lstrip("/")
