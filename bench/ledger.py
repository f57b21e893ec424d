"""Count the failure ledger (docs/failure-modes.md): how each mode is caused, from its row and the tests it names.

Each row of the ledger is `| FM-NN | what happens | where sparkfleet guards it | caused by | kind |`, kind one of:

  command  a test runs the command a user runs (`sparkfleet up`, `check`, `restore`, `watch`, `bench` ...: the
           CLI's `main`, in the test's process or its own) and the mode happens there; `lab` when that test
           also brings up the simulated lab
  unit     tests cause it only on hand-made input (a function called with built facts, a fake engine)
  none     sparkfleet does not guard it; the row says why

The kind is checked against the tests the row names (file::function, which must exist): a `command` row
must name at least one test that reaches the CLI; a `command` or `unit` row must name its guard (below),
whose file and function must exist and whose mutation must apply. The figures between the ledger's `ledger-figures`
markers are this script's output; `--write` puts them there, tests/test_failure_ledger.py checks them.

A `command` or `unit` row names its guard at the end of its guard cell, with how to disable it:

    guard: `sparkfleet/checks/conflicts.py::check` → `return []`
    guard: `sparkfleet/runner/gates_step.py::gates_step` line `failed = [` → `failed = []`

the first replaces the function's (or `Class.method`'s) whole body by the one statement (a generator's is
followed by a `yield` never reached, so that it stays a generator for its callers); the second replaces
the one statement of the function whose first line starts with the quoted text (for an `if`/`for`/`while`/
`with`, its header only: `if False:`). Several mutations, applied together, are separated by `;`.
`--mutate` applies each selected row's mutations in a scratch worktree of HEAD and runs the row's tests
there: the row counts only when they fail with its guard disabled (a bench, not run by `make test`).

    python3 bench/ledger.py            # the figures, and any row that does not hold
    python3 bench/ledger.py --write    # rewrite the ledger's header figures
    python3 bench/ledger.py --json
    python3 bench/ledger.py --mutate [--rows FM-01,FM-26] [--out FILE]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LEDGER = REPO / "docs" / "failure-modes.md"
KINDS = ("command", "unit", "none")
ROW = re.compile(r"^\|\s*(FM-\d{2})\s*\|(.*)\|\s*$")
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
BEGIN, END = "<!-- ledger-figures -->", "<!-- /ledger-figures -->"
# the guard: `file::function` (or `Class.method`), optionally `line `first text``, → `one statement`
GUARD_AT = re.compile(r"\bguard:\s*(.*)$")
MUTATION = re.compile(r"`((?:sparkfleet|profiles|playbooks|templates)/[\w/.-]+?)(?:::([\w.]+))?`"
                      r"(?:\s+line\s+`([^`]+)`)?\s*(?:→|->)\s*`([^`]+)`")
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
    mutations: list[Mutation] = field(default_factory=list)
    guard_error: str = ""  # a `guard:` that does not parse


@dataclass
class Mutation:
    path: str  # sparkfleet/...py (or a data file: profiles/...yaml), relative to the repository
    function: str  # name, or Class.method; empty for a data file
    replacement: str  # one statement
    line: str = ""  # the first text of the statement replaced; empty: the whole body

    def __str__(self) -> str:
        at = f" line `{self.line}`" if self.line else ""
        return f"{self.path}{'::' + self.function if self.function else ''}{at} → {self.replacement}"


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
        row = Row(m.group(1), what, guard, caused, kind, n, [f"{f}::{fn}" for f, fn in TEST_REF.findall(caused)])
        row.mutations, row.guard_error = guards(guard)
        out.append(row)
    return out


def guards(cell: str) -> tuple[list[Mutation], str]:
    """The mutations a guard cell's `guard:` names (none when it has no `guard:`), and what does not parse."""
    m = GUARD_AT.search(cell)
    if not m:
        return [], ""
    parts = [p.strip() for p in m.group(1).split(";") if p.strip()]
    out = []
    for part in parts:
        g = MUTATION.fullmatch(part)
        if not g:
            return out, f"`guard:` part {part!r} is not `file::function` [line `text`] → `statement`"
        path, fn, line, new = g.group(1), g.group(2) or "", g.group(3) or "", g.group(4)
        if path.endswith(".py") != bool(fn):
            return out, f"`guard:` part {part!r}: a .py file needs its ::function, a data file takes none"
        if not fn and not line:
            return out, f"`guard:` part {part!r}: a data file's guard is a line (`line `text` → `new``)"
        out.append(Mutation(path, fn, new, line))
    if not out:
        return out, "`guard:` names nothing"
    return out, ""


# -- a guard disabled: the source with one function's body, or one statement, replaced ------------------------

