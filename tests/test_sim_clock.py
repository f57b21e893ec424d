"""The clock-skew fault's node clock (sparkfleet/sim/clock.c) in a sandbox of its own: no lab, no lock.

A program under the library reads the wall clock and file times on the node's clock, and times it sets read back
as set; this machine's view of the same files is unchanged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sparkfleet.sim import clock
from sparkfleet.sim.node import _ro_tree, bwrap_path

PROBE = r'''
import json, os, shutil, sys, time
d = sys.argv[1]
os.mkdir(os.path.join(d, "made"))
open(os.path.join(d, "src"), "w").write("x")
os.utime(os.path.join(d, "src"), (1_700_000_000, 1_700_000_000))
shutil.copy2(os.path.join(d, "src"), os.path.join(d, "dst"))
print(json.dumps({"now": time.time(), "made": os.path.getmtime(os.path.join(d, "made")),
                  "src": os.path.getmtime(os.path.join(d, "src")), "dst": os.stat(os.path.join(d, "dst")).st_mtime}))
'''


@pytest.mark.skipif(bwrap_path() is None or shutil.which("cc") is None, reason="needs bubblewrap and a C compiler")
def test_a_program_on_the_node_clock_sees_the_skew_in_time_and_in_file_times(tmp_path: Path) -> None:
    lib = clock.build(tmp_path)
    skew = tmp_path / "skew"
    skew.write_text("-300\n")
    work = tmp_path / "work"
    work.mkdir()
    # this machine's tree read-only, its /etc entry by entry on a tmpfs (as a node's: sim/node.py), so the skew file
    # is bound inside the sandbox only
    argv = [bwrap_path(), "--ro-bind", "/", "/", "--tmpfs", "/etc", *_ro_tree("/etc", "/etc", set()),
            "--ro-bind", str(skew), clock.SKEW_FILE, "--bind", str(work), str(work), "--setenv", "LD_PRELOAD",
            str(lib), "/usr/bin/python3", "-c", PROBE, str(work)]
    if os.geteuid() != 0:
        argv[1:1] = ["--unshare-user"]
    before = time.time()
    seen = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    after = time.time()
    assert before - 300 <= seen["now"] <= after - 300  # the node's wall clock
    assert before - 301 <= seen["made"] <= after - 299  # a dir it made is stamped in its own time
    assert os.path.getmtime(work / "made") >= before - 1  # ... and in this machine's, seen from here
    assert seen["src"] == seen["dst"] == 1_700_000_000  # times it sets read back as set, copies keep them
    assert os.path.getmtime(work / "src") == 1_700_000_300  # stored on this machine's clock
    assert clock.build(tmp_path) == lib and lib.stat().st_mtime >= clock.SOURCE.stat().st_mtime  # built once
