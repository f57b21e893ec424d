"""tests/watchproc.py's waits are bounded: a watch that keeps sending events, none of them the one awaited (a
guard that broke, while the probes go on), fails the wait at its bound, not when the watch ends."""

from __future__ import annotations

import sys
import time

import pytest

from tests.watchproc import WatchProc

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

PROBING = ("import json, sys, time\n"
           "while True:\n"
           "    print(json.dumps({'event': 'watch.probe', 'ok': True}), flush=True)\n"
           "    time.sleep(0.05)\n")


def test_a_wait_ends_at_its_bound_while_other_events_keep_coming() -> None:
    w = WatchProc([], {}, command=(sys.executable, "-c", PROBING))
    try:
        assert w.event("watch.probe", ok=True, within=5)["ok"]
        t0 = time.monotonic()
        with pytest.raises(AssertionError, match=r"watch never sent watch.failure \{\} within 1 s"):
            w.event("watch.failure", within=1)
        assert time.monotonic() - t0 < 3
        assert w.proc.poll() is not None  # stopped on the way out
    finally:
        w.stop()

