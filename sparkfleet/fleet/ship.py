"""Ship node-side helpers on demand and run them: one round trip per node in the steady state.

The command sent to a node is a small `python3 -c` guard: it reads ~/.cache/sparkfleet/bin/<name>,
checks its sha256 against this sparkfleet's copy and, if it matches, runs exactly the bytes it
hashed (no window between check and run). If the file is missing or different it creates the
directory and exits with MISSING (97) plus a marker on stderr; only those nodes get the helper
(Transport.put, mode 0755) and are run again. A node that still differs after shipping fails.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from sparkfleet.fleet.transport import Result, Transport
from sparkfleet.spec.inventory import Node

NODESIDE = Path(__file__).resolve().parent / "nodeside"
HELPER_DIR = "~/.cache/sparkfleet/bin"
MISSING = 97  # the guard's exit code for "helper missing or changed"; the helpers never exit with it
MARKER = "sparkfleet-helper-missing"

_GUARD = """\
import hashlib, os, sys
p = os.path.expanduser({path!r})
try:
    with open(p, 'rb') as f:
        b = f.read()
except OSError:
    b = None
if b is None or hashlib.sha256(b).hexdigest() != {digest!r}:
    os.makedirs(os.path.dirname(p), exist_ok=True)
    sys.stderr.write({marker!r} + ' ' + p + chr(10))
    sys.exit({missing})
if {run}:
    sys.argv = [p] + sys.argv[1:]
    exec(compile(b, p, 'exec'), {{'__name__': '__main__', '__file__': p}})
"""


def _check_name(name: str) -> str:
    if "/" in name or name.startswith(".") or not (NODESIDE / name).is_file():
        known = sorted(p.name for p in NODESIDE.glob("*.py") if p.name != "__init__.py")
        raise ValueError(f"no node-side helper {name!r} (known: {', '.join(known)})")
    return name


@lru_cache(maxsize=16)
def helper_bytes(name: str) -> bytes:
    """The helper as this sparkfleet ships it."""
    return (NODESIDE / _check_name(name)).read_bytes()


def helper_sha256(name: str) -> str:
    return hashlib.sha256(helper_bytes(name)).hexdigest()


def remote_path(name: str) -> str:
    return f"{HELPER_DIR}/{_check_name(name)}"


def guard_command(name: str, *, run: bool = True) -> str:
    """The one shell command that verifies the node's copy by sha256 and (if `run`) runs it."""
    code = _GUARD.format(path=remote_path(name), digest=helper_sha256(name), marker=MARKER,
                         missing=MISSING, run=run)
    return "python3 -c " + shlex.quote(code)


def is_missing(r: Result) -> bool:
    """True when the guard said: the helper on that node is missing or differs."""
    return r.exit_code == MISSING and MARKER in (r.stderr + r.stdout)


def _explain(r: Result, name: str) -> Result:
    """Give a failed run a one-line cause people can act on."""
    if r.ok or r.message:
        if not r.ok and r.exit_code == 127 and "python3" not in r.message:
            r.message = f"python3 not found on {r.node} (exit 127): {r.message}"
        return r
    if r.exit_code == 127:
        r.message = f"python3 not found on {r.node} (exit 127); node-side helpers need the system python3"
    else:
        last = (r.stderr.strip().splitlines() or [""])[-1]
        r.message = f"{name} on {r.node} failed (exit {r.exit_code})" + (f": {last}" if last else "")
    return r


def _still_differs(node: str, name: str) -> Result:
    return Result(node=node, ok=False, exit_code=MISSING, error="error",
                  message=f"{remote_path(name)} on {node} still differs from this sparkfleet's copy after "
                  f"shipping it (sha256 {helper_sha256(name)[:12]}); is ~/.cache writable and not full?")


def _put(transport: Transport, nodes: list[Node], name: str) -> dict[str, Result]:
    return transport.put(nodes, helper_bytes(name), remote_path(name), mode=0o755)


def ensure_helper(transport: Transport, nodes: Iterable[Node], name: str = "facts.py") -> dict[str, Result]:
    """Make sure every node holds this sparkfleet's copy of `name`; ok Results say 'current' or 'shipped'."""
    nodes = list(nodes)
    check = guard_command(name, run=False)
    first = transport.run(nodes, check, timeout_s=30.0)
    out: dict[str, Result] = {}
    stale = []
    for node in nodes:
        r = first[node.name]
        if r.ok:
            out[node.name] = Result(node.name, True, message="current", elapsed_s=r.elapsed_s)
        elif is_missing(r):
            stale.append(node)
        else:
            out[node.name] = _explain(r, name)
    if not stale:
        return out
    put = _put(transport, stale, name)
    shipped = [n for n in stale if put[n.name].ok]
    for n in stale:
        if not put[n.name].ok:
            out[n.name] = put[n.name]
    if shipped:
        again = transport.run(shipped, check, timeout_s=30.0)
        for n in shipped:
            r = again[n.name]
            if r.ok:
                out[n.name] = Result(n.name, True, message="shipped", elapsed_s=r.elapsed_s)
            elif is_missing(r):
                out[n.name] = _still_differs(n.name, name)
            else:
                out[n.name] = _explain(r, name)
    return out


def _run_grouped(transport: Transport, nodes: list[Node], command: str, stdin_by_node: dict[str, str | None],
                 timeout_s: float) -> dict[str, Result]:
    """One transport.run per distinct stdin, those runs in parallel (Transport.run takes one stdin)."""
    groups: dict[str | None, list[Node]] = {}
    for n in nodes:
        groups.setdefault(stdin_by_node.get(n.name), []).append(n)
    if len(groups) == 1:
        (stdin, members), = groups.items()
        return transport.run(members, command, stdin=stdin, timeout_s=timeout_s)
    out: dict[str, Result] = {}
    with ThreadPoolExecutor(max_workers=min(len(groups), 32)) as pool:
        futures = [pool.submit(transport.run, members, command, stdin=stdin, timeout_s=timeout_s)
                   for stdin, members in groups.items()]
        for f in futures:
            out.update(f.result())
    return out


def run_helper(transport: Transport, nodes: Iterable[Node], name: str,
               stdin_by_node: dict[str, str] | None = None, timeout_s: float = 30.0) -> dict[str, Result]:
    """Run `python3 ~/.cache/sparkfleet/bin/<name>` on every node, shipping it first only where needed.

    Steady state: one round trip per node. A node whose copy is missing or changed answers 97; the
    helper is put there and run again (two more round trips, that node only). Nodes with different
    stdin run in parallel, one transport call each.
    """
    nodes = list(nodes)
    stdins: dict[str, str | None] = dict(stdin_by_node or {})
    command = guard_command(name)
    results = _run_grouped(transport, nodes, command, stdins, timeout_s)
    stale = [n for n in nodes if is_missing(results[n.name])]
    if stale:
        put = _put(transport, stale, name)
        shipped = [n for n in stale if put[n.name].ok]
        for n in stale:
            if not put[n.name].ok:
                results[n.name] = put[n.name]
        if shipped:
            again = _run_grouped(transport, shipped, command, stdins, timeout_s)
            for n in shipped:
                results[n.name] = _still_differs(n.name, name) if is_missing(again[n.name]) else again[n.name]
    return {n.name: _explain(results[n.name], name) for n in nodes}
