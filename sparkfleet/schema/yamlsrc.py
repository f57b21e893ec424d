"""YAML loading that remembers where every key came from, so errors can name file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sparkfleet.schema.errors import SpecError

Path_ = tuple[str | int, ...]
Marks = dict[Path_, tuple[str, int]]


class Unset:
    """The `!unset` tag: removes the key it is set on when merging over a base profile."""

    _instance: Unset | None = None

    def __new__(cls) -> Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "!unset"


UNSET = Unset()


def _convert(loader: yaml.SafeLoader, node: yaml.Node, path: Path_, file: str, marks: Marks) -> Any:
    if node.tag == "!unset":
        return UNSET
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool):
                raise SpecError("mapping keys must be plain scalars", file, key_node.start_mark.line + 1)
            key = str(key) if not isinstance(key, str) else key
            if key in out:
                raise SpecError(f"duplicate key {key!r}", file, key_node.start_mark.line + 1,
                                ".".join(str(p) for p in path + (key,)))
            marks[path + (key,)] = (file, key_node.start_mark.line + 1)
            out[key] = _convert(loader, value_node, path + (key,), file, marks)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            marks[path + (i,)] = (file, item.start_mark.line + 1)
            items.append(_convert(loader, item, path + (i,), file, marks))
        return items
    return loader.construct_object(node, deep=True)


class _Loader(yaml.SafeLoader):
    pass


class _FastLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser when present: ~10x faster
    pass


for _cls in (_Loader, _FastLoader):
    _cls.add_constructor("!unset", lambda loader, node: UNSET)


def load_yaml(path: Path, display: str | None = None) -> tuple[Any, Marks]:
    """Load one YAML document; returns the data and a map from key path to (file, line)."""
    file = display or str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError("file not found", file) from None
    except OSError as exc:
        raise SpecError(f"cannot read: {exc.strerror}", file) from None
    return load_text(text, file)


def load_text(text: str, file: str) -> tuple[Any, Marks]:
    """load_yaml of text already read (a file about to be written, checked before it is)."""
    try:
        return _load(_FastLoader, text, file)
    except yaml.YAMLError:
        return _load(_Loader, text, file)  # the pure-Python parser words its errors as users know them


def _load(cls: type, text: str, file: str) -> tuple[Any, Marks]:
    loader = cls(text)
    marks: Marks = {}
    try:
        node = loader.get_single_node()
        if node is None:
            return {}, marks
        marks[()] = (file, node.start_mark.line + 1)
        return _convert(loader, node, (), file, marks), marks
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        msg = f"malformed YAML: {exc.problem or exc.context}"
        if exc.context and exc.context_mark and exc.problem:
            msg += f" ({exc.context} started at line {exc.context_mark.line + 1})"
        if cls is not _Loader:
            raise
        raise SpecError(msg, file, line) from None
    except yaml.YAMLError as exc:
        if cls is not _Loader:
            raise
        raise SpecError(f"malformed YAML: {exc}", file) from None
    finally:
        loader.dispose()


def locate(marks: Marks, loc: Path_) -> tuple[str | None, int | None]:
    """The file and line of the deepest known prefix of `loc`."""
    for n in range(len(loc), -1, -1):
        hit = marks.get(tuple(loc[:n]))
        if hit:
            return hit
    return None, None