def find_function(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """A module-level function, or `Class.method` (nested classes too)."""
    body: list[ast.stmt] = tree.body
    *outer, name = qualname.split(".")
    for cls in outer:
        found = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if found is None:
            return None
        body = found.body
    return next((n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name), None)


def is_generator(node: ast.AST) -> bool:
    """A yield in the function's own body (not in a function or class nested in it)."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Yield | ast.YieldFrom):
            return True
        if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(n))
    return False


def mutate_source(source: str, mut: Mutation) -> str:
    """The source with the mutation applied; ValueError saying why when it does not apply."""
    if not mut.function:  # a data file: the one line that starts with the text, its indent kept
        lines = source.splitlines(keepends=True)
        hits = [n for n, x in enumerate(lines) if x.strip().startswith(mut.line)]
        if len(hits) != 1:
            raise ValueError(f"{mut.path}: {len(hits)} lines start with {mut.line!r}, not one")
        x = lines[hits[0]]
        lines[hits[0]] = x[: len(x) - len(x.lstrip())] + mut.replacement + "\n"
        return "".join(lines)
    tree = ast.parse(source)
    fn = find_function(tree, mut.function)
    if fn is None:
        raise ValueError(f"{mut.path}: no function {mut.function}")
    lines = source.splitlines(keepends=True)
    replacement = mut.replacement
    if not mut.line:
        first, last = fn.body[0].lineno, fn.body[-1].end_lineno or fn.body[-1].lineno
        if first == fn.lineno:
            raise ValueError(f"{mut.path}::{mut.function}: its body is on the def's line")
        indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
        if is_generator(fn) and not is_generator(ast.parse(mut.replacement)):
            # a generator stays one (its callers `yield from` it): the statement, then a yield never reached
            replacement = f"{mut.replacement}\n{indent}yield  # unreached: keeps it a generator"
    else:
        hits = [s for s in ast.walk(fn) if isinstance(s, ast.stmt) and s is not fn
                and lines[s.lineno - 1].strip().startswith(mut.line)]
        if len(hits) != 1:
            raise ValueError(f"{mut.path}::{mut.function}: {len(hits)} statements start with {mut.line!r}, not one")
        st = hits[0]
        first = st.lineno
        inner = getattr(st, "body", None)
        if isinstance(inner, list) and inner:  # a compound statement: its header only
            last = inner[0].lineno - 1
            if last < first:
                raise ValueError(f"{mut.path}::{mut.function}: {mut.line!r} has its body on its header's line")
        else:
            last = st.end_lineno or st.lineno
        indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
    out = "".join([*lines[: first - 1], indent + replacement + "\n", *lines[last:]])
    try:
        ast.parse(out)
    except SyntaxError as exc:
        raise ValueError(f"{mut.path}::{mut.function}: the mutated source does not parse: {exc}") from exc
    return out


def check_mutations(row: Row, root: Path = REPO) -> list[str]:
    """What does not hold in a row's guard: a file or function that does not exist, a mutation that does not
    apply (applied to a copy of the text, nothing written)."""
    problems = [row.guard_error] if row.guard_error else []
    for mut in row.mutations:
        path = root / mut.path
        if not path.is_file():
            problems.append(f"guard file {mut.path} does not exist")
            continue
        try:
            mutate_source(path.read_text(), mut)
        except ValueError as exc:
            problems.append(f"guard {mut}: {exc}")
    return problems


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
        if r.kind != "none":
            if not r.mutations and not r.guard_error:
                problems.append(f"{where}: kind {r.kind} names no `guard:` (file::function → the statement that "
                                "disables it)")
            problems += [f"{where}: {p}" for p in check_mutations(r, tests.root)]
        counts[r.kind] += 1
        if r.kind == "command" and any(i.command and i.lab for i in infos.values()):
            lab += 1
    figures = {"modes": len(found), **counts, "command_in_lab": lab}
    return figures, problems


# -- --mutate: each row's guard disabled in a scratch copy of HEAD, the row's tests run there -------------------

PYTHON = REPO / ".venv" / "bin" / "python"
LAB_LOCK = "/tmp/sparkfleet-lab.lock"  # one lab per machine: every lab test runs under it


def unit_only(tests: Tests, refs: list[str]) -> bool:
    """Every test is in a module marked `unit` (no lab), so the run need not take the lab's lock."""
    for ref in refs:
        mod = tests.module(ref.split("::")[0])
        text = mod.path.read_text() if mod else ""
        if not re.search(r"^pytestmark\s*=\s*pytest\.mark\.unit\b", text, re.M):
            return False
    return True


@dataclass
class MutationResult:
    row: str
    guard: str
    tests: list[str]
    result: str  # caught | NOT caught | mutation did not apply | no guard | timed out | error
    seconds: float  # the scratch copy, the mutation and the tests, waits for the lab's lock included
    detail: str = ""  # the end of pytest's output
    failed: str = ""  # the test that failed first (pytest's FAILED line), when caught


def pytest_in(copy: Path, refs: list[str], lock: bool, timeout_s: float) -> tuple[int | None, str]:
    """The tests run in the copy (its sparkfleet and tests first on the path): pytest's exit code, None when it ran
    past timeout_s (its process group killed), and its output."""
    cmd = [str(PYTHON), "-m", "pytest", *refs, "-x", "-q", "-p", "no:cacheprovider"]
    if lock:
        cmd = ["flock", LAB_LOCK, *cmd]
    env = {**os.environ, "PYTHONPATH": str(copy)}
    proc = subprocess.Popen(cmd, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except BaseException as exc:  # past its time, or interrupted: its tests (and any lab they brought up) go too
        # SIGINT first: pytest stops as on Ctrl-C and runs its fixtures' teardown, which takes the lab down
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        return None, out


def run_row(row: Row, tests: Tests, timeout_s: float = 900.0, keep_output: int = 1500) -> MutationResult:
    """The row's guard disabled in a scratch worktree of HEAD (removed after), then its tests: those in `unit`
    modules first without the lab's lock, then (unless they already failed) the others under it."""
    guard = "; ".join(str(m) for m in row.mutations)
    unit = [t for t in row.tests if unit_only(tests, [t])]
    lab = [t for t in row.tests if t not in unit]
    order = unit + lab
    if not row.mutations:
        return MutationResult(row.id, "-", order, "no guard", 0.0, row.guard_error)
    start = time.monotonic()
    copy = Path(tempfile.mkdtemp(prefix="ledger-mut-", dir="/tmp"))
    copy.rmdir()
    for _attempt in range(3):  # another git command on the repository may hold its lock a moment
        added = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(copy), "HEAD"],
                               capture_output=True, text=True)
        if added.returncode == 0:
            break
        time.sleep(2)
    else:
        return MutationResult(row.id, guard, order, "no scratch copy", time.monotonic() - start, added.stderr)
    try:
        for mut in row.mutations:
            path = copy / mut.path
            try:
                path.write_text(mutate_source(path.read_text(), mut))
            except (ValueError, OSError) as exc:
                return MutationResult(row.id, guard, order, "mutation did not apply", time.monotonic() - start,
                                      str(exc))
        code, out = 0, ""
        for group, lock in ((unit, False), (lab, True)):
            if group and code == 0:
                code, out = pytest_in(copy, group, lock, timeout_s - (time.monotonic() - start))
        if code == 0:
            result = "NOT caught"  # every test passed with the guard disabled
        elif code == 1:
            result = "caught"  # a test failed
        elif code is None:
            result = f"timed out ({timeout_s:.0f} s)"  # counts as neither
        else:
            result = f"error (pytest exit {code})"  # collection or usage error: counts as neither
        first = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", out, re.M)  # a parameter's id may hold spaces
        return MutationResult(row.id, guard, order, result, time.monotonic() - start, out[-keep_output:],
                              first.group(1) if first else "")
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(copy)], capture_output=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], capture_output=True)


