"""`ip` and `sysctl`: runtime addresses (rail-2 aliases) and drop_caches, kept in state.

THIS IS A SIMULATION: no GPU, container or RDMA device exists behind these commands.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .state import STATE, ShimError, dumps, locked, rfc3339, write_bytes


def ip(argv: list[str], root: Path) -> int:
    """`ip addr add|del CIDR dev IFACE` and `ip addr show`: runtime aliases in state/net.json (never persisted,
    like the real command)."""
    args = [a for a in argv if a not in ("-4", "-6", "-br", "-brief")]
    if not args or args[0] not in ("addr", "address", "a"):
        raise ShimError("[sim] the sparkfleet simulation's ip supports: ip addr add|del CIDR dev IFACE; "
                        "ip addr show", 1)
    rest = args[1:] or ["show"]
    with locked(root):
        path = root / STATE / "net.json"
        net = json.loads(path.read_text()) if path.is_file() else {"aliases": []}
        if rest[0] in ("show", "list", "ls"):
            for a in net["aliases"]:
                print(f"    inet {a['cidr']} scope global secondary {a['dev']}")
            return 0
        if rest[0] not in ("add", "del", "delete") or len(rest) < 4 or rest[2] != "dev":
            raise ShimError("Command line is not complete. Try \"ip address help\".", 1)
        entry = {"cidr": rest[1], "dev": rest[3]}
        if rest[0] == "add":
            if entry in net["aliases"]:
                raise ShimError("RTNETLINK answers: File exists", 2)
            net["aliases"].append(entry)
        else:
            if entry not in net["aliases"]:
                raise ShimError("RTNETLINK answers: Cannot assign requested address", 2)
            net["aliases"].remove(entry)
        write_bytes(path, dumps(net).encode())
    return 0


def sysctl(argv: list[str], root: Path) -> int:
    """`sysctl [-q] -w vm.drop_caches=3`: records the drop (the sim's page cache is already small)."""
    sets = [a for a in argv if "=" in a]
    if not sets:
        raise ShimError("[sim] the sparkfleet simulation's sysctl supports -w KEY=VALUE only", 1)
    for kv in sets:
        key, _, value = kv.partition("=")
        path = root / "proc" / "sys" / key.replace(".", "/")
        if not path.parent.is_dir():
            raise ShimError(f"sysctl: cannot stat /proc/sys/{key.replace('.', '/')}: No such file or directory", 255)
        try:
            path.write_text(value + "\n")
        except PermissionError:
            if os.geteuid() != 0:  # what procps' sysctl says to a user who is not root
                raise ShimError(f'sysctl: permission denied on key "{key}"', 1) from None
            # root of the unprivileged lab's user namespace: the kernel keeps the host's vm sysctls to the host
        with open(root / STATE / "sysctl.log", "a") as log:  # what was set, for tests and `sim status`
            log.write(f"{rfc3339(time.time())} {key}={value}\n")
        if "-q" not in argv:
            print(f"{key} = {value}")
    return 0
