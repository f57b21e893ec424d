"""The exporter's background poller: facts from every node each interval, cached for scrapes.

Each poll runs, every node in parallel: the facts helper (one round trip per node, as `sparkfleet
facts`), and, unless turned off, the extras command (earlyoom's journal and the lanes' Engram
manifests; metrics/extras.py). It then builds a new Snapshot, which it publishes by replacing one
attribute: a scrape reads whichever snapshot is current and never waits. Run records are local files,
so a second thread re-reads them every couple of seconds (each new record parsed once): a lane's check
and gate results show up right after its `up`, not only after the next fleet poll.

A node that does not answer keeps its last facts time (its facts age grows) and is exported with
up 0; a poll that fails as a whole (a bug, a transport that raises) is logged and the next one runs
on schedule. A poll never overlaps the next: a slow poll delays the next one, never doubles it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sparkfleet.engram.fleet import copy_dirs
from sparkfleet.engram.ranges import stored
from sparkfleet.fleet.gather import fabric_ifaces, gather
from sparkfleet.fleet.nodefacts import FactsRequest, NodeFacts
from sparkfleet.fleet.op import Pending, executor_for, query
from sparkfleet.fleet.transport import Result, Transport
from sparkfleet.metrics import extras
from sparkfleet.metrics.collector import PROFILE_LABEL, FleetView, Lane, NodeState, Snapshot, lane_containers, snapshot
from sparkfleet.naming import engram_manifest_path
from sparkfleet.opsdir import Spec
from sparkfleet.placement import place
from sparkfleet.runner.summaries import RunIndex, RunSummary
from sparkfleet.schema.errors import SpecError, UserError
from sparkfleet.schema.inventory import Inventory, Node
from sparkfleet.watch.status import Status as WatchStatus
from sparkfleet.watch.status import read_all as read_watches


def load_lane(spec: Spec, inventory: Inventory, name: str) -> Lane:
    """A lane's ranks and node-local Engram manifest paths (raises SpecError/UserError as `plan` would)."""
    loaded = spec.profile(name)
    if loaded.profile.abstract:
        raise UserError(f"{name} is a base for other lanes (abstract: true), not a lane")
    ranks = place(loaded, inventory)
    manifests = {rank: engram_manifest_path(d)
                 for rank, d in copy_dirs(loaded.profile, inventory, ranks, spec.root / "templates").values()}

    harvest = stored(loaded.profile) if manifests else None  # the one Engram rule judges with these rows
    return Lane(loaded.profile, {r.rank: r.node.name for r in ranks}, manifests, harvest)


def _log(msg: str) -> None:
    sys.stderr.write(f"sparkfleet exporter: {msg}\n")
    sys.stderr.flush()


