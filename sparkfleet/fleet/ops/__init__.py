"""Node operations, one object each (see base.py): docker, the fleet lock, files, network, the kernel, the
node-side helpers and the facts they gather. Where an operation takes more than one command, its module also
drives them as a generator the executor runs (allreduce.py: allreduce_ops, the all-reduce across the ranks).

`from sparkfleet.fleet import ops` and `ops.LaneContainers(profile).command()`; the modules below
import from each other's modules, never from this package, so nothing loops.
"""

import importlib

# Each name is imported from its module at first use (PEP 562), not all at once here: `facts` needs one op of
# twenty and their modules pull in the engines and the profile schema (about 0.15 s of its 1.3 s start at 5 nodes,
# docs/fleet-64.md). The names and what `from sparkfleet.fleet.ops import X` gives are unchanged.
_WHERE = {
    "AllReduceRank": "allreduce", "BuildEngine": "rank_build", "ClockProbe": "clock", "ContainerState": "docker",
    "CopyPatchFiles": "patches", "Done": "base", "DropCaches": "system", "EngramLines": "docker",
    "FabricProbe": "fabric_helper", "Facts": "facts_helper", "HashArtefact": "rank_build",
    "HashPatchSet": "patches", "InlineHelper": "helper", "Inspect": "docker", "InspectImage": "image",
    "InstallBuild": "rank_build",
    "LOG_TAIL": "docker", "LaneContainers": "docker", "LockAnswer": "lock", "LockRelease": "lock",
    "LockStuck": "lock", "LockTake": "lock", "LogTail": "docker", "Logs": "docker", "Look": "lock",
    "NodeError": "base", "Op": "base", "PatchState": "patches", "REMEDIES": "base", "Rail2Alias": "net",
    "RankBuild": "rank_build", "ReadFile": "files", "ReadyCheck": "launch", "RemoveStage": "rank_build",
    "RunHelper": "helper", "SeedAutotune": "autotune", "Seen": "lock", "ShipHelper": "helper",
    "StartRank": "launch", "Stop": "docker", "Stopped": "docker", "classify": "base", "drop_caches": "system",
    "failures": "base", "on": "base",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
