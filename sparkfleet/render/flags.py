"""Flag dicts (YAML mappings of `--flag: value`) to argument tokens, in order."""

from __future__ import annotations

import json
from typing import Any, Literal


def flag_tokens(flags: dict[str, Any], lists: Literal["nargs", "repeat"] = "nargs") -> list[str]:
    """`true` is a bare flag, `false` drops it, a mapping is compact JSON, a list is several values.

    `lists="nargs"` gives `--flag a b` (engine arguments); `"repeat"` gives `--flag a --flag b`
    (docker options such as `--ulimit`).
    """
    out: list[str] = []
    for key, value in flags.items():
        if value is False:
            continue
        if value is True:
            out.append(key)
        elif isinstance(value, dict):
            out += [key, to_json(value)]
        elif isinstance(value, list):
            items = [to_json(v) if isinstance(v, dict | list) else scalar(v) for v in value]
            if lists == "repeat":
                for item in items:
                    out += [key, item]
            else:
                out += [key, *items]
        else:
            out += [key, scalar(value)]
    return out


def to_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
