"""One table of step names (sparkfleet/schema/playbook.py STEPS), each bound to exactly one implementation
(sparkfleet/runner/steps/__init__.py): a name without an implementation, or an implementation without a
name, is refused. And `record`, which every shipped playbook ends with, says what it does."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkfleet.runner.context import RunOptions
from sparkfleet.runner.ops import StepResult
from sparkfleet.runner.record import Record
from sparkfleet.runner.steps import IMPLEMENTATIONS, STEPS, StepTableError, bind, finish
from sparkfleet.schema import playbook
from sparkfleet.schema.playbook import Step

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent


def test_the_runner_binds_every_schema_name_in_the_schemas_order() -> None:
    assert list(STEPS) == list(playbook.STEPS)
    assert all(fn.__name__ == name for name, fn in STEPS.items())
    assert len(IMPLEMENTATIONS) == len(playbook.STEPS)


def test_a_name_without_an_implementation_is_refused() -> None:
    with pytest.raises(StepTableError, match=r"named but not implemented: reboot$"):
        bind([*playbook.STEPS, "reboot"], IMPLEMENTATIONS)


def test_an_implementation_without_a_name_is_refused() -> None:
    def reboot(ctx, st) -> StepResult:
        return StepResult("ok", "rebooted")

    with pytest.raises(StepTableError, match=r"implemented but not named: tests\.test_step_table\.reboot$"):
        bind(playbook.STEPS, [*IMPLEMENTATIONS, reboot])
    without_record = [fn for fn in IMPLEMENTATIONS if fn.__name__ != "record"]
    with pytest.raises(StepTableError, match=r"named but not implemented: record$"):
        bind(playbook.STEPS, without_record)


def test_one_name_implemented_twice_is_refused() -> None:
    def stop(ctx, st) -> StepResult:
        return StepResult("ok", "")

    with pytest.raises(StepTableError, match=r"step 'stop' is implemented twice"):
        bind(playbook.STEPS, [*IMPLEMENTATIONS, stop])


def test_every_shipped_playbook_names_only_known_steps_and_ends_with_record() -> None:
    import yaml

    for path in sorted((REPO / "playbooks").glob("*.yaml")):
        book = playbook.Playbook.model_validate(yaml.safe_load(path.read_text()))
        assert all(st.step in STEPS for st in book.steps), path.name
        assert book.steps[-1].step == "record", path.name


@pytest.mark.parametrize("dry_run", [False, True])
def test_record_says_the_runner_writes_the_record_as_the_run_ends(dry_run: bool) -> None:
    ctx = SimpleNamespace(options=RunOptions(dry_run=dry_run),
                          record=Record("run-1", "up", "dcp2", "lab", "sparkfleet up"))
    result = finish.record(ctx, Step(step="record"))
    assert (result.status, result.summary) == ("ok", "run run-1: a dry run writes no record" if dry_run else
                                               "run run-1: the record is written as the run ends")
