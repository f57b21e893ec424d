"""Node operations, one object each (see base.py): docker, the fleet lock, files, network, the kernel, the
node-side helpers and the facts they gather. Where an operation takes more than one command, its module also
drives them as a generator the executor runs (allreduce.py: allreduce_ops, the all-reduce across the ranks).

`from sparkfleet.fleet import ops` and `ops.LaneContainers(profile).command()`; the modules below
import from each other's modules, never from this package, so nothing loops.
"""

from sparkfleet.fleet.ops.allreduce import AllReduceRank
from sparkfleet.fleet.ops.autotune import SeedAutotune
from sparkfleet.fleet.ops.base import REMEDIES, Done, NodeError, Op, classify, failures, on
from sparkfleet.fleet.ops.clock import ClockProbe
from sparkfleet.fleet.ops.docker import (
    LOG_TAIL,
    ContainerState,
    EngramLines,
    Inspect,
    LaneContainers,
    Logs,
    LogTail,
    Stop,
    Stopped,
)
from sparkfleet.fleet.ops.fabric_helper import FabricProbe
from sparkfleet.fleet.ops.facts_helper import Facts
from sparkfleet.fleet.ops.files import ReadFile
from sparkfleet.fleet.ops.helper import InlineHelper, RunHelper, ShipHelper
from sparkfleet.fleet.ops.launch import ReadyCheck, StartRank
from sparkfleet.fleet.ops.lock import LockAnswer, LockRelease, LockStuck, LockTake, Look, Seen
from sparkfleet.fleet.ops.net import Rail2Alias
from sparkfleet.fleet.ops.patches import CopyPatchFiles, HashPatchSet, PatchState
from sparkfleet.fleet.ops.rank_build import BuildEngine, HashArtefact, InstallBuild, RankBuild, RemoveStage
from sparkfleet.fleet.ops.system import DropCaches, drop_caches

__all__ = [
    "AllReduceRank", "BuildEngine", "ClockProbe", "ContainerState", "CopyPatchFiles", "Done", "DropCaches",
    "EngramLines", "FabricProbe", "Facts", "HashArtefact", "HashPatchSet", "InlineHelper", "Inspect", "InstallBuild",
    "LOG_TAIL", "LaneContainers", "LockAnswer", "LockRelease", "LockStuck", "LockTake", "LogTail", "Logs", "Look",
    "NodeError", "Op", "PatchState", "REMEDIES", "Rail2Alias", "RankBuild", "ReadFile", "ReadyCheck", "RemoveStage",
    "RunHelper", "SeedAutotune", "Seen", "ShipHelper", "StartRank", "Stop", "Stopped", "classify", "drop_caches",
    "failures", "on",
]
