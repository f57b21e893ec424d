"""Jinja2 rendering where every `{{ expression }}` comes out shell-quoted, by construction."""

from __future__ import annotations

import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from sparkfleet.schema.errors import SpecError


def _quote(value: Any) -> str:
    # finalize runs on every {{ }} output: nothing reaches the shell unquoted
    if value is None:
        raise ValueError("a template printed None; a value the launch needs is unset")
    if isinstance(value, bool):
        value = "true" if value else "false"
    return shlex.quote(str(value))


@lru_cache(maxsize=8)
def environment(template_dir: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir),
        undefined=jinja2.StrictUndefined,
        finalize=_quote,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(template_dir: Path, name: str, context: dict[str, Any]) -> str:
    """Render `templates/<name>` with StrictUndefined; a missing value is a SpecError naming it."""
    env = environment(str(template_dir))
    try:
        return env.get_template(name).render(**context)
    except jinja2.TemplateNotFound:
        raise SpecError(f"template {name!r} not found", str(template_dir)) from None
    except ValueError as exc:
        raise SpecError(str(exc), f"templates/{name}") from None
    except jinja2.UndefinedError as exc:
        raise SpecError(f"template needs a value that is not set: {exc.message}", f"templates/{name}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise SpecError(f"template syntax: {exc.message}", f"templates/{name}", exc.lineno) from None


def to_argv(command: str) -> list[str]:
    """Split a rendered one-command shell line back into argv (continuation lines allowed)."""
    return shlex.split(command.replace("\\\n", " "), comments=True)
