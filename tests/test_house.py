"""The house's shape, held by tests: no import loops (imports at the top and inside functions, type-only
ones included), no engine branch outside the engine adapters, and the map: README.md's Layout names every room
of the package and none that is gone, from the ground floor up, and no room imports one listed below it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.engines.registry import NAMES

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

PKG = Path(__file__).resolve().parent.parent / "sparkfleet"


def modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every sparkfleet module `name` imports, wherever the import stands (top, function, TYPE_CHECKING)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_loops() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    loops = cycles(graph)
    assert loops == [], "\n".join(" <-> ".join(c) + ": " + "; ".join(
        f"{a} -> {', '.join(sorted(graph[a] & set(c)))}" for a in c) for c in loops)


def test_the_cycle_finder_finds_a_loop() -> None:  # the test above could not fail without it
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def engine_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing something with an engine's name ('vllm', or one of ('vllm', 'sglang')); a list is an
    argv (`cmd[:2] == ["vllm", "serve"]` reads a command), not a set of names."""
    def is_name(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in NAMES
        if isinstance(node, ast.Tuple | ast.Set):
            return any(is_name(e) for e in node.elts)
        return False

    # a comparison, or a table keyed by engine name (`{"vllm": ...}.get(p.engine)` is the same branch)
    return sorted(n.lineno for n in ast.walk(tree)
                  if (isinstance(n, ast.Compare) and any(is_name(x) for x in (n.left, *n.comparators)))
                  or (isinstance(n, ast.Dict) and any(k is not None and is_name(k) for k in n.keys)))


# keyed by a program's name inside a container (argv[0], `vllm serve`'s subcommand), not by a lane's engine:
# the stand-in reads its own argv there and imports no adapter (start-up time of every sim container)
ARGV_TABLES = {"sparkfleet/sim/container.py": "SUBCOMMANDS"}


def test_no_engine_branch_outside_the_engine_adapters() -> None:
    found = []
    for p in sorted(PKG.rglob("*.py")):
        if "engines" in p.relative_to(PKG).parts[:1]:
            continue
        name = str(p.relative_to(PKG.parent))
        lines = p.read_text().splitlines()
        found += [f"{name}:{line}" for line in engine_comparisons(ast.parse(p.read_text()))
                  if not (name in ARGV_TABLES and lines[line - 1].startswith(ARGV_TABLES[name] + " = "))]
    assert found == []


def test_the_engine_branch_finder_sees_one() -> None:
    tree = ast.parse("if p.engine == 'llamacpp': pass\nok = p.engine in ('vllm', 'sglang')\nx = a == 'b'\n"
                     "e = {'vllm': ['vllm', 'serve']}.get(p.engine)\ny = {'a': 1}\n")
    assert engine_comparisons(tree) == [1, 2, 4]


# the executor (fleet/op.py) and the transports themselves are the only code that runs a node command
TRANSPORTS = {"sparkfleet/fleet/op.py", "sparkfleet/fleet/transport.py", "sparkfleet/fleet/ssh.py",
              "sparkfleet/fleet/local.py", "sparkfleet/fleet/connect.py"}


def transport_calls(tree: ast.AST) -> list[int]:
    """Lines calling `<...transport>.run/run_each/put(...)`: a node command run around the executor."""
    def named_transport(node: ast.AST) -> bool:
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        return "transport" in name.lower()

    return sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr in ("run", "run_each", "put") and named_transport(n.func.value))


def test_only_the_executor_runs_node_commands() -> None:
    found = [f"{p.relative_to(PKG.parent)}:{line}" for p in sorted(PKG.rglob("*.py"))
             if str(p.relative_to(PKG.parent)) not in TRANSPORTS and "sim" not in p.relative_to(PKG).parts[:1]
             for line in transport_calls(ast.parse(p.read_text()))]
    assert found == []


def test_the_transport_call_finder_sees_one() -> None:
    tree = ast.parse("self.transport.run([n], c)\ntransport.run_each(ns, cs)\nex.run(op)\nsubprocess.run(['x'])\n")
    assert transport_calls(tree) == [1, 2]


