"""Count the failure ledger (docs/failure-modes.md): how each mode is caused, from its row and the tests it names.

Each row of the ledger is `| FM-NN | what happens | where sparkfleet guards it | caused by | kind |`, kind one of:

  command  a test runs the command a user runs (`sparkfleet up`, `check`, `restore`, `watch`, `bench` ...: the
           CLI's `main`, in the test's process or its own) and the mode happens there; `lab` when that test
           also brings up the simulated lab
  unit     tests cause it only on hand-made input (a function called with built facts, a fake engine)
  none     sparkfleet does not guard it; the row says why

The kind is checked against the tests the row names (file::function, which must exist): a `command` row
must name at least one test that reaches the CLI. The figures between the ledger's `ledger-figures`
markers are this script's output; `--write` puts them there, tests/test_failure_ledger.py checks them.

    python3 bench/ledger.py            # the figures, and any row that does not hold
    python3 bench/ledger.py --write    # rewrite the ledger's header figures
    python3 bench/ledger.py --json
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LEDGER = REPO / "docs" / "failure-modes.md"
KINDS = ("command", "unit", "none")
ROW = re.compile(r"^\|\s*(FM-\d{2})\s*\|(.*)\|\s*$")
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
BEGIN, END = "<!-- ledger-figures -->", "<!-- /ledger-figures -->"
# what starts the user's command: the CLI's entry point, called in the test's process or run as a process
CLI_CALL = "main"
CLI_MODULE = "sparkfleet.cli.main"
# what brings up the simulated lab, in a fixture or the test itself
LAB_CALLS = ("sim_lab", "lab.up", "SshLab")


@dataclass
class Row:
    id: str
    what: str
    guard: str
    caused: str
    kind: str
    line: int
    tests: list[str] = field(default_factory=list)  # file::function


@dataclass
class TestInfo:
    exists: bool
    command: bool = False  # reaches the CLI
    lab: bool = False  # uses a fixture that brings up the simulated lab


def rows(text: str) -> list[Row]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        m = ROW.match(line)
        if not m:
            continue
        cells = [c.strip() for c in m.group(2).split("|")]
        if len(cells) != 4:
            raise ValueError(f"docs/failure-modes.md:{n}: {m.group(1)}: expected 5 cells (id, what, guard, "
                             f"caused by, kind), got {len(cells) + 1}")
        what, guard, caused, kind = cells
        kind = kind.strip("`*")
        out.append(Row(m.group(1), what, guard, caused, kind, n,
                       [f"{f}::{fn}" for f, fn in TEST_REF.findall(caused)]))
    return out


# -- what a named test does, read from its source -------------------------------------------------------------

def is_fixture(decorator: ast.expr) -> bool:
    """`@pytest.fixture`, `@pytest.fixture(...)` or `@fixture`."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) in ("pytest.fixture", "fixture")


class Module:
    """One test module's top-level functions, classes and fixtures, and the names it imports from tests.*."""

    def __init__(self, path: Path):
        self.path = path
        tree = ast.parse(path.read_text())
        self.defs: dict[str, ast.AST] = {}
        self.fixtures: set[str] = set()
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (tests module path, name there)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.defs[node.name] = node
                if any(is_fixture(d) for d in getattr(node, "decorator_list", [])):
                    self.fixtures.add(node.name)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests."):
                src = REPO / (node.module.replace(".", "/") + ".py")
                for a in node.names:
                    self.imports[a.asname or a.name] = (str(src), a.name)