def mutate(selected: list[str] | None, out: Path | None, timeout_s: float = 900.0) -> int:
    tests = Tests()
    chosen = [r for r in rows(LEDGER.read_text()) if r.kind in ("command", "unit")
              and (not selected or r.id in selected)]
    missing = sorted(set(selected or []) - {r.id for r in chosen})
    if missing:
        print(f"no command or unit row {', '.join(missing)}", file=sys.stderr)
        return 2
    results = []
    print("| row | guard | mutation | tests | result | first failed | seconds |\n|---|---|---|---|---|---|---|",
          flush=True)
    for r in chosen:
        res = run_row(r, tests, timeout_s)
        results.append(res)
        where = "; ".join(f"`{m.path}" + (f"::{m.function}" if m.function else "") + "`" for m in r.mutations)
        what = "; ".join((f"line `{m.line}` → " if m.line else "body → ") + f"`{m.replacement}`"
                         for m in r.mutations)
        print(f"| {res.row} | {where or '-'} | {what or '-'} | {', '.join(res.tests)} | {res.result} | "
              f"{res.failed or '-'} | {res.seconds:.0f} |", flush=True)
        if res.result not in ("caught", "NOT caught"):
            print(f"    {res.detail.strip().splitlines()[-1] if res.detail.strip() else ''}", file=sys.stderr)
        if out is not None:
            out.write_text(json.dumps([res.__dict__ for res in results], indent=2) + "\n")
    return 0


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
    ap.add_argument("--mutate", action="store_true",
                    help="disable each row's guard in a scratch worktree of HEAD and run the row's tests there")
    ap.add_argument("--rows", help="with --mutate: these rows only (FM-01,FM-26)")
    ap.add_argument("--out", type=Path, help="with --mutate: every row's result as JSON, written as it goes")
    ap.add_argument("--timeout", type=float, default=900.0, help="with --mutate: seconds a row may take")
    args = ap.parse_args(argv)
    if args.mutate:
        return mutate([x.strip() for x in args.rows.split(",")] if args.rows else None, args.out, args.timeout)
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
