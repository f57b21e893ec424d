"""docs/failure-modes.md, the failure ledger: a row for every mode sparkfleet names, every test it names real,
and the header's figures the counting script's (bench/ledger.py)."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

MODE = re.compile(r"\bFM-(\d{2})\b")
# the ids the ledger keeps (the design docs' failure modes): the Sparks' FM-01..33, the Station's FM-40..70
IDS = [f"FM-{n:02d}" for n in (*range(1, 34), *range(40, 71))]


def load_module(name: str):
    """A script of bench/ as a module."""
    spec = importlib.util.spec_from_file_location(f"sparkfleet_bench_{name}", REPO / "bench" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


ledger = load_module("ledger")
TEXT = ledger.LEDGER.read_text()


def named_in(paths: list[Path]) -> dict[str, list[str]]:
    """Every FM id a file names, with where."""
    out: dict[str, list[str]] = {}
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in MODE.finditer(line):
                out.setdefault(f"FM-{m.group(1)}", []).append(f"{path.relative_to(REPO)}:{n}")
    return out


def test_the_ledger_has_one_row_per_mode_in_order() -> None:
    assert [r.id for r in ledger.rows(TEXT)] == IDS


def test_every_mode_named_in_sparkfleet_has_a_row() -> None:
    shipped = [p for d in ("sparkfleet", "profiles", "templates", "playbooks") for p in sorted((REPO / d).rglob("*"))
               if p.is_file() and p.suffix in (".py", ".yaml", ".j2", ".sh", ".md")]
    named = named_in(shipped)
    assert named, "sparkfleet names failure modes by id"
    rows = {r.id for r in ledger.rows(TEXT)}
    assert {k: v for k, v in named.items() if k not in rows} == {}


def test_every_row_holds_and_names_tests_that_exist() -> None:
    figures, problems = ledger.audit(TEXT)
    assert problems == []
    assert figures["modes"] == len(IDS) == figures["command"] + figures["unit"] + figures["none"]


def test_the_header_figures_are_the_scripts() -> None:
    figures, _ = ledger.audit(TEXT)
    assert ledger.with_header(TEXT, figures) == TEXT, "run `python3 bench/ledger.py --write`"
    assert ledger.header(figures) in TEXT


def test_every_unguarded_mode_says_why() -> None:
    for r in ledger.rows(TEXT):
        if r.kind == "none":
            assert r.guard and r.caused and not r.tests, r.id


def test_every_guarded_row_names_its_guard_and_the_guard_exists() -> None:
    """Each `command` and `unit` row names its guard (file::function, `Class.method` for a method) and the
    statement that disables it; the file exists, the function is found in it by ast, the mutation applies
    (issue 40 §5: `bench/ledger.py --mutate` runs the row's tests with it applied)."""
    checked = 0
    for r in ledger.rows(TEXT):
        if r.kind == "none":
            assert not r.mutations, f"{r.id}: an unguarded row names a guard"
            continue
        assert r.guard_error == "" and r.mutations, f"{r.id}: no `guard:` ({r.guard_error or 'none'})"
        for mut in r.mutations:
            path = REPO / mut.path
            assert path.is_file(), f"{r.id}: {mut.path} does not exist"
            if mut.function:
                assert ledger.find_function(ast.parse(path.read_text()), mut.function) is not None, \
                    f"{r.id}: no function {mut.function} in {mut.path}"
            assert ledger.check_mutations(r) == [], r.id
            checked += 1
    assert checked >= sum(1 for r in ledger.rows(TEXT) if r.kind != "none")


# -- the script itself: a row that does not hold is named ------------------------------------------------------

HEAD = "| ID | What happens | Where sparkfleet guards it | Caused by | Kind |\n|---|---|---|---|---|\n"
G = "g guard: `sparkfleet/checks/conflicts.py::check` → `return []`"  # a guard cell naming its guard
LAB_UP = "tests/test_lifecycle.py::test_a_warning_line_is_not_fatal"  # `up` on the simulated lab
UNIT = "tests/test_logs.py::test_fatal_lines"  # a parser on hand-made lines


@pytest.mark.parametrize("row, problem", [
    (f"| FM-50 | w | {G} | {LAB_UP} | command |", None),
    (f"| FM-45 | w | {G} | {UNIT} | unit |", None),
    ("| FM-64 | w | g | nothing to guard | none |", None),
    (f"| FM-50 | w | {G} | tests/test_lifecycle.py::test_no_such_test | command |",
     "names tests/test_lifecycle.py::test_no_such_test, which is not a test function"),
    (f"| FM-50 | w | {G} | tests/test_nosuch.py::test_x | unit |", "names tests/test_nosuch.py::test_x"),
    (f"| FM-45 | w | {G} | {UNIT} | command |", "kind command, but none of its tests runs the CLI"),
    (f"| FM-45 | w | {G} | the parser is tested | unit |", "kind unit names no test"),
    (f"| FM-64 | w | g | {UNIT} | none |", "kind none needs the reason it is not guarded, and names no test"),
    (f"| FM-45 | w | g | {UNIT} | maybe |", "kind 'maybe' is not one of command, unit, none"),
    (f"| FM-45 | w | g | {UNIT} | unit |", "kind unit names no `guard:`"),
    (f"| FM-45 | w | g guard: `sparkfleet/checks/nosuch.py::check` → `return []` | {UNIT} | unit |",
     "guard file sparkfleet/checks/nosuch.py does not exist"),
    (f"| FM-45 | w | g guard: `sparkfleet/checks/conflicts.py::nosuch` → `return []` | {UNIT} | unit |",
     "no function nosuch"),
    (f"| FM-45 | w | g guard: `sparkfleet/checks/conflicts.py::check` line `no such text` → `pass` | {UNIT} | unit |",
     "0 statements start with 'no such text', not one"),
    (f"| FM-45 | w | g guard: `sparkfleet/checks/conflicts.py` → `return []` | {UNIT} | unit |",
     "a .py file needs its ::function"),
    (f"| FM-45 | w | g guard: `sparkfleet/checks/conflicts.py::check` → `return (` | {UNIT} | unit |",
     "the mutated source does not parse"),
], ids=["command", "unit", "none", "missing-test", "missing-file", "unit-claimed-as-command", "unit-without-test",
        "none-with-test", "bad-kind", "no-guard", "guard-file-missing", "guard-function-missing", "guard-line-missing",
        "guard-without-function", "guard-not-python"])
def test_the_audit_names_a_row_that_does_not_hold(row: str, problem: str | None) -> None:
    figures, problems = ledger.audit(HEAD + row + "\n")
    if problem is None:
        assert problems == []
    else:
        assert problem in problems[0], problems  # (a missing test also leaves a command row without one)
        assert all(p.startswith("docs/failure-modes.md:3: FM-") for p in problems)


def test_the_audit_counts_lab_and_command_rows() -> None:
    text = HEAD + "\n".join([f"| FM-50 | w | {G} | {LAB_UP} | command |",
                             f"| FM-19 | w | {G} | tests/test_rules.py::test_plan_refuses_unservable | command |",
                             f"| FM-45 | w | {G} | {UNIT} | unit |", "| FM-64 | w | g | why | none |"]) + "\n"
    figures, problems = ledger.audit(text)
    assert problems == []
    assert figures == {"modes": 4, "command": 2, "unit": 1, "none": 1, "command_in_lab": 1}  # `plan` needs no lab


SOURCE = """class Gate:
    def check(self, x):
        \"\"\"Refuses odd x.\"\"\"
        failed = [v for v in x
                  if v % 2]
        if failed:
            raise ValueError(failed)
        return x


def lint(x):
    if x:
        yield x
"""


@pytest.mark.parametrize("mutation, changed, gone", [
    (ledger.Mutation("m.py", "Gate.check", "return x"), "    def check(self, x):\n        return x\n\n\ndef lint",
     "raise ValueError"),
    (ledger.Mutation("m.py", "Gate.check", "failed = []", "failed = [v for"), "        failed = []\n        if failed:",
     "if v % 2"),
    (ledger.Mutation("m.py", "Gate.check", "if False:", "if failed:"), "        if False:\n            raise",
     "if failed"),
    (ledger.Mutation("m.py", "lint", "yield from ()"), "def lint(x):\n    yield from ()\n", "if x:"),
    (ledger.Mutation("m.py", "lint", "return None"), "def lint(x):\n    return None\n    yield  # unreached", "if x:"),
], ids=["method-body", "statement-over-two-lines", "if-header", "generator", "generator-stays-one"])
def test_a_mutation_replaces_the_body_or_the_one_statement(mutation, changed: str, gone: str) -> None:
    out = ledger.mutate_source(SOURCE, mutation)
    assert changed in out and gone not in out, out
    ast.parse(out)


def test_a_data_files_guard_is_its_one_line() -> None:
    text = "env:\n  A: 1\n  B: 2\n"
    assert ledger.mutate_source(text, ledger.Mutation("profiles/x.yaml", "", "# A removed", "A: 1")) == \
        "env:\n  # A removed\n  B: 2\n"
    with pytest.raises(ValueError, match="0 lines start with 'C:'"):
        ledger.mutate_source(text, ledger.Mutation("profiles/x.yaml", "", "x", "C:"))


def test_a_second_row_for_a_mode_is_named() -> None:
    _, problems = ledger.audit(HEAD + "| FM-64 | w | g | why | none |\n| FM-64 | w | g | why | none |\n")
    assert problems == ["docs/failure-modes.md:4: FM-64: a second row for FM-64"]


# -- citations: shipped files point at the ledger, not at the design catalog (which is not shipped) --------------

def test_no_shipped_file_cites_the_catalog() -> None:
    cite = load_module("cite_ledger")
    read = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # what a user reads cites the ledger too
    found = [f"{p.relative_to(REPO)}:{n}" for p in cite.shipped() + read
             if p.suffix in (".py", ".yaml", ".j2", ".sh", ".md")
             for n, line in enumerate(p.read_text().splitlines(), 1) if "CATALOG" in line]
    assert found == [], "run `python3 bench/cite_ledger.py`"


def test_the_citation_rewrite_is_done_and_idempotent() -> None:
    cite = load_module("cite_ledger")
    assert cite.main(["--check"]) == 0
    c = "CATA" "LOG"  # spelt in two so that the rewrite, which runs over tests/ too, leaves this line alone
    once = cite.rewrite(f"x ({c} LCH-10, FM-02) y ({c} §5.3). z {c} INV-13 / HLT-24: w")
    assert once == "x (docs/failure-modes.md FM-02; LCH-10) y. z INV-13 / HLT-24: w"
    assert cite.rewrite(once) == once
