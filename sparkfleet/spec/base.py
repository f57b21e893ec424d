"""Shared pydantic base and the conversion of validation errors into file:line messages."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from sparkfleet.spec.errors import SpecError
from sparkfleet.spec.yamlsrc import Marks, locate

M = TypeVar("M", bound=BaseModel)


class FieldError(ValueError):
    """A validator's error about one key inside the field (a flag name, an env var, a sub-field)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


class Strict(BaseModel):
    """Unknown fields are errors; nothing downstream re-checks what this validated."""

    model_config = ConfigDict(extra="forbid", frozen=False)


def validate(model: type[M], data: Any, marks: Marks, file: str, prefix: tuple = ()) -> M:
    """Validate `data` as `model`, turning the first pydantic error into a SpecError."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = prefix + tuple(p for p in err["loc"] if not _is_union_tag(p))
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            loc += (cause.key,)
        where_file, line = locate(marks, loc)
        field = ".".join(str(p) for p in loc) or None
        msg = _describe(err)
        raise SpecError(msg, where_file or file, line, field) from None


def _is_union_tag(part: Any) -> bool:
    # pydantic inserts the chosen union member ("str", "list[str]", "function-after[...]") into loc
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool", "list", "dict"})


def _describe(err: dict) -> str:
    kind = err["type"]
    got = err.get("input")
    if kind == "extra_forbidden":
        return "unknown field (check the spelling; README 'Writing a profile' and spec/profile.py list the fields)"
    if kind == "missing":
        return "required field is missing"
    if kind == "value_error":
        return str((err.get("ctx") or {}).get("error") or err["msg"])
    shown = repr(got)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{err['msg']} (got {shown})"
