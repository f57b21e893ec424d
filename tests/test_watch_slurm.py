"""watch and a Slurm lane without a lab: how the job of the watched run ended (squeue --states=all, then
scontrol), what that end means once every rank's container is gone (a failure to restart, or a `down`), and
and the command a user runs accepting a Slurm lane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkfleet.cli.main import main
from sparkfleet.fleet.transport import Result
from sparkfleet.opsdir import Spec
from sparkfleet.runner.events import Events
from sparkfleet.slurm.ops import CONTROLLER, JOB_FORMAT
from sparkfleet.watch import supervisor
from sparkfleet.watch.policy import Settings
from sparkfleet.watch.slurmjob import JobEnd, SlurmUnanswered, classify, read_end
from sparkfleet.watch.supervisor import StandDown, Watcher
from tests.test_slurm_launch import rec  # noqa: F401 - the recording inventory with launcher: slurm

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)


@pytest.fixture
def inv(rec):  # noqa: F811 - the fixture imported above
    return Spec(rec[0]).inventory("rec")


SQUEUE = f"squeue -h --name=sparkfleet-dcp2 --states=all -o '{JOB_FORMAT}'"


def _line(jid: str, state: str, comment: str, name: str = "sparkfleet-dcp2") -> str:
    return f"{jid}|{name}|{state}|None|reddie,asusi|1:02|{comment}"


def _drive(gen, answers: list[tuple[str, str | Result]]) -> tuple[object, list[str]]:
    """Drive a controller-side OpGen: each command gets the next (expected command prefix, stdout)."""
    seen: list[str] = []
    reply = None
    try:
        while True:
            op = gen.send(reply)
            cmd = op.commands[CONTROLLER]
            seen.append(cmd)
            want, stdout = answers.pop(0)
            assert cmd.startswith(want), cmd
            # a Result as the answer: the command failed as it says
            reply = {CONTROLLER: stdout if isinstance(stdout, Result) else Result(CONTROLLER, True, stdout, "", 0)}
    except StopIteration as done:
        return done.value, seen


SHOW = ("JobId=12 JobName=sparkfleet-dcp2 JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 "
        "BatchHost=reddie StdOut=/tmp/sparkfleet-dcp2-12.out")


def test_the_job_is_waited_for_until_it_ended_and_read_with_scontrol(inv) -> None:
    """Job 12 of run R1 is still completing, then FAILED; look-alikes without the label, or carrying another
    run's, are not the watched run's job (only name + the run label select it)."""
    lookalikes = [_line("13", "RUNNING", "someone else's"), _line("14", "RUNNING", "sparkfleet.run=R9")]
    end, seen = _drive(read_end(inv, "dcp2", {"R1"}, poll_s=0), [
        (SQUEUE, "\n".join([_line("12", "COMPLETING", "sparkfleet.run=R1"), *lookalikes]) + "\n"),
        (SQUEUE, "\n".join([_line("12", "FAILED", "sparkfleet.run=R1"), *lookalikes]) + "\n"),
        ("scontrol -o show job 12", SHOW + "\n")])
    assert seen == [SQUEUE, SQUEUE, "scontrol -o show job 12"]
    assert end == JobEnd("12", "FAILED", "R1", "1:0", "NonZeroExitCode", "reddie", "/tmp/sparkfleet-dcp2-12.out")
    assert end.said() == "Slurm job 12 FAILED, exit code 1:0, reason NonZeroExitCode"


def test_a_heterogeneous_job_ends_when_every_component_did_and_the_newest_job_counts(inv) -> None:
    end, _ = _drive(read_end(inv, "dcp2", {"R1", "R2"}, poll_s=0), [
        (SQUEUE, "\n".join([_line("7+0", "CANCELLED", "sparkfleet.run=R1"), _line("9+0", "FAILED", "sparkfleet.run=R2"),
                            _line("9+1", "COMPLETING", "sparkfleet.run=R2")]) + "\n"),
        (SQUEUE, "\n".join([_line("9+0", "FAILED", "sparkfleet.run=R2"), _line("9+1", "FAILED", "sparkfleet.run=R2")])),
        ("scontrol -o show job 9", "JobId=9 HetJobId=9 HetJobOffset=0 JobState=FAILED ExitCode=0:0\n"
                                   "JobId=10 HetJobId=9 HetJobOffset=1 JobState=FAILED ExitCode=143:0\n")])
    assert (end.job_id, end.state, end.run_id, end.exit_code) == ("9", "FAILED", "R2", "0:0")


def test_no_job_of_the_watched_run_is_none(inv) -> None:
    end, seen = _drive(read_end(inv, "dcp2", {"R1"}, poll_s=0),
                       [(SQUEUE, _line("13", "RUNNING", "someone else's") + "\n")])
    assert end is None and seen == [SQUEUE]


def test_a_job_still_running_past_the_bound_is_reported_as_it_stands(inv) -> None:
    end, seen = _drive(read_end(inv, "dcp2", {"R1"}, bound_s=0, poll_s=0), [
        (SQUEUE, _line("12", "RUNNING", "sparkfleet.run=R1")),
        ("scontrol -o show job 12", "JobId=12 JobState=RUNNING ExitCode=0:0\n")])
    assert end.state == "RUNNING" and classify(end) == "unknown"


DOWN = Result(CONTROLLER, False, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)", 1)


def test_a_squeue_that_fails_is_slurm_unanswered_not_no_job(inv) -> None:
    """Issue 39: a failed squeue read as "Slurm lists no such job" (None), the same as a job that did not fail."""
    with pytest.raises(SlurmUnanswered) as exc:
        _drive(read_end(inv, "dcp2", {"R1"}, poll_s=0), [(SQUEUE, DOWN)])
    assert str(exc.value) == "squeue: slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def test_a_scontrol_that_fails_is_slurm_unanswered(inv) -> None:
    with pytest.raises(SlurmUnanswered) as exc:
        _drive(read_end(inv, "dcp2", {"R1"}, poll_s=0), [
            (SQUEUE, _line("12", "FAILED", "sparkfleet.run=R1")), ("scontrol -o show job 12", DOWN)])
    assert str(exc.value) == ("scontrol -o show job 12: slurm_load_jobs error: Unable to contact slurm controller "
                              "(connect failure)")


@pytest.mark.parametrize(("state", "run", "kind"), [
    ("FAILED", "R1", "failed"), ("NODE_FAIL", "R1", "failed"), ("TIMEOUT", "R1", "failed"),
    ("CANCELLED", "R1", "cancelled"),
    ("CANCELLED", "R2", "failed"),  # watch's own failed restart: its `up` cancelled its job itself
    ("RUNNING", "R1", "unknown"), ("COMPLETING", "R1", "unknown")])
def test_what_the_end_means(state: str, run: str, kind: str) -> None:
    assert classify(JobEnd("12", state, run), {"R2"}) == kind
    assert classify(None) == "unknown"


def test_a_job_watchs_own_stop_step_cancelled_is_not_the_operators() -> None:
    """A restart's stop cancelled job 12, then the restart failed before it submitted one of its own."""
    assert classify(JobEnd("12", "CANCELLED", "R1"), set(), {"12"}) == "failed"
    assert classify(JobEnd("13", "CANCELLED", "R1"), set(), {"12"}) == "cancelled"


