"""`sparkfleet watch --unit`: a systemd service unit that runs this very watch command (pure rendering).

systemd does not parse ExecStart= as a shell does: words are split on whitespace, double quotes
group, `%` starts a specifier and `$` an environment expansion. Every value the template prints goes
through `word` (or `env` for Environment=), so a path with a space or a `%` stays one argument.
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2

from sparkfleet.spec.errors import SpecError

TEMPLATE = "watch.service.j2"
_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


def word(value: object) -> str:
    """One ExecStart= argument, quoted for systemd."""
    s = str(value).replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def env(assignment: str) -> str:
    """One Environment= assignment (NAME=value) quoted for systemd (specifiers expand there, $ does not)."""
    s = assignment.replace("%", "%%")
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_name(profile: str) -> str:
    return f"sparkfleet-watch-{profile}.service"


def render(template_dir: Path, profile: str, argv: list[str], environment: dict[str, str],
           stop_timeout_s: float, docs: Path, api_key_env: str | None = None) -> str:
    """The unit text. `argv` is the full command (executable first), `environment` what it needs set."""
    jenv = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)), undefined=jinja2.StrictUndefined,
                              autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    jenv.filters["word"] = word
    try:
        return jenv.get_template(TEMPLATE).render(
            profile=profile, unit_name=unit_name(profile), argv=argv, environment=sorted(environment.items()),
            env=env, stop_timeout_s=int(stop_timeout_s), docs=docs, api_key_env=api_key_env)
    except jinja2.TemplateNotFound:
        raise SpecError(f"template {TEMPLATE!r} not found", str(template_dir)) from None
    except jinja2.UndefinedError as exc:
        raise SpecError(f"template needs a value that is not set: {exc.message}", f"templates/{TEMPLATE}") from None
