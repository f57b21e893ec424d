"""Per-user defaults: the default inventory, ops root, state dir and SSH config, and where each came from.

Precedence, highest first: the command-line option, the environment variable, the user's config file
($SPARKFLEET_CONFIG, else $XDG_CONFIG_HOME/sparkfleet/config.yaml, else ~/.config/sparkfleet/config.yaml),
the built-in default. `sparkfleet config` prints the result with its source. This module imports
only the standard library and the YAML loader, so every command can call it before anything heavy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.schema.errors import SpecError, UserError
from sparkfleet.schema.yamlsrc import load_yaml


@dataclass(frozen=True)
class Known:
    env: str
    default: str | None
    path: bool  # a file or dir: `~` expanded, relative values taken from the config file's dir
    help: str


KNOWN: dict[str, Known] = {
    "inventory": Known("SPARKFLEET_INVENTORY", "lab", False,
                       "inventory name under inventories/ (or `sim`), or a YAML file"),
    "root": Known("SPARKFLEET_ROOT", None, True, "ops directory (default: the checkout sparkfleet runs from)"),
    "state": Known("SPARKFLEET_STATE", None, True,
                   "runs, restore points, known_hosts, locks (default: $XDG_STATE_HOME/sparkfleet)"),
    "ssh_config": Known("SPARKFLEET_SSH_CONFIG", "~/.ssh/config", True,
                        "OpenSSH client config for Host aliases, User, Port, IdentityFile, ProxyJump"),
    # 64: at 64 nodes one controller holding 64 connections took 0.66x OpenSSH's parallel floor (docs/fleet-64.md)
    "fanout": Known("SPARKFLEET_FANOUT", "64", False,
                    "most nodes a command talks to at once, over SSH or in local shells"),
}
INTEGER = {"fanout"}  # settings that are a whole number >= 1 (the file may write them unquoted)


@dataclass(frozen=True)
class Setting:
    name: str
    value: str | None
    source: str  # "--inventory", "env SPARKFLEET_INVENTORY", "~/.config/sparkfleet/config.yaml:3", "default"


def config_path() -> Path:
    """The user's config file (it need not exist)."""
    explicit = os.environ.get("SPARKFLEET_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sparkfleet" / "config.yaml"


_cache: dict[tuple, dict[str, tuple[str, int]]] = {}


def file_values() -> dict[str, tuple[str, int]]:
    """The config file's settings as {name: (value, line)}; SpecError for an unknown key or a bad value."""
    path = config_path()
    try:
        stat = path.stat()
    except OSError:
        return {}
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key in _cache:
        return _cache[key]

    data, marks = load_yaml(path, str(path))
    if data is None or data == {}:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"expected a mapping of settings ({', '.join(KNOWN)})", str(path), 1)
    values: dict[str, tuple[str, int]] = {}
    for name, value in data.items():
        line = marks.get((name,), (str(path), 1))[1]
        if name not in KNOWN:
            raise SpecError(f"unknown setting (known: {', '.join(KNOWN)})", str(path), line, name)
        if name in INTEGER:
            if isinstance(value, bool) or not isinstance(value, (int, str)) or not _whole(str(value)):
                raise SpecError(f"expected a whole number >= 1 ({KNOWN[name].help}), got {value!r}", str(path), line,
                                name)
            value = str(value)
        if not isinstance(value, str) or not value:
            raise SpecError(f"expected a non-empty string ({KNOWN[name].help}), got {value!r}", str(path), line, name)
        if KNOWN[name].path or (name == "inventory" and ("/" in value or value.endswith((".yaml", ".yml")))):
            p = Path(value).expanduser()
            value = str(p if p.is_absolute() else (path.parent / p).resolve())
        values[name] = (value, line)
    _cache.clear()
    _cache[key] = values
    return values


def setting(name: str, explicit: str | None = None, flag: str | None = None) -> Setting:
    """One setting's value and source; `explicit` is the command-line value (None when not given)."""
    known = KNOWN[name]
    if explicit is not None:
        return Setting(name, explicit, flag or f"--{name.replace('_', '-')}")
    env = os.environ.get(known.env)
    if env:
        return Setting(name, env, f"env {known.env}")
    found = file_values().get(name)
    if found is not None:
        return Setting(name, found[0], f"{config_path()}:{found[1]}")
    default = known.default
    if name == "state":
        base = os.environ.get("XDG_STATE_HOME")
        source = "default ($XDG_STATE_HOME/sparkfleet)" if base else "default"
        default = str(Path(base or Path.home() / ".local" / "state") / "sparkfleet")
        return Setting(name, default, source)
    if known.path and default is not None:
        default = str(Path(default).expanduser())
    return Setting(name, default, "default")


def value(name: str, explicit: str | None = None) -> str | None:
    return setting(name, explicit).value


def _whole(text: str) -> bool:
    digits = text.strip()
    return digits.isascii() and digits.isdigit() and int(digits) >= 1  # isascii: '²' is a digit int() refuses


def fanout() -> int:
    """How many nodes a command talks to at once: the `fanout` setting (env, file or default). A bad value in
    the environment is the user's error, named with its source (the file's is refused where it is read)."""
    s = setting("fanout")
    if s.value is None or not _whole(s.value):
        raise UserError(f"fanout (from {s.source}): expected a whole number >= 1, got {s.value!r}")
    return int(s.value)
