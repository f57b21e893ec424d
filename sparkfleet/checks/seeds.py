"""Numbers from the seed write-ups that the checks need and no spec field carries, each with its requirement id.

Thresholds a user may want to change live in the inventory's hardware classes (memory floor, earlyoom
percent, clock latch band and fraction, slow-state ratio, host floor) or in the profile (measured
headroom, MemAvailable floors). What is left here is what the seeds measured once: the size of a
node-local Engram copy, and the two numbers the earlyoom margin is derived from.
"""

from __future__ import annotations

GB = 10**9  # the seeds write "GB" for MemAvailable and headroom ("2 GB", "9 GB", "≥ 5 GB")
GiB = 2**30

# INV-36 / ENG-24: one rank's node-local Engram copy on the four Sparks (TP4): "47.2 GiB per
# rank, verified row by row" for the fp8 tables; "28 GB per node for NVFP4".
ENGRAM_COPY_BYTES_TP4: dict[str, int] = {"fp8": int(47.2 * GiB), "nvfp4": 28 * GB}
ENGRAM_COPY_TP = 4  # the TP those sizes were measured at
# ENG-03: "Each rank only ever needs the rows of its 6 of 24 hash columns", i.e. 1/TP of each
# table, so a copy at another TP is the TP4 size x 4 / TP (ENG-20: other TPs need their own ranges).
ENGRAM_HASH_COLUMNS = 24

# INV-13 / HLT-24: "earlyoom on these nodes fires at 2% of RAM (~2.4 GB)".
EARLYOOM_SEED_THRESHOLD_BYTES = int(2.4 * GB)
# HLT-23: "MemAvailable on every node (≥ 5 GB on the head)" after load.
HEAD_FLOOR_SEED_BYTES = 5 * GB
# The margin above earlyoom's SIGTERM line that a lane's predicted MemAvailable after load must keep.
# The seeds wanted the head at >= 5 GB (HLT-23) where earlyoom fires at ~2.4 GB (INV-13): 2.6 GB
# between them. The 10 GiB-KV lane left the head at 2 GB, below even the threshold (FM-15); the
# shipped 8 GiB left 9 GB (PRF-S05). A profile's own expect.mem_available_floor_gb raises it further.
EARLYOOM_MARGIN_BYTES = HEAD_FLOOR_SEED_BYTES - EARLYOOM_SEED_THRESHOLD_BYTES

# docs/failure-modes.md FM-09; INV-16: how the GB10 clock latch is cleared.
LATCH_REMEDY = ("unplug the node's power adapter for 30-60 s; a reboot does not clear it "
                "(docs/failure-modes.md FM-09; INV-16)")


def engram_copy_bytes(fmt: str | None, tp: int) -> int | None:
    """A rank's node-local Engram copy at this TP, scaled from the TP4 measurement (ENG-03); None if unknown."""
    base = ENGRAM_COPY_BYTES_TP4.get(fmt or "")
    if base is None or tp < 1 or ENGRAM_HASH_COLUMNS % tp:
        return None  # the seeds give no size for this format, or the columns do not split evenly
    return base * ENGRAM_COPY_TP // tp