def unexplained_function_imports(pkg: Path) -> list[str]:
    """Imports inside functions with no comment saying why: on the import's line, above its block, or on the
    `try:`/`if ...:` line that opens it. The CLI's and the sim's stand-ins are exempt as a whole: their
    packages' docstrings say why (cli/__init__.py, sim/shim/__init__.py)."""
    out = []
    for p in sorted(pkg.rglob("*.py")):
        if p.relative_to(pkg).parts[:1] == ("cli",) or p.relative_to(pkg).parts[:2] == ("sim", "shim"):
            continue
        lines = p.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for imp in ast.walk(fn):
                if isinstance(imp, ast.Import | ast.ImportFrom) and not _says_why(lines, imp.lineno - 1):
                    out.append(f"{p.relative_to(pkg.parent)}:{imp.lineno}: {lines[imp.lineno - 1].strip()}")
    return out


def _says_why(lines: list[str], i: int) -> bool:
    if "#" in lines[i]:
        return True
    for line in reversed(lines[:i]):
        t = line.strip()
        if t.startswith("#"):
            return True
        if t and not t.startswith(("import ", "from ")):
            return "#" in t and t.split("#", 1)[0].rstrip().endswith(":")
    return False


def test_an_import_inside_a_function_says_why() -> None:
    """Imports go at the top, where the import graph shows them; one inside a function is for start-up time,
    an optional extra, or a program that must need only the standard library, and says which (issue 22)."""
    assert unexplained_function_imports(PKG) == []


def test_the_function_import_finder_sees_one(tmp_path: Path) -> None:  # the test above could not fail without it
    (tmp_path / "pkg" / "cli").mkdir(parents=True)
    (tmp_path / "pkg" / "m.py").write_text("def f():\n    import json\n\n\ndef g():\n    import os  # start-up\n\n\n"
                                           "def h():\n    try:  # optional extra\n        import yaml\n"
                                           "    except ImportError:\n        pass\n")
    (tmp_path / "pkg" / "cli" / "c.py").write_text("def f():\n    import json\n")
    assert unexplained_function_imports(tmp_path / "pkg") == ["pkg/m.py:2: import json"]


# -- one way to get an executor, one fan-out (issue 41 §3) ------------------------------------------------