class Poller:
    """Polls the fleet on a background thread; `snapshot` is what scrapes read."""

    def __init__(self, spec: Spec, inventory: Inventory, transport: Transport, *, interval_s: float = 15.0,
                 timeout_s: float = 30.0, profile: str | None = None, journal: bool = True,
                 runs_dir: Path | None = None, journal_state: Path | None = None, records_interval_s: float = 2.0,
                 watch_state: Path | None = None,
                 clock: Callable[[], float] = time.time, log: Callable[[str], None] = _log) -> None:
        self.spec = spec
        self.inventory = inventory
        self.transport = transport
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.profile = profile
        self.journal = journal
        self.clock = clock
        self.log = log
        self.nodes: list[Node] = list(inventory.nodes.values())
        self.states = {node.name: NodeState(node.name) for node in self.nodes}
        self.index = RunIndex(runs_dir, inventory.name) if runs_dir is not None else None
        self.journal_state = journal_state
        self.lanes: dict[str, Lane] = {}
        self.lane_errors: dict[str, str] = {}  # lanes seen on the fleet whose profile cannot be loaded
        self.active: set[str] = set()  # lanes exported now
        if profile is not None:
            self.lanes[profile] = load_lane(spec, inventory, profile)  # the user named it: fail loudly now
            self.active = {profile}
        self.records_interval_s = min(records_interval_s, interval_s)
        self.runs: list[RunSummary] = []
        self.watch_state = watch_state  # the state dir whose watch/*.json status files are exported
        self.watches: list[WatchStatus] = []
        self.polls = 0
        self.poll_duration_s: float | None = None
        self.polled_at: float | None = None
        self._load_journal_state()
        # the poll thread and the records thread both change state and publish: one at a time
        self._lock = threading.Lock()
        self.snapshot: Snapshot = snapshot(self._view())
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- the loop ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Poll now and then every interval, and watch the run records, on daemon threads."""
        self._threads = [threading.Thread(target=self._loop, name="sparkfleet-poller", daemon=True)]
        if self.index is not None or self.watch_state is not None:
            self._threads.append(threading.Thread(target=self._records_loop, name="sparkfleet-records", daemon=True))
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the loops to end and wait for the poll in progress (up to `timeout_s`)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.poll_once()
            except Exception as exc:  # noqa: BLE001 - a failed poll must not end the exporter
                self.log(f"poll failed: {type(exc).__name__}: {exc}")
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def _records_loop(self) -> None:
        while not self._stop.wait(self.records_interval_s):
            try:
                self.refresh_records()
            except Exception as exc:  # noqa: BLE001 - an unreadable runs dir must not end the exporter
                self.log(f"reading run records failed: {type(exc).__name__}: {exc}")

    def refresh_records(self) -> None:
        """Re-read the run records; publish a new snapshot when they changed (after the first poll)."""
        if self.index is None and self.watch_state is None:
            return
        with self._lock:
            runs = self.index.refresh() if self.index is not None else self.runs
            watches = self._watches()
            if runs != self.runs or watches != self.watches:
                self.runs, self.watches = runs, watches
                if self.polls:
                    self._publish()

    def _watches(self) -> list[WatchStatus]:
        return read_watches(self.watch_state, self.inventory.name) if self.watch_state is not None else []

    def _publish(self) -> Snapshot:
        snap = snapshot(self._view())
        self.snapshot = snap  # one assignment: scrapes see the old snapshot or the new one, never half
        return snap

    # -- one poll ---------------------------------------------------------------------------------
    def poll_once(self) -> Snapshot:
        """Gather facts (and extras) from every node, update the state, publish a new snapshot."""
        t0 = time.monotonic()
        want_extras = self.journal or any(self.lanes[k].manifests for k in self.active)
        # the extras run in the background (the executor's) while the facts are gathered: a poll takes the
        # longer of the two, not their sum
        extras_running = self._start_extras() if want_extras else None
        facts = self._facts()
        answers = self._extras(*extras_running) if extras_running is not None else {}
        with self._lock:
            now = self.clock()
            for node in self.nodes:
                self._update(self.states[node.name], facts.get(node.name), answers.get(node.name), now)
            self._discover_lanes()
            if self.index is not None:
                self.runs = self.index.refresh()
            self.watches = self._watches()
            self._save_journal_state()
            self.polls += 1
            self.poll_duration_s, self.polled_at = time.monotonic() - t0, now
            return self._publish()

    def _facts(self) -> dict[str, NodeFacts | Result]:
        requests = {node.name: FactsRequest(node=node.name, interfaces=fabric_ifaces(node)) for node in self.nodes}
        try:
            return gather(self.transport, self.nodes, requests, timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a transport that raises fails this poll's nodes, not the exporter
            msg = f"facts gathering failed: {type(exc).__name__}: {exc}"
            return {node.name: Result(node.name, False, error="error", message=msg) for node in self.nodes}

    def _start_extras(self) -> tuple[list[Node], Pending] | None:
        """The extras command on every node that has something to read, started in the background: one
        fan-out by the transport, each node's stdin its own (its journal window, its lanes' manifests)."""
        per_node: dict[str, list[str]] = {}
        for lane in (self.lanes[k] for k in self.active):
            for rank, path in lane.manifests.items():
                per_node.setdefault(lane.ranks[rank], []).append(path)
        targets = [node for node in self.nodes if self.journal or per_node.get(node.name)]
        if not targets:
            return None
        asks = {n.name: extras.request(journal=self.journal, since=self.states[n.name].journal_since,
                                       manifests=per_node.get(n.name, [])) for n in targets}
        op = query("read the node's journal and Engram manifests", {n.name: extras.COMMAND for n in targets},
                   self.timeout_s, asks)
        op.background = True
        pending = executor_for(targets, transport=self.transport).run(op)
        assert isinstance(pending, Pending)  # no dry run here
        return targets, pending

    @staticmethod
    def _extras(targets: list[Node], pending: Pending) -> dict[str, extras.Extras | str]:
        """Each node's extras once the command ended; a transport that raised is every node's error (an
        answer, not the poll's failure)."""
        pending.wait()
        if pending.error is not None:
            why = f"{type(pending.error).__name__}: {pending.error}"
            return {node.name: why for node in targets}
        return {name: extras.parse(r) for name, r in pending.items()}

    def _update(self, st: NodeState, got: NodeFacts | Result | None, answer: extras.Extras | str | None,
                now: float) -> None:
        if isinstance(got, NodeFacts):
            st.up, st.facts, st.facts_at, st.error = True, got, now, None
        else:
            st.up = False
            kind = (got.error if got is not None else None) or "error"
            st.error = (got.message if got is not None else "") or kind
            st.failures[kind] += 1
        if not st.up:
            return  # keep the journal window where it was: the next answer counts the kills in between
        if isinstance(answer, extras.Extras):
            st.manifests = answer.manifests
            j = answer.journal
            if j is not None:
                st.journal_readable = bool(j.get("readable"))
                st.journal_why = str(j.get("why") or "")
                if st.journal_readable:
                    for sig, count in (j.get("kills") or {}).items():
                        if sig in st.kills:
                            st.kills[sig] += int(count)
                    st.journal_since = float(j.get("until", answer.now))
        elif isinstance(answer, str):
            st.manifests = {}
            if self.journal:
                st.journal_readable, st.journal_why = False, answer

    def _discover_lanes(self) -> None:
        """The lanes to export: the named one (--profile), else every lane with containers on the fleet now."""
        if self.profile is not None:
            self.active = {self.profile}
            return
        seen: set[str] = set()
        for st in self.states.values():
            if st.up and st.facts is not None:
                seen |= {c.labels[PROFILE_LABEL] for c in lane_containers(st.facts)}
        for name in sorted(seen - set(self.lanes) - set(self.lane_errors)):
            try:
                self.lanes[name] = load_lane(self.spec, self.inventory, name)  # loaded once, kept
            except (SpecError, UserError) as exc:
                self.lane_errors[name] = str(exc)
                self.log(f"lane {name!r} runs on the fleet but its profile cannot be loaded: {exc}")
        self.active = seen

    def _view(self) -> FleetView:
        lanes = {k: v for k, v in self.lanes.items() if k in self.active}
        return FleetView(self.inventory, self.states, lanes, list(self.runs), self.profile, self.polls,
                         self.poll_duration_s, self.polled_at, list(self.watches))

    # -- earlyoom journal windows survive restarts (and `--once` runs from cron) ----------------------
    def _load_journal_state(self) -> None:
        if self.journal_state is None or not self.journal:
            return
        try:
            data = json.loads(self.journal_state.read_text())
        except (OSError, ValueError):
            return
        for name, d in (data.get("nodes") or {}).items() if isinstance(data, dict) else ():
            st = self.states.get(name)
            if st is None or not isinstance(d, dict):
                continue
            st.journal_since = d.get("since")
            for sig, count in (d.get("kills") or {}).items():
                if sig in st.kills:
                    st.kills[sig] = int(count)

    def _save_journal_state(self) -> None:
        if self.journal_state is None or not self.journal:
            return
        data = {"inventory": self.inventory.name,
                "nodes": {st.name: {"since": st.journal_since, "kills": st.kills}
                          for st in self.states.values() if st.journal_since is not None}}
        try:
            self.journal_state.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.journal_state.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.journal_state)
        except OSError as exc:
            self.log(f"cannot save the journal windows to {self.journal_state}: {exc}")
