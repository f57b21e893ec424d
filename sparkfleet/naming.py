"""The lane's names and paths, in one place: container labels, container names, manifest file names,
node-local copy dirs, the TensorFold rank's config file and the fleet lock on the nodes.

Everything that writes or reads one of these (engines, runner, checks, exporter, status, engram,
patches) imports it from here, so a rename is one line.
"""

from __future__ import annotations

import posixpath

LABEL_PREFIX = "sparkfleet"
PROFILE_LABEL = f"{LABEL_PREFIX}.profile"  # the lane (profile name): `stop` only touches containers carrying it
RANK_LABEL = f"{LABEL_PREFIX}.rank"
RUN_LABEL = f"{LABEL_PREFIX}.run"  # the run id of the `up` that started the container

ENGRAM_MANIFEST = "engram-manifest.json"  # written last, atomically, by a complete node-local copy
PATCH_MANIFEST = "manifest.yaml"  # patches/NAME/manifest.yaml
TENSORFOLD_CONFIG = "config.env"  # a TensorFold rank's rendered config, mounted as <recipe_dir>/config.env

# The fleet lock on each node of a lane: one file per node (every lane on the node shares it), in the
# FHS lock directory, which is a tmpfs (a reboot ends every run, and so every lock) and world-writable
# with the sticky bit on Ubuntu/DGX OS, so a non-root SSH user (the Station's) can take it too.
NODE_LOCK_DIR = "/run/lock"
NODE_LOCK = "sparkfleet.lock"


def container_name(profile: str, rank: int) -> str:
    return f"sf-{profile}-r{rank}"


def slurm_job_name(profile: str) -> str:
    """The Slurm job a lane runs as (launcher: slurm); with its run label, how the lane finds its own jobs."""
    return f"sparkfleet-{profile}"


def labels(profile: str, rank: int, run_id: str) -> dict[str, str]:
    """The labels every rank's container carries (the contract every engine and reader builds on)."""
    return {PROFILE_LABEL: profile, RANK_LABEL: str(rank), RUN_LABEL: run_id}


def engram_copy_dir(root: str, name: str) -> str:
    """A node-local Engram copy: one directory per checkpoint under the node's root (ENG-26);
    `name` is the profile's engram_copy_name() (its copy_dir, else the model's revision)."""
    return posixpath.join(root, name)


def engram_manifest_path(copy_dir: str) -> str:
    return posixpath.join(copy_dir, ENGRAM_MANIFEST)


def tensorfold_config_path(recipe_dir: str) -> str:
    return posixpath.join(recipe_dir, TENSORFOLD_CONFIG)


def tensorfold_rank_config(recipe_dir: str, profile: str, rank: int) -> str:
    """Where a TensorFold rank's rendered config.env is written on its node (then mounted read-only as
    <recipe_dir>/config.env in that rank's container): one file per lane and rank, so lanes never clash."""
    return posixpath.join(recipe_dir, f".sparkfleet-{profile}-r{rank}.{TENSORFOLD_CONFIG}")


def node_lock_path() -> str:
    return posixpath.join(NODE_LOCK_DIR, NODE_LOCK)
