"""The watch loop: probe every interval, decide (policy.py), act through the same runner as `up`.

A group restart is the `up` playbook (or `restore` for a restore point) run by `runner.run.execute`,
exactly as `sparkfleet up` runs it: stop every rank and wait until gone, drop caches, facts, the
preflight, workers then head, readiness, a short gate set. Before acting, watch writes the evidence
(failing probes, each rank's last log lines, facts) to a run record of its own (playbook `watch`).

A Slurm lane (inventory `launcher: slurm`) restarts the same way: the `up` playbook's stop step cancels
the lane's job (only a job carrying its name and a run label) and proves its containers gone, and its launch
steps submit a new job. One rank's death ends such a job and every task's trap removes its container, so
once a rank vanished or exited watch asks Slurm how the job of the run it looks after ended
(watch/slurmjob.py): by itself (FAILED, ...: a failure, restarted within the budget) or by scancel
(CANCELLED: a `down` or an admin; watch stands down).

Signals (SIGTERM, SIGINT/Ctrl-C): between actions watch exits at once and leaves the lane as it is.
In the middle of a group stop or restart it finishes what it began (the runner's playbook runs to its
end: serving, or every rank of that launch stopped), then exits; a second signal interrupts the
playbook the way that signal interrupts `up` (every rank of that launch is stopped; exit 130 or 143).
Why not stop at once: stopping the supervisor (`systemctl stop`, a controller shutdown) must not take the lane
down. Between actions a signal leaves the lane serving; a restart cut short would leave it stopped, an outage
that only the moment of the signal decided. Finishing leaves it as a signal at any other moment would: serving
(or, if the restart fails, stopped with nothing of that launch left running).
"""

from __future__ import annotations

import shlex
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.fleet.connect import api_base, transport_for
from sparkfleet.fleet.nodefacts import NodeFacts
from sparkfleet.fleet.op import query, run_commands
from sparkfleet.fleet.ops import LogTail, Look, Op, Stopped, on
from sparkfleet.fleet.transport import Result
from sparkfleet.gates.client import ApiClient
from sparkfleet.naming import node_lock_path, slurm_job_name
from sparkfleet.opsdir import Spec
from sparkfleet.placement import Rank, endpoint, loopback_bound, place
from sparkfleet.runner.context import RunOptions
from sparkfleet.runner.events import Events
from sparkfleet.runner.lock import FleetLock, describe, holder_text, parse_holder, pid_alive, stale_why
from sparkfleet.runner.record import Record, new_run_id
from sparkfleet.runner.run import execute
from sparkfleet.runner.slurm_launch import OUTPUT_LINES
from sparkfleet.runner.summaries import RunIndex
from sparkfleet.schema.errors import UserError
from sparkfleet.schema.inventory import Inventory
from sparkfleet.schema.load import Loaded
from sparkfleet.slurm.job import output_path
from sparkfleet.slurm.ops import drive_here
from sparkfleet.watch import status as st
from sparkfleet.watch.liveness import Probe, Prober, RankState
from sparkfleet.watch.policy import (
    Budget,
    Settings,
    Tracker,
    Verdict,
    foreign_ranks,
    lane_removed,
    memory_unread,
    operator_run,
)
from sparkfleet.watch.slurmjob import JobEnd, classify, read_end

PREFLIGHT = ("pins", "stop", "drop_caches", "facts", "check", "patches", "engram", "rail2_up")  # before launch


@dataclass(frozen=True)
class Outcome:
    code: int  # 0: stood down or stopped by a signal; 1: lane left stopped (budget, preflight); 130/143: a
    # restart interrupted by a second SIGINT/SIGTERM
    state: str
    why: str


def interrupted_code(rec: Record) -> int:
    """The exit code of a restart that a second signal interrupted: 143 for SIGTERM, 130 for SIGINT (as `up`)."""
    return 143 if rec.data.get("interrupted_by") == "SIGTERM" else 130


