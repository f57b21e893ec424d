"""`-o/--set KEY=VALUE`: ad-hoc profile overrides from the command line, applied after `extends`.

KEY is a dotted path into the profile (`flags.--gpu-memory-utilization`, `env.NCCL_DEBUG`,
`expect.kv_tokens`, `tp`, `served_names.0`); VALUE is parsed as YAML (`0.78` is a number, `[a, b]` a
list, `!unset` removes the key). A key is checked against the Profile model as it is walked, so a
misspelt field names itself and the fields that exist; the merged result is then validated by the
same model as a profile file, and errors name the `-o` they came from.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from sparkfleet.schema.errors import SpecError
from sparkfleet.schema.yamlsrc import UNSET, Marks


@dataclass(frozen=True)
class Override:
    key: str
    path: tuple[str | int, ...]
    value: Any  # parsed YAML; UNSET removes the key
    text: str  # KEY=VALUE as typed

    @property
    def shown(self) -> Any:
        """The value as recorded: `!unset` for a removal."""
        return "!unset" if self.value is UNSET else self.value

    @property
    def source(self) -> str:
        return f"-o {self.text}"


def parse(items: list[str] | None) -> list[Override]:
    """KEY=VALUE strings as Overrides; SpecError (naming the -o) for a malformed one."""
    from sparkfleet.schema.yamlsrc import _Loader  # the loader that knows `!unset`

    out = []
    for text in items or []:
        key, sep, raw = text.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise SpecError("expected KEY=VALUE with a dotted KEY (e.g. -o flags.--max-num-seqs=8)", f"-o {text}")
        try:
            value = yaml.load(raw, Loader=_Loader) if raw.strip() else ""  # noqa: S506 - SafeLoader subclass
        except yaml.YAMLError as exc:
            raise SpecError(f"VALUE is not valid YAML: {str(exc).splitlines()[0]}", f"-o {text}") from None
        path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
        out.append(Override(key, path, value, text))
    return out


def as_mapping(overrides: list[Override]) -> dict[str, Any]:
    """Overrides as recorded (run record, restore point, plan JSON): {KEY: value}, in the order given.

    A mapping, so a key named like a secret (env.HF_TOKEN) has its value redacted like any env var.
    """
    return {o.key: o.shown for o in overrides}


def from_mapping(recorded: dict[str, Any] | None) -> list[Override]:
    """Recorded overrides ({KEY: value}) back into Overrides."""
    out = []
    for key, shown in (recorded or {}).items():
        value = UNSET if shown == "!unset" else shown
        path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
        out.append(Override(key, path, value, f"{key}={json.dumps(shown)}"))
    return out


def apply(data: dict, overrides: list[Override], marks: Marks, model: type[BaseModel]) -> dict:
    """Set each override in the merged profile data (in place, in order); marks point at the -o."""
    for o in overrides:
        _check_path(o, model)
        node: Any = data
        for i, part in enumerate(o.path[:-1]):
            nxt = node.get(part) if isinstance(node, dict) else (
                node[part] if isinstance(node, list) and isinstance(part, int) and part < len(node) else None)
            if nxt is None:
                if isinstance(node, list):
                    raise SpecError(f"index {part} is past the end of the list ({len(node)} items)", o.source,
                                    field=".".join(map(str, o.path[:i + 1])))
                nxt = {}
                node[part] = nxt
            node = nxt
        last = o.path[-1]
        if isinstance(node, list):
            if not isinstance(last, int) or last > len(node) or (o.value is UNSET and last >= len(node)):
                raise SpecError(f"expected an index up to {len(node)} of the list", o.source, field=o.key)
            if o.value is UNSET:
                node.pop(last)
            elif last == len(node):
                node.append(o.value)
            else:
                node[last] = o.value
        elif isinstance(node, dict):
            if o.value is UNSET:
                node.pop(last, None)
            else:
                node[last] = o.value
        else:
            raise SpecError(f"{'.'.join(map(str, o.path[:-1]))} is a value, not a mapping or list", o.source,
                            field=o.key)
        _mark(marks, o)
    return data


def _mark(marks: Marks, o: Override) -> None:
    n = len(o.path)
    for key in [k for k in marks if k[:n] == o.path]:
        del marks[key]
    marks[o.path] = (o.source, None)  # type: ignore[assignment] - errors print "-o KEY=VALUE: field: ..."


def _check_path(o: Override, model: type[BaseModel]) -> None:
    """Walk the key through the model's fields; an unknown field names the ones that exist."""
    current: Any = model
    for i, part in enumerate(o.path):
        where = ".".join(map(str, o.path[:i])) or "the profile"
        target = _model_of(current)
        if target is not None:
            if not isinstance(part, str) or part not in target.model_fields:
                known = ", ".join(f for f in target.model_fields if f not in ("name",))
                raise SpecError(f"no field {part!r} in {where} (fields: {known})", o.source, field=o.key)
            if part == "name" and target is model:
                raise SpecError("the profile's name cannot be overridden", o.source, field=o.key)
            current = target.model_fields[part].annotation
            continue
        origin = typing.get_origin(_strip_optional(current))
        args = typing.get_args(_strip_optional(current))
        if origin is dict:
            current = args[1] if len(args) == 2 else Any
        elif origin is list:
            if not isinstance(part, int):
                raise SpecError(f"{where} is a list: expected an index (0, 1, ...), got {part!r}", o.source,
                                field=o.key)
            current = args[0] if args else Any
        elif current is Any:
            return
        else:
            raise SpecError(f"{where} is a single value ({_name(current)}), it has no {part!r}", o.source,
                            field=o.key)


def _strip_optional(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)) and len(args) == 1:
        return args[0]
    return tp


def _model_of(tp: Any) -> type[BaseModel] | None:
    tp = _strip_optional(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _name(tp: Any) -> str:
    tp = _strip_optional(tp)
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