def calls_named(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines calling a class or function by one of `names` (`Executor(...)`, `op.Executor(...)`)."""
    return sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Name) and n.func.id in names)
        or (isinstance(n.func, ast.Attribute) and n.func.attr in names)))


def sources() -> list[Path]:
    """sparkfleet's modules and the benches', less the simulated lab (the nodes' side, not the controller's)."""
    return [p for p in sorted([*PKG.rglob("*.py"), *(PKG.parent / "bench").rglob("*.py")])
            if p.relative_to(PKG.parent).parts[:2] != ("sparkfleet", "sim")]


def test_one_way_to_get_an_executor() -> None:
    """An Executor (and the --dry-run transport, NoConnection) is made by fleet/op.py's executor_for and
    open_transport only: no verb decides dry-run and NoConnection on its own."""
    found = [f"{p.relative_to(PKG.parent)}:{line}" for p in sources()
             if str(p.relative_to(PKG.parent)) != "sparkfleet/fleet/op.py"
             for line in calls_named(ast.parse(p.read_text()), {"Executor", "NoConnection"})]
    assert found == []


def test_the_call_finder_sees_one() -> None:
    tree = ast.parse("Executor(t, n)\nop.NoConnection()\nThreadPoolExecutor(4)\nexecutor_for(n)\n")
    assert calls_named(tree, {"Executor", "NoConnection"}) == [1, 2]


# a thread pool of its own beside the transport's fan-out, and why it is not a node command's
OWN_POOLS = {
    "sparkfleet/fleet/transport.py": "fan_out: the one fan-out of every transport's per-node work",
    "sparkfleet/fleet/connect.py": "MixedTransport: its parts (ssh, local, srun) at once, each fanning out",
    "sparkfleet/cli/trust.py": "host keys fetched before any transport may connect: no node command",
    "sparkfleet/gates/determinism.py": "concurrent HTTP requests to the lane's API: no node command",
    "sparkfleet/simengine/main.py": "the simulated engine's own server, on the node's side",
}


def pool_uses(tree: ast.AST) -> list[int]:
    """Lines naming ThreadPoolExecutor (imported, called or referred to)."""
    return sorted({n.lineno for n in ast.walk(tree)
                   if (isinstance(n, ast.Name) and n.id == "ThreadPoolExecutor")
                   or (isinstance(n, ast.Attribute) and n.attr == "ThreadPoolExecutor")
                   or (isinstance(n, ast.ImportFrom) and any(a.name == "ThreadPoolExecutor" for a in n.names))})


def test_node_commands_fan_out_in_the_transport_only() -> None:
    """Work per node runs through the transport's fan-out (run_each), never a pool of a module's own; work
    beside it runs in the background through the executor (NodeCommands.background, fleet/op.py's
    while_running), as the exporter's extras and the Engram copies' progress do."""
    found = [f"{p.relative_to(PKG.parent)}:{line}" for p in sources()
             if str(p.relative_to(PKG.parent)) not in OWN_POOLS for line in pool_uses(ast.parse(p.read_text()))]
    assert found == []


def test_the_pool_finder_sees_one() -> None:
    tree = ast.parse("from concurrent.futures import ThreadPoolExecutor\nimport concurrent.futures as cf\n"
                     "cf.ThreadPoolExecutor(2)\nx = 1\n")
    assert pool_uses(tree) == [1, 3]


def run_and_run_each(tree: ast.AST) -> list[str]:
    """Classes that write both `run` and `run_each`."""
    return [c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
            and {"run", "run_each"} <= {f.name for f in c.body if isinstance(f, ast.FunctionDef)}]


def test_run_is_written_once_for_every_transport() -> None:
    """A transport writes `run_each`; `run` (the same command everywhere) is Transport's, written once. The
    --dry-run stand-in writes both: it refuses each by name."""
    found = {f"{p.relative_to(PKG.parent)}:{name}" for p in sources() for name in run_and_run_each(ast.parse(p.read_text()))}
    assert found == {"sparkfleet/fleet/transport.py:Transport", "sparkfleet/fleet/op.py:NoConnection"}


def test_the_run_finder_sees_one() -> None:
    tree = ast.parse("class A:\n    def run(self): ...\n    def run_each(self): ...\n"
                     "class B:\n    def run_each(self): ...\n")
    assert run_and_run_each(tree) == ["A"]


# -- the map: README.md's Layout names every room of the package, from the ground floor up ------------------------

README = PKG.parent / "README.md"


def layout(readme: str) -> list[tuple[int, list[str]]]:
    """The Layout's entries in order, each (indent, names): 4 = a path from the repository's root, 6 = one inside
    the package. A line's names stand before the first run of two spaces; a line indented further continues one."""
    block = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return [(len(m.group(1)), m.group(2).split(" ")) for line in block.splitlines()
            if (m := re.match(r"( {4}| {6})(\S.*?)(?: {2,}|$)", line))]


def rooms(pkg: Path) -> set[str]:
    """The package's rooms: each package (`fleet/`) and module (`plan.py`) right under it."""
    return {p.name + "/" if p.is_dir() else p.name for p in pkg.iterdir()
            if (p.is_dir() and (p / "__init__.py").is_file()) or (p.suffix == ".py" and p.name != "__init__.py")}


def map_faults(readme: str, pkg: Path) -> list[str]:
    """A room with no line, and a line for a path that is gone."""
    entries = layout(readme)
    named = {n.split("/")[0] + "/" if "/" in n.rstrip("/") else n for indent, names in entries if indent == 6
             for n in names}
    out = [f"{pkg.name}/{r}: a room with no line in README.md's Layout" for r in sorted(rooms(pkg) - named)]
    return out + [f"{n}: README.md's Layout has a line for it, and it is gone" for indent, names in entries
                  for n in names if not ((pkg if indent == 6 else pkg.parent) / n).exists()]


def upward_imports(readme: str, graph: dict[str, set[str]]) -> list[str]:
    """Imports of a room listed further down the Layout than the importer (`a.b.c` is in room b)."""
    order = [names[0].rstrip("/").removesuffix(".py") for indent, names in layout(readme)
             if indent == 6 and "/" not in names[0].rstrip("/")]
    rank = {r: i for i, r in enumerate(order)}

    def room(module: str) -> str | None:
        return module.split(".")[1] if "." in module else None

    return [f"{a} -> {b}: {room(b)} is listed below {room(a)}" for a in sorted(graph) for b in sorted(graph[a])
            if room(a) in rank and room(b) in rank and rank[room(b)] > rank[room(a)]]


def test_the_layout_names_every_room_and_only_rooms_that_are_there() -> None:
    assert map_faults(README.read_text(), PKG) == []


def test_a_room_imports_only_rooms_listed_above_it() -> None:
    """The Layout lists the rooms from the ground floor up: an import of a room below is an upward import (move
    the import, or the line, where no loop comes of it)."""
    known = modules()
    assert upward_imports(README.read_text(), {n: imports(n, p, known) for n, p in known.items()}) == []


def test_the_map_readers_see_a_missing_room_a_gone_one_and_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "low").mkdir(parents=True)
    (tmp_path / "pkg" / "low" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "data").mkdir()  # no package: no room
    for name in ("__init__.py", "high.py", "unlisted.py"):
        (tmp_path / "pkg" / name).write_text("")
    readme = ("# x\n\n## Layout\n\n    pkg/        the package\n      low/      the ground floor\n"
              "                continued\n      low/sub/  inside low\n      high.py   above low\n"
              "      gone.py   was here\n    docs/       notes\n\n## Next\n\n      later.py  not the map\n")
    assert map_faults(readme, tmp_path / "pkg") == [
        "pkg/unlisted.py: a room with no line in README.md's Layout",
        "low/sub/: README.md's Layout has a line for it, and it is gone",
        "gone.py: README.md's Layout has a line for it, and it is gone",
        "docs/: README.md's Layout has a line for it, and it is gone"]
    graph = {"pkg.high": {"pkg.low"}, "pkg.low.x": {"pkg.high", "pkg.low"}, "pkg": {"pkg.low"}}
    assert upward_imports(readme, graph) == ["pkg.low.x -> pkg.high: high is listed below low"]


