"""Ship node-side helpers on demand and run them: one round trip per node in the steady state.

The command sent to a node is a small `python3 -c` guard: it reads ~/.cache/sparkfleet/bin/<name>,
checks its sha256 against this sparkfleet's copy and, if it matches, runs exactly the bytes it
hashed (no window between check and run). If the file is missing or different it exits with
MISSING (97) plus a marker on stderr; only those nodes get the helper
(Transport.put, mode 0755) and are run again. A node that still differs after shipping fails.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from sparkfleet.fleet.op import NodeCommands, OpGen, query, run_ops
from sparkfleet.fleet.transport import Result, Transport
from sparkfleet.schema.inventory import Node

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


def inline_command(name: str) -> str:
    """The helper's own bytes run by `python3 -c`, for a node that lacks it when nothing may be written."""
    return "python3 -c " + shlex.quote(helper_bytes(name).decode())


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


def helper_ops(name: str, nodes: list[Node], stdin_by_node: dict[str, str] | None = None,
               timeout_s: float = 30.0, *, run: bool = True, changes: bool = False) -> OpGen[dict[str, Result]]:
    """Run (or with `run=False` only verify) this sparkfleet's copy of `name` on every node, shipping it first
    only where it is missing or differs; each node's Result (verify only: message 'current' or 'shipped').

    Steady state: one read-only round trip per node. A node whose copy is missing or changed answers 97;
    the helper is written there and run again (that node only). Under --dry-run nothing is shipped: the
    nodes that would need it fail, saying so (verify only: they answer 'would ship', so the caller goes on to
    show what it would run there). `changes`: the helper's run writes on the node (a copy), so it is not run
    under --dry-run=facts either."""
    command = guard_command(name, run=run)
    stdin = dict(stdin_by_node or {})
    results = yield NodeCommands(f"run {name}" if run else f"verify {name}", {n.name: command for n in nodes},
                                 changes=changes and run, timeout_s=timeout_s, stdin=stdin)
    if results is None:
        return {}
    stale = [n for n in nodes if is_missing(results[n.name])]
    if stale:
        again = yield NodeCommands(f"ship {name}" + (" and run it" if run else ""), {n.name: command for n in stale},
                                   changes=True, timeout_s=timeout_s, stdin=stdin, file_mode=0o755,
                                   files={n.name: {remote_path(name): helper_bytes(name)} for n in stale})
        if again is None and run and not changes:  # --dry-run=facts: the same bytes run inline
            again = yield query(f"run {name} inline (a dry run ships nothing)",
                                {n.name: inline_command(name) for n in stale}, timeout_s, stdin)
        for n in stale:
            if again is None and not run:  # --dry-run=facts: the ship was shown; what comes next is shown too
                results[n.name] = Result(n.name, True, message="would ship")
            elif again is None:
                results[n.name] = Result(n.name, False, exit_code=MISSING, error="error",
                                         message=f"{remote_path(name)} on {n.name} is missing or differs from this "
                                         "sparkfleet's copy, and a dry run ships nothing")
            elif is_missing(again[n.name]):
                results[n.name] = _still_differs(n.name, name)
            else:
                results[n.name] = again[n.name]
                if not run and again[n.name].ok:
                    results[n.name] = Result(n.name, True, message="shipped", elapsed_s=again[n.name].elapsed_s)
    out = {}
    for n in nodes:
        r = results[n.name]
        if not run and r.ok and not r.message:
            r = Result(n.name, True, message="current", elapsed_s=r.elapsed_s)
        out[n.name] = _explain(r, name)
    return out


def ensure_helper(transport: Transport, nodes: Iterable[Node], name: str = "facts.py") -> dict[str, Result]:
    """Make sure every node holds this sparkfleet's copy of `name`; ok Results say 'current' or 'shipped'."""
    nodes = list(nodes)
    return run_ops(transport, nodes, helper_ops(name, nodes, run=False))


def run_helper(transport: Transport, nodes: Iterable[Node], name: str,
               stdin_by_node: dict[str, str] | None = None, timeout_s: float = 30.0,
               changes: bool = False) -> dict[str, Result]:
    """Run `python3 ~/.cache/sparkfleet/bin/<name>` on every node now (helper_ops through the executor)."""
    nodes = list(nodes)
    return run_ops(transport, nodes, helper_ops(name, nodes, stdin_by_node, timeout_s, changes=changes))
