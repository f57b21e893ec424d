"""Where the simulated lab lives: everything under `<state_dir>/sim/` (state_dir() honours $SPARKFLEET_STATE).

The directory itself and the inventory in it are root.py's (sim_dir, sim_inventory_path): the ops directory's
loader reads that inventory for `--inventory sim` without importing the simulated lab."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sparkfleet.root import sim_dir, state_dir


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


def place_file(source: Path, dest: Path) -> None:
    """Put `source` at `dest` in a node's tree, replacing what is there: a hard link (one copy of a big file
    for the whole lab), else a copy where the two sit on different filesystems."""
    if dest.is_symlink() or dest.exists():
        dest.unlink()
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)
