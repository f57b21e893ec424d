"""Network addresses on a node."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sparkfleet.fleet.ops.base import Done


@dataclass(frozen=True)
class Rail2Alias(Done):
    """Add (or remove) the rail-2 alias address: runtime only, `ip addr` never writes persistent network
    config (LCH-T4)."""

    alias: str
    iface: str
    add: bool
    changes = True

    def command(self) -> str:
        a, d = shlex.quote(self.alias), shlex.quote(self.iface)
        return (f"ip addr del {a} dev {d} 2>/dev/null; ip addr add {a} dev {d}" if self.add
                else f"ip addr del {a} dev {d} 2>/dev/null || true")