class StandDown(Exception):
    """An operator (or another controller) acted on the lane: watch stops watching it."""

    recorded = False  # an incident's record already says so

    def __init__(self, why: str, holder: dict | None = None) -> None:
        super().__init__(why)
        self.holder = holder  # the fleet lock's holder, when one was named


class Watcher:
    def __init__(self, spec: Spec, loaded: Loaded, inventory: Inventory, settings: Settings, events: Events,
                 state: Path, *, playbook: str = "up", restore_point: dict | None = None,
                 gates: str = "models,count100", dry_run: bool = False, api_key: str | None = None,
                 endpoint_url: str | None = None, boot_budget_s: float | None = None,
                 probe_seconds: float | None = None, poll_s: float = 1.0, command: str = "",
                 fabric_probe: bool = True, accept_unknown: bool = False) -> None:
        self.spec, self.loaded, self.inventory, self.settings = spec, loaded, inventory, settings
        self.profile = loaded.profile
        self.events = events
        self.state = state
        self.playbook = playbook
        self.restore_point = restore_point
        self.gates = gates
        self.dry_run = dry_run
        self.boot_budget_s = boot_budget_s
        self.probe_seconds = probe_seconds  # each restart's clock probe load (None: the probe's default)
        self.fabric_probe = fabric_probe  # each restart measures the links between the ranks (as up does)
        self.accept_unknown = accept_unknown  # --accept-unknown: restarts go on past a node's unread facts part
        self.poll_s = poll_s
        self.command = command or f"sparkfleet watch --profile {self.profile.name}"
        self.ranks: list[Rank] = place(loaded, inventory)
        self.endpoint_url = endpoint_url.rstrip("/") if endpoint_url else None  # --endpoint: used as given
        self.endpoint = self.endpoint_url or endpoint(self.ranks[0].node, self.profile.port)
        self.tunnel: ExitStack | None = None  # the SSH local forward to a loopback-bound head, while open
        self.api_key = api_key
        self.model = self.profile.served_names[0] if self.profile.served_names else None
        self.budget = Budget(settings.max_restarts, settings.window_s, settings.backoff_s)
        self.tracker = Tracker(settings)
        self.history: deque[Probe] = deque(maxlen=max(settings.failures, 1) + 2)
        self.ours: set[str] = set()  # run ids watch started (its own records, its restarts and stops)
        self.known_runs: set[str] = set()  # runs whose containers are the lane watch looks after
        self.started = time.time()
        self.runs = RunIndex(state / "runs", inventory.name)
        self.status = st.Status(self.profile.name, inventory.name, started=self.started,
                                interval_s=settings.interval_s, max_restarts=settings.max_restarts,
                                window_s=settings.window_s, budget_left=settings.max_restarts)
        self.wake = threading.Event()  # set by a signal: stop sleeping
        self.signalled: str | None = None
        self.acting = False
        self.own_leftovers = False  # the lane's state is what watch's own failed restart left
        self.slurm = inventory.launcher == "slurm"  # the lane runs as one Slurm job: restarts resubmit it
        self.failed_restarts: set[str] = set()  # runs of watch's own restarts that failed (their jobs are ours)
        self.cancelled_jobs: set[str] = set()  # Slurm jobs the stop steps of watch's own playbooks cancelled
        self.job_end: JobEnd | None = None  # a Slurm lane's job that ended by itself (read by look_again)
        # what watch cannot judge, said once when it begins and kept in the status file and every record it writes
        self.memory_unread: dict[str, str] = {}  # node -> why the memory guard has no MemAvailable reading
        self.slurm_unasked: str | None = None  # "could not ask Slurm: <error>" (read by look_again)

    # -- events and status ---------------------------------------------------------------------------
    def say(self, kind: str, text: str, **data) -> None:
        self.events.emit(f"watch.{kind}", text=text, profile=self.profile.name, **data)

    def set_state(self, state: str, why: str = "") -> None:
        now = time.time()
        self.status.state, self.status.why, self.status.updated = state, why, now
        self.status.budget_left = self.budget.left(now)
        self.status.restarts = dict(self.budget.by_reason)
        self.status.not_judged = self.not_judged()
        if not self.dry_run:
            st.write(self.state, self.status)

    def not_judged(self) -> list[str]:
        """What watch cannot judge now, one line each with why: nodes without a memory reading, a Slurm that
        could not be asked how the lane's job ended."""
        return [*self.memory_unread.values(), *([self.slurm_unasked] if self.slurm_unasked else [])]

    # -- signals ------------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.signalled and self.acting:
            # a second signal mid-restart interrupts the playbook as the same signal interrupts `up`: every rank
            # of that launch stopped, the locks given back, exit 130 (SIGINT) or 143 (SIGTERM)
            from sparkfleet.runner.run import Terminated

            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        self.signalled = name
        self.wake.set()

    def _sleep(self, seconds: float) -> None:
        if seconds > 0 and not self.signalled:
            self.wake.wait(seconds)

    # -- the loop -----------------------------------------------------------------------------------------
    def run(self, report: Callable[[Outcome], None] | None = None) -> Outcome:
        """Watch until told to stop; `report` gets the outcome while watch's own signal handler still holds
        Ctrl-C (a signal then only marks the watch as told), so a Ctrl-C pressed again as watch ends cannot
        cut its result short."""
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        self.transport = transport_for([r.node for r in self.ranks])
        self.client = ApiClient(self.endpoint, self.api_key, timeout_s=self.settings.probe_timeout_s)
        self.prober = Prober(self.client, self.transport, self.ranks, self.profile, self.settings.probe_timeout_s)
        if self.endpoint_url is None and loopback_bound(self.profile.host) and self.ranks[0].node.transport == "ssh" \
                and self.profile.port is not None:
            self.tunnel = ExitStack()
            self.reopen_tunnel()
        try:
            try:
                outcome = self._loop()
            except StandDown as exc:
                if not exc.recorded:  # its own outcome in watch's records: who took the lane, and when
                    rec = Record(new_run_id(), "watch", self.profile.name, self.inventory.name, self.command)
                    rec.data["stand_down"] = {"why": str(exc), "holder": exc.holder}
                    self.write(rec, "stood-down", str(exc))
                self.set_state("stood-down", str(exc))
                self.say("stand-down", f"stood down: {exc}")
                outcome = Outcome(0, "stood-down", str(exc))
            if report is not None:
                report(outcome)
            return outcome
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.client.close()
            if self.tunnel is not None:
                self.tunnel.close()
            self.transport.close()

    def _loop(self) -> Outcome:
        s = self.settings
        self.say("start", f"watching {self.profile.name} at {self.endpoint}: a probe every {s.interval_s:g} s, "
                 f"{s.failures} failed make a failure, {s.max_restarts} restart(s) per {s.window_s:g} s"
                 + (" (dry run)" if self.dry_run else ""), endpoint=self.endpoint)
        first = True
        while True:
            t0 = time.monotonic()
            self.job_end = None  # a Slurm job's end counts for the probe that found its ranks gone only
            self.slurm_unasked = None  # and so does a failure to ask Slurm about it
            if self.signalled:
                return self._signalled()
            probe, facts = self.probe()
            if self.signalled:
                return self._signalled()
            if first:
                first = False
                self.known_runs |= {r.run_id for r in probe.ranks if r.run_id and r.state == "running"}
                if all(r.state == "vanished" for r in probe.ranks):
                    outcome = self.handle(Verdict("restart", "start", "no rank of the lane exists: starting it"),
                                          facts, count=False)
                    if outcome is not None:
                        return outcome
                    continue
            self.check_operator(probe)
            if lane_removed(probe) and not self.own_leftovers:
                self.look_again(removed=True)  # who did it, while their run still holds the lock
            self.own_leftovers = False
            verdict = self.tracker.observe(probe)
            if self.job_end is not None and verdict.action == "restart":  # every rank gone with the Slurm job
                verdict = Verdict("restart", "job-ended", f"{self.job_end.said()}: the lane's job ended by itself "
                                  "(--kill-on-bad-exit: one rank's end ends the group, each task's trap removing "
                                  "its container)")
            if verdict.action in ("ok", "suspect", "wait"):
                if verdict.action == "wait" and self.status.state != "waiting":
                    self.say("waiting", verdict.why, node=verdict.node)
                self.set_state({"ok": "watching", "wait": "waiting"}.get(verdict.action, "suspect"), verdict.why)
            else:
                outcome = self.handle(verdict, facts)
                if outcome is not None:
                    return outcome
                continue  # probe again at once: the lane just restarted (or the restart failed)
            self._sleep(s.interval_s - (time.monotonic() - t0))

    def _signalled(self) -> Outcome:
        why = f"{self.signalled}: watch ended; the lane is left as it is"
        self.set_state("ended", why)
        self.say("end", why, signal=self.signalled)
        return Outcome(0, "ended", why)

    def probe(self) -> tuple[Probe, dict[str, NodeFacts | Result]]:
        if self.model is None:
            try:
                self.model = str(self.client.models()[0]["id"])
            except Exception:  # noqa: BLE001 (any failure: the probe below reports the endpoint's state)
                pass
        probe, facts = self.prober.probe(self.model or "", self.settings.interval_s)
        if self.tunnel is not None and probe.health is None:  # the head or the forward's connection is gone:
            self.reopen_tunnel()  # the next probe goes through a fresh forward (a dead one would fail forever)
        self.history.append(probe)
        self.status.probe_ok, self.status.probe_latency_s = probe.ok, probe.latency_s
        self.status.probe_at, self.status.probe_why = probe.at, probe.why
        odd = [f"{r.rank} {r.state}" for r in probe.ranks if r.state != "running"]
        latency = f"{probe.latency_s:.2f} s" if probe.latency_s is not None else "-"
        self.say("probe", f"probe {'ok' if probe.ok else 'FAIL'} {latency}, /health {probe.health or '-'}, ranks "
                 f"{', '.join(odd) if odd else 'all running'}: {probe.why}", ok=probe.ok, latency_s=probe.latency_s,
                 health=probe.health,
                 why=probe.why, ranks=[_rank_dict(r) for r in probe.ranks])
        self.note_memory_unread(probe)
        return probe, facts

    def note_memory_unread(self, probe: Probe) -> None:
        """Say when a node's MemAvailable stops being read (the memory guard cannot judge it) and when it is read
        again: once each, not every probe."""
        unread = memory_unread(probe)
        for node, line in unread.items():
            if self.memory_unread.get(node) != line:
                self.say("not-judged", line, node=node)
        for node in self.memory_unread.keys() - unread.keys():
            self.say("judged-again", f"memory guard: MemAvailable is read again from {node}", node=node)
        self.memory_unread = unread

    # -- a loopback-bound head ------------------------------------------------------------------------
    def open_tunnel(self) -> str:
        """The head serves on its loopback only (`host: 127.0.0.1`): the probe reaches it through the SSH
        local forward of fleet/connect.py's `api_base` (the rule `up`'s readiness, `gates`, `bench` and
        `status` use), over a connection of its own so a facts round trip that drops a connection cannot
        take the forward along."""
        head = self.ranks[0].node
        stack = ExitStack()
        url = stack.enter_context(api_base(head, self.profile.port, self.profile.host))
        self.tunnel = stack
        self.say("tunnel", f"{head.name} serves on 127.0.0.1:{self.profile.port} only: probing it through an "
                 f"SSH tunnel at {url}", endpoint=url)
        return url

    def reopen_tunnel(self) -> None:
        assert self.tunnel is not None
        self.tunnel.close()
        self.tunnel = None
        try:
            url = self.open_tunnel()
        except Exception as exc:  # noqa: BLE001 (an unreachable head: the next probe fails and says so)
            self.say("tunnel", f"the SSH tunnel to {self.ranks[0].node.name} could not be reopened: {exc}")
            self.tunnel = ExitStack()  # try again after the next probe
            return
        self.endpoint = url
        self.client.close()
        self.client = ApiClient(url, self.api_key, timeout_s=self.settings.probe_timeout_s)
        self.prober.client = self.client

    # -- the operator wins ----------------------------------------------------------------------------
    def check_operator(self, probe: Probe | None = None) -> None:
        """Raise StandDown when someone else ran this lane since watch started (records, lock, containers)."""
        theirs = operator_run(self.runs.refresh(), self.ours, self.started, self.profile.name)
        if theirs is not None:
            raise StandDown(f"{theirs.playbook} of {self.profile.name} ran without watch (run {theirs.run_id}, "
                            f"outcome {theirs.outcome}): the operator has the lane")
        holder = FleetLock(self.lock_path(), "").live_holder()
        if holder is not None and self.profile.name in str(holder.get("command", "")).split():
            raise StandDown(f"{holder.get('command')!r} by {holder.get('user')}@{holder.get('host')} pid "
                            f"{holder.get('pid')} holds the fleet lock: the operator has the lane")
        if probe is not None:
            foreign = foreign_ranks(probe, self.known_runs)
            if foreign:
                raise StandDown("the lane was relaunched by a run watch did not start (another controller?): "
                                + "; ".join(foreign))

    def look_again(self, removed: bool = False) -> None:
        """Before acting (and when every container vanished at once), look at the nodes once more, one
        round trip each: the fleet lock on the lane's nodes (runner/lock.py's NodeLock) and the lane's
        containers by label. A run of this lane that watch did not start holding the lock — an `up` or
        `down` from here or from another controller — is named and watch stands down; so it does when
        every rank's container is gone (a `down` that has already finished; `removed`: the probe saw it).
        A Slurm lane's job says which it was (slurm_job_failed): ended by itself, a failure; by scancel, a
        removal."""
        path = node_lock_path()
        me = parse_holder(holder_text("", self.command, self.profile.name))
        look = Look(self.profile.name, path)
        results = _run_each(self.transport, self.inventory, "look at the fleet lock and the lane's containers",
                            {r.node.name: look for r in self.ranks})
        looks = {n: look.parse(res) for n, res in results.items()}
        for n, look in looks.items():
            holder = parse_holder(look.lock) if look.lock else {}
            if look.lock and holder.get("lane", self.profile.name) == self.profile.name \
                    and holder.get("run_id") not in self.ours \
                    and stale_why(holder, None, me, pid_alive) is None:  # a dead run's lock: the runner's rule
                raise StandDown(f"{describe(n, path, look.lock)} holds the fleet lock of the lane's nodes: "
                                "the operator has the lane", holder or {"text": look.lock})
        if self.slurm and self.slurm_job_failed():  # a rank's end ends a Slurm lane's job: how did it end?
            return  # by itself, each task's trap removing its container: a failure to restart
        if removed or (looks and all(x.ids == [] for x in looks.values())):
            slurm = ""
            if self.slurm:  # what Slurm said of the job, or that it could not be asked (never read as "no job")
                slurm = f"; {self.slurm_unasked}" if self.slurm_unasked else \
                    "; Slurm no longer lists a job of the lane carrying its run label"
            raise StandDown("every rank's container was removed (a `down` of the lane, here or by another "
                            "controller): the operator has the lane" + slurm)

    def slurm_job_failed(self) -> bool:
        """A rank of a Slurm lane vanished or exited, so its job ends (--kill-on-bad-exit; a task ends when its
        container does): True when the job of the run watch looks after ended by itself (kept in `job_end`);
        StandDown when scancel ended it (whatever containers are still being removed); False when Slurm
        cannot say (no such job any more, or still not ended after slurm/ops.py END_BOUND_S) or could not be asked
        (squeue or scontrol failed, the controller or login node did not answer: kept in `slurm_unasked`)."""
        runs = self.known_runs | self.failed_restarts
        self.slurm_unasked = None
        try:
            end = drive_here(self.inventory, read_end(self.inventory, self.profile.name, runs, poll_s=self.poll_s))
        except Exception as exc:  # noqa: BLE001 (slurmjob.SlurmUnanswered, or a transport's error: Slurm not asked)
            self.slurm_unasked = f"could not ask Slurm: {exc}"
            self.say("not-judged", f"{self.slurm_unasked}; how the lane's job ended is not known", error=str(exc))
            return False
        kind = classify(end, self.failed_restarts, self.cancelled_jobs)
        if end is not None:
            self.say("slurm", f"{end.said()} (run {end.run_id}): {kind}", job_id=end.job_id, state=end.state,
                     exit_code=end.exit_code)
        if kind == "cancelled":
            assert end is not None
            raise StandDown(f"{end.said()}: scancel ended the lane's job (a `down` of the lane, here or by another "
                            "controller, or Slurm's admin): the operator has the lane")
        if kind == "failed":
            self.job_end = end
            return True
        return False

    def lock_path(self) -> Path:
        return self.state / "locks" / f"{self.inventory.name}.lock"

    # -- acting on a failure -------------------------------------------------------------------------
    def handle(self, verdict: Verdict, facts: dict[str, NodeFacts | Result], count: bool = True) -> Outcome | None:
        """Evidence, the memory stop, the budget, backoff, the group restart; an Outcome when watch ends."""
        incident = Record(new_run_id(), "watch", self.profile.name, self.inventory.name, self.command)
        try:
            return self._handle(incident, verdict, facts, count)
        except StandDown as exc:
            incident.data["stand_down"] = {"why": str(exc), "holder": exc.holder}
            self.write(incident, "stood-down", str(exc))
            exc.recorded = True
            raise

    def _handle(self, incident: Record, verdict: Verdict, facts: dict[str, NodeFacts | Result],
                count: bool) -> Outcome | None:
        now = time.time()
        self.ours.add(incident.run_id)
        incident.data["incident"] = {"reason": verdict.reason, "why": verdict.why, "node": verdict.node}
        incident.data["probes"] = [p.as_dict() for p in self.history]
        incident.data["facts"] = {n: (f.model_dump(mode="json") if isinstance(f, NodeFacts) else
                                      {"error": f.error, "message": f.message}) for n, f in facts.items()}
        incident.data["last_log_lines"] = self.log_tails()
        self.say("failure", f"{verdict.reason}: {verdict.why}", reason=verdict.reason, why=verdict.why,
                 node=verdict.node, record=incident.run_id)
        self.write(incident, "running")
        if count and verdict.reason in ("rank-vanished", "rank-exited"):
            self.look_again()  # before the budget or the memory stop: a `down` under way is not a failure
        if self.job_end is not None:  # the Slurm job's end and its output's last lines, as evidence
            incident.data["slurm_job"] = self.job_end.as_record(self.profile.name)
            incident.data["last_log_lines"].update(self.job_output(self.job_end))
            self.job_end = None
        if verdict.action == "memory-stop":
            out = self.stop_lane(incident, f"memory guard: {verdict.why}")
            if out is not None:
                return out
        if count and self.budget.left(now) == 0:
            why = self.budget.why_spent(now)
            incident.steps.append({"step": "budget", "status": "fail", "summary": why})
            if verdict.action != "memory-stop":
                out = self.stop_lane(incident, why)
                if out is not None:
                    return out
            return self.leave_stopped(incident, why)
        delay = self.budget.delay(now) if count else 0.0
        if delay > 0:
            self.set_state("backoff", f"restart {self.budget.used(now) + 1} waits {delay:g} s (--backoff)")
            self.say("backoff", f"waiting {delay:g} s before restart {self.budget.used(now) + 1} "
                     f"of {self.settings.max_restarts} (growing backoff)", delay_s=delay)
            self._sleep(delay)
            if self.signalled:
                self.write(incident, "interrupted", f"{self.signalled} during the backoff; nothing restarted")
                return self._signalled()
        self.check_operator()
        if delay > 0 and count and verdict.reason in ("rank-vanished", "rank-exited", "job-ended"):
            self.look_again()  # after the backoff: once more (the first look is older than the wait)
        if count:
            self.budget.spend(time.time(), verdict.reason)
        self.set_state("restarting", verdict.why)
        rec = self.run_playbook(self.playbook, f"restart ({verdict.reason})", RunOptions(
            gate_args={"only": self.gates}, stop_on_gate_failure=True, restore_point=self.restore_point,
            boot_budget_s=self.boot_budget_s, probe_seconds=self.probe_seconds, poll_s=self.poll_s,
            endpoint=self.endpoint_url, fabric_probe=self.fabric_probe, accept_unknown=self.accept_unknown))
        incident.steps.append({"step": f"restart:{self.playbook}", "status": "ok" if rec.outcome == "ok" else "fail",
                               "summary": rec.reason or rec.outcome, "run_id": rec.run_id})
        incident.data["restart"] = {"playbook": self.playbook, "run_id": rec.run_id, "outcome": rec.outcome,
                                    "reason": rec.reason, "budget_left": self.budget.left(time.time())}
        if self.dry_run:
            self.write(incident, "ok", "dry run: nothing was changed")
            self.tracker.reset()
            self.own_leftovers = True  # the lane is as the failure left it, not as an operator made it
            self.say("dry-run", f"would restart {self.profile.name} through the {self.playbook} playbook "
                     f"(restart {self.budget.used(time.time())} of {self.settings.max_restarts})")
            self._sleep(self.settings.interval_s)
            return None
        if rec.outcome == "ok":
            self.known_runs = {rec.run_id}
            self.failed_restarts.clear()
            self.tracker.reset()
            self.write(incident, "ok", f"serving again after {verdict.reason} (run {rec.run_id})")
            self.say("serving", f"serving again (run {rec.run_id}); restarts left in the window: "
                     f"{self.budget.left(time.time())}", run_id=rec.run_id)
            self.set_state("watching", f"restarted after {verdict.reason}")
            return None if not self.signalled else self._signalled()
        if rec.outcome == "interrupted":
            self.write(incident, "interrupted", rec.reason)
            self.set_state("ended", rec.reason)
            return Outcome(interrupted_code(rec), "ended", rec.reason)
        failed_step = next((s["step"] for s in rec.steps if s["status"] == "fail"), "")
        if failed_step.split(":")[0] in PREFLIGHT or rec.outcome == "refused":
            why = f"the restart's preflight failed ({rec.reason}); nothing was started"
            return self.leave_stopped(incident, why)
        self.own_leftovers = True
        self.failed_restarts.add(rec.run_id)
        self.write(incident, "failed", f"restart failed: {rec.reason}")
        self.say("restart-failed", f"restart failed: {rec.reason}", run_id=rec.run_id)
        return None if not self.signalled else self._signalled()

    def run_playbook(self, name: str, what: str, options: RunOptions) -> Record:
        """`up`/`restore`/`down` through the runner, exactly as the CLI runs it (it takes the fleet lock)."""
        options.dry_run = self.dry_run
        self.acting = True
        try:
            rec = execute(self.spec, self.loaded, self.inventory, self.spec.playbook(name), options, self.events,
                          f"sparkfleet watch {self.profile.name}: {what}")
        except UserError as exc:
            if "holds the fleet lock" in str(exc):  # runner/lock.py's Busy: names node and holder
                raise StandDown(str(exc)) from None
            raise
        finally:
            self.acting = False
            self.prober.invalidate()  # the lane changed: the next probe looks at fresh facts
        self.ours.add(rec.run_id)
        for step in rec.steps:  # a Slurm lane: the jobs this playbook's stop step cancelled are watch's doing
            self.cancelled_jobs.update((step.get("data") or {}).get("slurm_jobs_cancelled", []))
        return rec

    def stop_lane(self, incident: Record, why: str) -> Outcome | None:
        """Stop every rank, head first, keeping the containers (their logs) for the operator. A Slurm lane's
        job is cancelled instead, which makes each task's trap remove its container (the ranks' logs are in
        the job's output file, and their last lines in the incident record already)."""
        self.set_state("restarting", why)
        rec = self.run_playbook("down", "stop", RunOptions(keep=not self.slurm, poll_s=self.poll_s))
        done = "its Slurm job cancelled, no container left" if self.slurm else "every rank stopped, head first"
        incident.steps.append({"step": "stop", "status": "ok" if rec.outcome == "ok" else "fail",
                               "summary": rec.reason or done, "run_id": rec.run_id})
        if not self.dry_run and not self.slurm:  # docker's own FinishedAt per rank: what the order really was
            stopped = Stopped(self.profile.name)
            results = _run_each(self.transport, self.inventory, "read when each rank stopped",
                                {r.node.name: stopped for r in self.ranks})
            incident.data["stopped"] = {n: stopped.parse(res) for n, res in results.items()}
        self.say("stopped", f"{'would stop' if self.dry_run else 'stopped'} "
                 f"{'the lane (its Slurm job cancelled)' if self.slurm else 'every rank, head first'} (run "
                 f"{rec.run_id}): {why}", run_id=rec.run_id)
        if rec.outcome == "interrupted":
            self.write(incident, "interrupted", rec.reason)
            return Outcome(interrupted_code(rec), "ended", rec.reason)
        return None

    def leave_stopped(self, incident: Record, why: str) -> Outcome:
        text = f"{why}; the lane is left stopped" + (" (dry run: nothing was changed)" if self.dry_run else "")
        self.write(incident, "failed", text)
        self.set_state("stopped", text)
        self.say("give-up", text, record=incident.run_id)
        return Outcome(1, "stopped", text)

    def write(self, rec: Record, outcome: str, reason: str = "") -> None:
        rec.outcome, rec.reason = outcome, reason
        rec.finished = None if outcome == "running" else time.time()
        if self.not_judged():
            rec.data["not_judged"] = self.not_judged()
        if not self.dry_run:
            rec.write(self.state / "runs")

    def log_tails(self) -> dict[str, list[str]]:
        """Each rank's last log lines, by the container the last probe saw (one command per node)."""
        last = self.history[-1] if self.history else None
        ranks: dict[str, RankState] = {r.node: r for r in (last.ranks if last else ()) if r.container}
        tails = {n: LogTail(r.container or "") for n, r in ranks.items()}
        results = _run_each(self.transport, self.inventory, "read each rank's last log lines", tails)
        return {str(ranks[n].rank): tails[n].parse(res) for n, res in results.items()}

    def job_output(self, end: JobEnd) -> dict[str, list[str]]:
        """The last lines of a Slurm job's output (srun --label: every task's log and its trap's line), read
        on its batch host: {'slurm job ID': lines}, or nothing when they cannot be read."""
        host = end.batch_host
        path = end.output if end.output and "%" not in end.output else \
            output_path(slurm_job_name(self.profile.name), end.job_id)  # a Slurm that printed the pattern
        if not host or host not in self.inventory.nodes:
            return {}
        tail = query(f"read Slurm job {end.job_id}'s output", {host: f"tail -n {OUTPUT_LINES} {shlex.quote(path)}"},
                     30)
        r = run_commands(self.transport, [self.inventory.nodes[host]], tail).get(host)
        return {f"slurm job {end.job_id}": r.stdout.splitlines()} if r is not None and r.ok else {}


def _rank_dict(r: RankState) -> dict:
    return {"rank": r.rank, "node": r.node, "state": r.state, "mem_available": r.mem_available,
            "mem_guard": r.mem_guard, **({"error": r.error} if r.error else {})}


def _run_each(transport, inventory: Inventory, what: str, ops: dict[str, Op]) -> dict[str, Result]:
    """Each node's operation, run now through the executor (watch's reads)."""
    return run_commands(transport, [inventory.nodes[n] for n in ops], on(what, ops, 30))