class _Quiet(Events):
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []

    def emit(self, event: str, **data) -> None:
        self.seen.append((event, data))


def _watcher(ops: Path, tmp_path: Path) -> Watcher:
    spec = Spec(ops)
    w = Watcher(spec, spec.profile("dcp2"), spec.inventory("rec"), Settings(), _Quiet(), tmp_path / "state")
    w.transport = None  # set by run(); the nodes' answers come from _every_container_gone
    return w


def _every_container_gone(monkeypatch, end: JobEnd | None, left: str = "") -> list[set[str]]:
    """The nodes answer with no lock and no container of the lane (but on reddie `left`, an id, when given);
    Slurm says `end` for the runs asked."""
    from sparkfleet.fleet.ops.lock import LOOK_SEP

    asked: list[set[str]] = []
    monkeypatch.setattr(supervisor, "_run_each", lambda t, inv, what, ops: {
        n: Result(n, True, f"{LOOK_SEP}\n" + (f"{left}\n" if left and n == "reddie" else ""), "", 0) for n in ops})

    monkeypatch.setattr(supervisor, "read_end", lambda inv, profile, runs, **kw: asked.append(set(runs)))
    monkeypatch.setattr(supervisor, "drive_here", lambda inv, gen: end)
    return asked


def test_every_rank_gone_with_a_failed_job_is_a_failure_to_restart(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    w = _watcher(rec[0], tmp_path)
    w.known_runs = {"R1"}
    end = JobEnd("12", "FAILED", "R1", "1:0")
    asked = _every_container_gone(monkeypatch, end)
    w.look_again(removed=True)
    assert w.job_end == end and asked == [{"R1"}]


def test_every_rank_gone_with_a_cancelled_job_is_the_operators(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    w = _watcher(rec[0], tmp_path)
    w.known_runs = {"R1"}
    _every_container_gone(monkeypatch, JobEnd("12", "CANCELLED", "R1", "0:15"))
    with pytest.raises(StandDown, match=r"^Slurm job 12 CANCELLED, exit code 0:15: scancel ended the lane's job"):
        w.look_again(removed=True)
    assert w.job_end is None


def test_every_rank_gone_and_slurm_without_the_job_is_a_removal(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    w = _watcher(rec[0], tmp_path)
    w.known_runs = {"R1"}
    _every_container_gone(monkeypatch, None)
    with pytest.raises(StandDown, match="every rank's container was removed .*; Slurm no longer lists a job of the "
                                        "lane carrying its run label"):
        w.look_again(removed=True)


def test_a_failed_restarts_own_cancelled_job_is_not_the_operators(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    w = _watcher(rec[0], tmp_path)
    w.known_runs, w.failed_restarts = {"R1"}, {"R2"}
    asked = _every_container_gone(monkeypatch, JobEnd("15", "CANCELLED", "R2"))
    w.look_again()
    assert w.job_end is not None and w.job_end.job_id == "15" and asked == [{"R1", "R2"}]


def test_a_rank_gone_while_slurm_cancels_the_job_is_the_operators(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    """A probe caught one rank gone while an admin's scancel was still ending the job: Slurm decides, not the
    containers the traps had yet to remove."""
    w = _watcher(rec[0], tmp_path)
    w.known_runs = {"R1"}
    _every_container_gone(monkeypatch, JobEnd("12", "CANCELLED", "R1"), left="c0")
    with pytest.raises(StandDown, match=r"^Slurm job 12 CANCELLED: scancel ended"):
        w.look_again()


def test_a_rank_gone_and_slurm_unable_to_say_is_restarted(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    w = _watcher(rec[0], tmp_path)
    w.known_runs = {"R1"}
    _every_container_gone(monkeypatch, None, left="c0")
    w.look_again()  # a rank gone, the others still there: a failure, as for an SSH lane (the restart's stop
    assert w.job_end is None  # cancels whatever is left of the lane's job)


UNASKED = ("could not ask Slurm: squeue: slurm_load_jobs error: Unable to contact slurm controller (connect "
           "failure)")


def _slurm_unanswered(monkeypatch) -> None:
    """squeue fails on the controller: read_end raises, as it does on a DOWN answer (tested above)."""
    def drive(inv, gen):
        raise SlurmUnanswered(f"squeue: {DOWN.stderr}")
    monkeypatch.setattr(supervisor, "drive_here", drive)


def test_every_rank_gone_and_slurm_unanswered_is_said_and_recorded(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    """Issue 39: watch stood down saying Slurm no longer lists the job when it could not ask at all. It says
    "could not ask Slurm: <error>" now, in its output and in the incident's record."""
    from sparkfleet.runner.record import read_record
    from sparkfleet.watch.policy import Verdict

    w = _watcher(rec[0], tmp_path)
    w.known_runs = {"R1"}
    _every_container_gone(monkeypatch, None)
    _slurm_unanswered(monkeypatch)
    with pytest.raises(StandDown) as exc:
        w.handle(Verdict("restart", "rank-vanished", "rank 0's container on reddie is gone", "reddie"), {})
    why = ("every rank's container was removed (a `down` of the lane, here or by another controller): the operator "
           f"has the lane; {UNASKED}")
    assert str(exc.value) == why
    said = [d["text"] for e, d in w.events.seen if e == "watch.not-judged"]
    assert said == [f"{UNASKED}; how the lane's job ended is not known"]
    (path,) = (tmp_path / "state" / "runs").glob("*.json")
    doc = read_record(json.loads(path.read_text()))
    assert (doc.outcome, doc.data.not_judged, doc.data.stand_down.why) == ("stood-down", [UNASKED], why)


def test_a_rank_gone_and_slurm_unanswered_is_restarted_saying_so(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    w = _watcher(rec[0], tmp_path)
    w.known_runs = {"R1"}
    _every_container_gone(monkeypatch, None, left="c0")
    _slurm_unanswered(monkeypatch)
    w.look_again()  # a rank gone, the others still there: a failure to restart, as when Slurm cannot say
    assert w.job_end is None and w.not_judged() == [UNASKED]


def test_watch_takes_a_slurm_lane(rec, capsys) -> None:  # noqa: F811
    ops, log = rec
    assert main(["watch", "--profile", "dcp2", "--root", str(ops), "-i", "rec", "--unit"]) == 0
    assert "ExecStart=" in capsys.readouterr().out
    assert not log.exists()


def test_the_jobs_watchs_own_playbooks_cancelled_are_remembered(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    from sparkfleet.runner.context import RunOptions
    from sparkfleet.runner.record import Record

    w = _watcher(rec[0], tmp_path)
    w.prober = type("P", (), {"invalidate": lambda self: None})()
    done = Record("R2", "up", "dcp2", "rec", "sparkfleet watch dcp2")
    done.steps = [{"step": "stop", "status": "ok", "summary": "cancelled Slurm job 12; ...",
                   "data": {"slurm_jobs_cancelled": ["12"]}}, {"step": "launch:workers", "status": "fail"}]
    monkeypatch.setattr(supervisor, "execute", lambda *a, **kw: done)
    assert w.run_playbook("up", "restart (probe-failed)", RunOptions()) is done
    assert w.cancelled_jobs == {"12"} and "R2" in w.ours


def test_an_incident_with_the_jobs_end_is_a_valid_run_record(tmp_path) -> None:
    from sparkfleet.runner.record import Record

    incident = Record("20261205-001500-cccccc", "watch", "dcp2", "sim", "sparkfleet watch --profile dcp2")
    end = JobEnd("12", "FAILED", "R1", "1:0", "NonZeroExitCode", "asusi", "/tmp/sparkfleet-dcp2-12.out")
    incident.data["slurm_job"] = end.as_record("dcp2")
    incident.data["last_log_lines"] = {"slurm job 12": ["srun: error: asusi: task 0: Exited with exit code 3"]}
    incident.outcome = "ok"
    doc = json.loads(incident.write(tmp_path).read_text())
    assert doc["data"]["slurm_job"] == {"job_id": "12", "name": "sparkfleet-dcp2", "comment": "sparkfleet.run=R1",
                                        "state": "FAILED", "exit_code": "1:0", "reason": "NonZeroExitCode",
                                        "batch_host": "asusi", "output": "/tmp/sparkfleet-dcp2-12.out"}
