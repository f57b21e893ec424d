"""The interrupt's wait for node commands still in flight (runner/run.py `_in_flight_done`): a pool worker the
signal caught inside its own `start()` is not joinable for a moment ("cannot join thread before it is
started"; CI saw `restore` exit 1 with that traceback instead of 130). The wait asks again, within its bound."""

from __future__ import annotations

import threading
import time

import pytest

from sparkfleet.runner import run

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


class StartingWorker:
    """A pool worker whose start() the signal interrupted: join() refuses `refusals` times, then waits."""

    daemon = False
    name = "ThreadPoolExecutor-0_0"

    def __init__(self, refusals: int) -> None:
        self.refusals, self.joined = refusals, 0

    def join(self, timeout: float | None = None) -> None:
        if self.refusals:
            self.refusals -= 1
            raise RuntimeError("cannot join thread before it is started")
        self.joined += 1


def test_a_worker_caught_starting_is_joined_once_it_runs(monkeypatch):
    worker = StartingWorker(refusals=3)
    monkeypatch.setattr(threading, "enumerate", lambda: [threading.current_thread(), worker])
    run._in_flight_done(bound_s=5.0)
    assert (worker.refusals, worker.joined) == (0, 1)


def test_a_worker_that_never_starts_is_given_up_at_the_bound(monkeypatch):
    worker = StartingWorker(refusals=10**9)
    monkeypatch.setattr(threading, "enumerate", lambda: [worker])
    t0 = time.monotonic()
    run._in_flight_done(bound_s=0.3)
    assert worker.joined == 0 and time.monotonic() - t0 < 3.0
