"""Plain node commands the controller runs, in one place (the sim's shims answer the same commands)."""

from __future__ import annotations

from typing import Any

from sparkfleet.spec.inventory import Node

# `sysctl -w` rather than a redirect into /proc: it is an ordinary command, so the simulated lab's shim
# can stand in for it, and it needs root exactly as the seeds' launcher had (CATALOG LCH-03).
DROP_CACHES = "sync && sysctl -q -w vm.drop_caches=3"
DROP_TIMEOUT_S = 120.0  # sync flushes dirty pages first, which can take a while on a busy node


def drop_caches(transport: Any, nodes: list[Node]) -> dict[str, bool | str]:
    """Drop the page cache everywhere at once: True per node that did, the reason where the command failed.

    A node that cannot be reached is left out: gathering facts reports it as unreachable.
    """
    results = transport.run(nodes, DROP_CACHES, timeout_s=DROP_TIMEOUT_S)
    done: dict[str, bool | str] = {}
    for name, r in results.items():
        if r.ok:
            done[name] = True
        elif r.error in ("exit", "timeout"):
            lines = (r.stderr or r.message or "").strip().splitlines()
            done[name] = lines[-1] if lines else f"exit {r.exit_code}"
    return done
