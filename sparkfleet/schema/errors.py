"""Errors a user can fix: each names the file, the line and the field, and what was expected."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpecError(Exception):
    """Bad input in a YAML file (or a reference between files)."""

    message: str
    file: str | None = None
    line: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "")
        parts = [p for p in (where, self.field) if p]
        return (": ".join(parts) + ": " if parts else "") + self.message


class UserError(Exception):
    """Any other mistake the user can fix (a missing profile, a bad option); no traceback."""


class Busy(UserError):
    """Someone else holds what the command needs (the fleet lock): try again later (exit 75)."""
