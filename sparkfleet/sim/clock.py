"""The clock-skew fault's node clock: a small preload library (clock.c) that puts every program started in the
node on the node's own wall clock. THIS IS PART OF THE SIMULATED LAB: the lab's nodes share this machine's
kernel and so its clock; a real node whose clock is off has it off for everything it runs.

Built on first use with this machine's C compiler into the node's bin dir (the node sees it at
/usr/local/bin/sim-clock.so); the node's /etc/ld.so.preload names it only while the fault is on.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from sparkfleet.schema.errors import UserError

LIBRARY = "sim-clock.so"
NODE_PATH = f"/usr/local/bin/{LIBRARY}"  # the node's bin dir is its /usr/local/bin (sim/node.py SHIM_DIR)
SKEW_FILE = "/etc/sparkfleet-sim-clock"  # clock.c reads the skew (seconds, negative: behind) from here
PRELOAD_FILE = "/etc/ld.so.preload"
SOURCE = Path(__file__).with_name("clock.c")


def build(bin_dir: Path) -> Path:
    """The library in `bin_dir` (compiled once, when missing or older than its source)."""
    out = bin_dir / LIBRARY
    if out.is_file() and out.stat().st_mtime >= SOURCE.stat().st_mtime:
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise UserError("the clock-skew fault needs a C compiler on this machine to build the node's clock "
                        "(apt-get install gcc)")
    tmp = out.with_suffix(".tmp")
    proc = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SOURCE), "-ldl"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"the clock-skew fault's node clock did not build: {proc.stderr.strip()[-500:]}")
    tmp.replace(out)
    return out
