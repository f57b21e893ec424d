"""`sparkfleet watch --unit`: a systemd service unit that runs this very watch command (pure rendering).

systemd does not parse ExecStart= as a shell does: words are split on whitespace, double quotes
group, `%` starts a specifier and `$` an environment expansion. Every value the template prints goes
through `word` (or `env` for Environment=), so a path with a space or a `%` stays one argument.
"""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path

import jinja2

from sparkfleet.schema.errors import SpecError

TEMPLATE = "watch.service.j2"
_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


def word(value: object) -> str:
    """One ExecStart= argument, quoted for systemd."""
    s = str(value).replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def path(value: object) -> str:
    """A whole-line setting (User=, WorkingDirectory=): no quoting there, only `%` is special."""
    s = str(value)
    if "\n" in s:
        raise SpecError(f"{s!r}: a unit setting cannot hold a newline")
    return s.replace("%", "%%")


def env(assignment: str) -> str:
    """One Environment= assignment (NAME=value) quoted for systemd (specifiers expand there, $ does not)."""
    s = assignment.replace("%", "%%")
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def without(argv: list[str], drop: dict[str, int]) -> list[str]:
    """argv without the options in `drop` ({option: how many values follow it}; `--opt=value` too)."""
    out, skip = [], 0
    for word in argv:
        if skip:
            skip -= 1
            continue
        name = word.split("=", 1)[0] if word.startswith("--") else word
        if name in drop:
            skip = drop[name] if "=" not in word else 0
            continue
        out.append(word)
    return out


def invoking_user() -> str:
    """Who runs this (under sudo: who ran sudo), for the unit's User=: never root by accident."""
    return os.environ.get("SUDO_USER") or pwd.getpwuid(os.getuid()).pw_name


def unit_name(profile: str) -> str:
    return f"sparkfleet-watch-{profile}.service"


def render(template_dir: Path, profile: str, argv: list[str], environment: dict[str, str],
           stop_timeout_s: float, docs: Path, api_key_env: str | None = None, user: str | None = None,
           working_directory: Path | None = None) -> str:
    """The unit text. `argv` is the full command (executable first), `environment` what it needs set."""
    jenv = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)), undefined=jinja2.StrictUndefined,
                              autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    jenv.filters["word"] = word
    jenv.filters["path"] = path
    try:
        return jenv.get_template(TEMPLATE).render(
            profile=profile, unit_name=unit_name(profile), argv=argv, environment=sorted(environment.items()),
            env=env, stop_timeout_s=int(stop_timeout_s), docs=docs, api_key_env=api_key_env, user=user,
            working_directory=working_directory)
    except jinja2.TemplateNotFound:
        raise SpecError(f"template {TEMPLATE!r} not found", str(template_dir)) from None
    except jinja2.UndefinedError as exc:
        raise SpecError(f"template needs a value that is not set: {exc.message}", f"templates/{TEMPLATE}") from None
