"""`extends:` merging: dicts deep-merged, lists and scalars replaced, `!unset` removes a key."""

from __future__ import annotations

from typing import Any

from sparkfleet.schema.yamlsrc import UNSET, Marks, Path_


def deep_merge(base: Any, over: Any, base_marks: Marks, over_marks: Marks, path: Path_ = ()) -> Any:
    """Merge `over` onto `base`; `base_marks` is updated in place so every key keeps its source."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            sub = path + (key,)
            if value is UNSET:
                out.pop(key, None)
                _drop_marks(base_marks, sub)
                if sub in over_marks:  # errors about a removed key point at the `!unset`
                    base_marks[sub] = over_marks[sub]
                continue
            if key in out and isinstance(out[key], dict) and isinstance(value, dict):
                if sub in over_marks:
                    base_marks[sub] = over_marks[sub]
                out[key] = deep_merge(out[key], value, base_marks, over_marks, sub)
            else:
                _drop_marks(base_marks, sub)
                _copy_marks(over_marks, base_marks, sub)
                out[key] = strip_unset(value)
        return out
    _drop_marks(base_marks, path)
    _copy_marks(over_marks, base_marks, path)
    return strip_unset(over)


def strip_unset(value: Any) -> Any:
    """Remove `!unset` markers left in data that had nothing to remove them from."""
    if isinstance(value, dict):
        return {k: strip_unset(v) for k, v in value.items() if v is not UNSET}
    if isinstance(value, list):
        return [strip_unset(v) for v in value if v is not UNSET]
    return value


def _drop_marks(marks: Marks, prefix: Path_) -> None:
    n = len(prefix)
    for key in [k for k in marks if k[:n] == prefix and len(k) > n]:
        del marks[key]


def _copy_marks(src: Marks, dst: Marks, prefix: Path_) -> None:
    n = len(prefix)
    for key, value in src.items():
        if key[:n] == prefix:
            dst[key] = value