def test_modules_that_start_a_process_import_first() -> None:
    """A module imported first in a fresh interpreter loads (fleet/ship.py imports fleet/ops, whose package imports
    ops/allreduce.py, which uses ship: bound by name at import, `import sparkfleet.fleet.ship` failed while the
    suite, importing in another order, passed; test_gather.py alone failed to collect)."""
    for module in ("sparkfleet.fleet.ship", "sparkfleet.fleet.gather", "sparkfleet.fleet.ops", "sparkfleet.cli.main"):
        r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, cwd=PKG.parent)
        assert r.returncode == 0, (module, r.stderr[-600:])


def test_the_ops_package_gives_each_op_from_its_module_when_first_used() -> None:
    """sparkfleet/fleet/ops/__init__.py names each op's module instead of importing them all (start-up): each
    name resolves to its module's object, every Op defined in the package is named, and a typo is an error."""
    import importlib
    import inspect
    import pkgutil

    from sparkfleet.fleet import ops

    for name in ops.__all__:
        module = importlib.import_module(f"sparkfleet.fleet.ops.{ops._WHERE[name]}")
        assert getattr(ops, name) is getattr(module, name), name
    defined = {obj.__name__ for info in pkgutil.iter_modules(ops.__path__)
               for obj in vars(importlib.import_module(f"sparkfleet.fleet.ops.{info.name}")).values()
               if inspect.isclass(obj) and issubclass(obj, ops.Op) and obj.__module__.startswith("sparkfleet.fleet.ops.")
               and obj is not ops.Op}
    assert defined - set(ops.__all__) == set()
    with pytest.raises(AttributeError, match="has no attribute 'LaneContainer'"):
        ops.LaneContainer  # noqa: B018