class Tests:
    def __init__(self, root: Path = REPO):
        self.root = root
        self.modules: dict[str, Module] = {}

    def module(self, path: str | Path) -> Module | None:
        p = Path(path) if Path(path).is_absolute() else self.root / path
        key = str(p)
        if key not in self.modules:
            if not p.is_file():
                return None
            self.modules[key] = Module(p)
        return self.modules[key]

    def _resolve(self, mod: Module, name: str) -> tuple[Module, ast.AST] | None:
        if name in mod.defs:
            return mod, mod.defs[name]
        if name in mod.imports:
            path, there = mod.imports[name]
            other = self.module(path)
            if other is not None and there in other.defs:
                return other, other.defs[there]
        return None

    def reaches_cli(self, mod: Module, node: ast.AST, seen: set[int] | None = None) -> bool:
        """The code calls the CLI's main, runs it as a process, or calls a tests helper that does."""
        seen = seen if seen is not None else set()
        if id(node) in seen:
            return False
        seen.add(id(node))
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and sub.value == CLI_MODULE:
                return True
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
                if sub.func.id == CLI_CALL:
                    return True
                got = self._resolve(mod, sub.func.id)
                if got and self.reaches_cli(got[0], got[1], seen):
                    return True
        return False

    def lab_fixture(self, mod: Module, name: str, seen: set[str] | None = None) -> bool:
        """A fixture (of the module or tests/conftest.py) that brings up the simulated lab, or takes one."""
        seen = seen if seen is not None else set()
        if name in seen:
            return False
        seen.add(name)
        for where in (mod, self.module("tests/conftest.py")):
            if where is None or name not in where.fixtures:
                continue
            fn = where.defs[name]
            if any(call in ast.unparse(fn) for call in LAB_CALLS):
                return True
            return any(self.lab_fixture(where, a.arg, seen) for a in fn.args.args)  # type: ignore[attr-defined]
        return False

    def info(self, ref: str) -> TestInfo:
        path, name = ref.split("::")
        mod = self.module(path)
        if mod is None or name not in mod.defs or name in mod.fixtures or not name.startswith("test_"):
            return TestInfo(False)
        fn = mod.defs[name]
        args = [a.arg for a in fn.args.args]  # type: ignore[attr-defined]
        lab = any(call in ast.unparse(fn) for call in LAB_CALLS) or any(self.lab_fixture(mod, a) for a in args)
        return TestInfo(True, self.reaches_cli(mod, fn), lab)


# -- the figures ---------------------------------------------------------------------------------------------

def audit(text: str, tests: Tests | None = None) -> tuple[dict, list[str]]:
    """(the figures, the problems: a row whose kind its tests do not bear out, a test that does not exist)."""
    tests = tests or Tests()
    problems: list[str] = []
    found = rows(text)
    counts = {k: 0 for k in KINDS}
    lab = 0
    seen: set[str] = set()
    for r in found:
        where = f"docs/failure-modes.md:{r.line}: {r.id}"
        if r.id in seen:
            problems.append(f"{where}: a second row for {r.id}")
        seen.add(r.id)
        if r.kind not in KINDS:
            problems.append(f"{where}: kind {r.kind!r} is not one of {', '.join(KINDS)}")
            continue
        infos = {t: tests.info(t) for t in r.tests}
        for t, i in infos.items():
            if not i.exists:
                problems.append(f"{where}: names {t}, which is not a test function")
        if r.kind == "none":
            if r.tests or not r.caused:
                problems.append(f"{where}: kind none needs the reason it is not guarded, and names no test")
        elif not r.tests:
            problems.append(f"{where}: kind {r.kind} names no test")
        elif r.kind == "command" and not any(i.command for i in infos.values()):
            problems.append(f"{where}: kind command, but none of its tests runs the CLI")
        counts[r.kind] += 1
        if r.kind == "command" and any(i.command and i.lab for i in infos.values()):
            lab += 1
    figures = {"modes": len(found), **counts, "command_in_lab": lab}
    return figures, problems


def header(f: dict) -> str:
    return (f"Of the {f['modes']} failure modes, **{f['command']}** are caused by a test through the command a "
            f"user runs ({f['command_in_lab']} of them on the simulated lab), **{f['unit']}** only by unit tests "
            f"on hand-made input, and **{f['none']}** are not guarded by sparkfleet (each row says why).")


def with_header(text: str, f: dict) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + header(f) + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the figures in the ledger's header")
    ap.add_argument("--json", action="store_true", help="the figures and problems as JSON")
    args = ap.parse_args(argv)
    text = LEDGER.read_text()
    figures, problems = audit(text)
    if args.write:
        LEDGER.write_text(with_header(text, figures))
    if args.json:
        print(json.dumps({"figures": figures, "problems": problems}, indent=2))
    else:
        print(header(figures))
        for p in problems:
            print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
