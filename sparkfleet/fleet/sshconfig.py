"""The operator's OpenSSH client config applied to an inventory: Host aliases, HostName, User, Port,
IdentityFile and ProxyJump, read with paramiko's SSHConfig, the inventory's own values winning.

Which file: the inventory's `ssh_config:`, else $SPARKFLEET_SSH_CONFIG / the user's config file
(`sparkfleet config`), else ~/.ssh/config; a missing default file means no config. Resolution runs
when the inventory loads, so every command (plan, trust, check, up) sees the same addresses, and
nothing is contacted. A node's `ssh.host` is looked up as `ssh HOST` would (the Host's HostName
applies); `ssh.alias` names a Host that must exist. Host-key settings of the file
(StrictHostKeyChecking, UserKnownHostsFile) are not used: sparkfleet always checks keys strictly
against its own known_hosts (`sparkfleet trust`, `trust --from-known-hosts`).
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Any

from sparkfleet.schema.errors import SpecError
from sparkfleet.schema.inventory import Hop, Inventory, Ssh
from sparkfleet.schema.yamlsrc import Marks, locate
from sparkfleet.userconfig import setting

MAX_HOPS = 8
HOP = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s]+)(?::(?P<port>\d+))?$")


def config_path(inventory: Inventory) -> tuple[Path | None, str]:
    """The SSH config file for this inventory and where that choice came from (None: no file)."""
    if inventory.ssh_config:
        return Path(inventory.ssh_config).expanduser(), "inventory ssh_config"

    s = setting("ssh_config")
    path = Path(s.value).expanduser() if s.value else None
    if s.source == "default" and path is not None and not path.is_file():
        return None, s.source
    return path, s.source


def needs_config(inventory: Inventory) -> bool:
    return any(n.transport == "ssh" and (n.ssh.alias or n.ssh.proxy_jump) for n in inventory.nodes.values())


def resolve(inventory: Inventory, marks: Marks, display: str) -> Inventory:
    """The inventory with each SSH node's host/user/port/key/jump filled from the SSH config."""
    path, source = config_path(inventory)
    text = _read(path, source, marks, display) if path is not None else ""
    if not _meaningful(text) and not needs_config(inventory):
        return inventory  # no file (or an empty one) and nothing that needs one: paramiko is not imported
    config = _parse(text, path, marks, display) if path is not None else None
    for key, node in inventory.nodes.items():
        if node.transport != "ssh":
            continue
        field = f"nodes.{key}.ssh"
        node.ssh = resolve_ssh(node.ssh, config, path, lambda what, sub, k=key: SpecError(
            what, *_where(marks, display, ("nodes", k, "ssh", sub)), f"nodes.{k}.ssh.{sub}"), field)
    return inventory


def _where(marks: Marks, display: str, loc: tuple) -> tuple[str, int | None]:
    file, line = locate(marks, loc)
    return file or display, line


def _read(path: Path, source: str, marks: Marks, display: str) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read the SSH config {path} (from {source}): {exc.strerror}",
                        *_where(marks, display, ("ssh_config",)), "ssh_config") from None


def _meaningful(text: str) -> bool:
    return any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines())


def _parse(text: str, path: Path, marks: Marks, display: str) -> Any:
    # here, not at the top: `plan` loads inventories and would pay paramiko's import (a fifth of a second)
    # for every one, though only an ssh_config file that has text needs it
    from paramiko import SSHConfig
    from paramiko.ssh_exception import ConfigParseError

    try:
        return SSHConfig.from_text(text)
    except (ConfigParseError, ValueError) as exc:
        raise SpecError(f"SSH config {path}: {exc}", *_where(marks, display, ("ssh_config",)), "ssh_config") from None


def hosts(config: Any) -> list[str]:
    """The Host patterns of a config, `*` left out."""
    return sorted(h for h in config.get_hostnames() if h != "*")


def _matches(config: Any, name: str) -> bool:
    """Whether a Host pattern other than `*` names `name` (negated patterns are not counted)."""
    return any(not p.startswith("!") and fnmatch.fnmatchcase(name, p) for p in hosts(config))


def resolve_ssh(ssh: Ssh, config: Any, path: Path | None, error, field: str) -> Ssh:
    """One node's SSH settings; `error(message, subfield)` builds the SpecError for bad input."""
    name = ssh.alias or ssh.host
    if ssh.alias and (config is None or not _matches(config, ssh.alias)):
        listed = ", ".join(hosts(config)) if config is not None else ""
        where = str(path) if path is not None else "no SSH config (~/.ssh/config does not exist)"
        raise error(f"SSH alias {ssh.alias!r} is not a Host in {where}"
                    + (f" (Hosts there: {listed})" if listed else ""), "alias")
    found: dict[str, Any] = config.lookup(name) if config is not None else {}
    if "proxycommand" in found and not ssh.proxy_jump:
        raise error(f"the SSH config gives {name!r} a ProxyCommand, which sparkfleet does not run; "
                    "use ProxyJump (or set ssh.proxy_jump here)", "alias" if ssh.alias else "host")
    given = ssh.model_fields_set
    update: dict[str, Any] = {}
    update["host"] = ssh.host if (ssh.alias and ssh.host) else found.get("hostname", name)
    if "user" not in given and found.get("user"):
        update["user"] = found["user"]
    if "port" not in given and found.get("port"):
        update["port"] = _port(found["port"], error)
    if "key" not in given and found.get("identityfile"):
        update["key"] = _identity(found["identityfile"])
    if "jump" not in given:
        spec = ssh.proxy_jump if "proxy_jump" in given else found.get("proxyjump")
        update["jump"] = hops(spec, config, error) if spec else []
    return ssh.model_copy(update=update)


def hops(spec: str, config: Any, error, depth: int = 0) -> list[Hop]:
    """ProxyJump `a,user@b:2222` as resolved Hops; a hop that is a Host gets that Host's settings,
    its own ProxyJump first (as ssh chains them)."""
    if spec.strip().lower() == "none":
        return []
    if depth > MAX_HOPS:
        raise error(f"ProxyJump chain longer than {MAX_HOPS} hops (a loop in the SSH config?)", "proxy_jump")
    out: list[Hop] = []
    for item in (s.strip() for s in spec.split(",")):
        m = HOP.match(item.removeprefix("ssh://"))
        if not m:
            raise error(f"ProxyJump {item!r}: expected [user@]host[:port]", "proxy_jump")
        name = m.group("host").strip("[]")
        found: dict[str, Any] = config.lookup(name) if config is not None else {}
        before = found.get("proxyjump")
        if before and before.lower() != "none":
            out.extend(hops(before, config, error, depth + 1))
        port = m.group("port") or found.get("port") or 22
        out.append(Hop(host=found.get("hostname", name), user=m.group("user") or found.get("user") or "root",
                       port=_port(port, error), key=_identity(found["identityfile"]) if found.get("identityfile")
                       else None))
    return out


def _port(value: Any, error) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = 0
    if not 1 <= port <= 65535:
        raise error(f"Port {value!r} from the SSH config is not a port number", "port")
    return port


def _identity(files: list[str]) -> str:
    """The first IdentityFile that exists (ssh tries them in order), else the first named."""
    paths = [os.path.expanduser(f) for f in files]
    return next((p for p in paths if os.path.isfile(p)), paths[0])
