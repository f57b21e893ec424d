"""What differs between two sets of launches, per rank: flags, env, mounts, image, options, files. Pure.

Used by `sparkfleet diff`, `plan --against` and `restore` (today's render against the recorded one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DOCKER_BOOL = frozenset({"-d", "--detach", "--rm", "--init", "--privileged", "-i", "-t"})
IDENTITY = ("--name", "--label")  # sparkfleet's own container identity: never a difference in the lane


def parse_docker_argv(argv: list[str]) -> dict[str, Any]:
    """A `docker run` argv in parts: options, env, mounts, image, command words and engine flags.

    Anything that is not `docker run ...` is kept whole as its command words."""
    if argv[:2] != ["docker", "run"]:
        return {"options": [], "env": {}, "mounts": [], "image": None, "command": list(argv), "flags": {},
                "labels": {}, "name": None}
    i, options, env, mounts, labels, name = 2, [], {}, [], {}, None
    while i < len(argv) and argv[i].startswith("-"):
        opt = argv[i]
        if opt in DOCKER_BOOL:
            value, i = None, i + 1
        elif opt.startswith("--") and "=" in opt:
            opt, value = opt.split("=", 1)
            i += 1
        else:
            value, i = (argv[i + 1] if i + 1 < len(argv) else None), i + 2
        if opt in ("-e", "--env"):
            key, _, val = (value or "").partition("=")
            env[key] = val
        elif opt in ("-v", "--volume"):
            mounts.append(value)
        elif opt == "--label":
            k, _, v = (value or "").partition("=")
            labels[k] = v
        elif opt == "--name":
            name = value
        else:
            options.append(opt if value is None else f"{opt} {value}")
    image = argv[i] if i < len(argv) else None
    rest = argv[i + 1:]
    j = next((k for k, t in enumerate(rest) if t.startswith("--")), len(rest))
    flags: dict[str, list] = {}
    key = None
    for t in rest[j:]:
        if t.startswith("--"):
            key = t
            flags.setdefault(key, [])
        elif key is not None:
            flags[key].append(t)
    return {"options": options, "env": env, "mounts": sorted(m for m in mounts if m), "image": image,
            "command": rest[:j], "flags": {k: json_values(v) for k, v in flags.items()}, "labels": labels,
            "name": name}


def json_values(values: list[str]) -> list:
    """A single JSON-valued argument compares as JSON (key spacing is not a difference to the engine)."""
    if len(values) == 1 and values[0][:1] in "{[":
        try:
            return [json.loads(values[0])]
        except ValueError:
            pass
    return values


@dataclass
class Change:
    kind: str  # node | image | option | mount | env | flag | command | file
    key: str
    a: Any
    b: Any

    def as_dict(self) -> dict:
        return {"kind": self.kind, "key": self.key, "a": self.a, "b": self.b}

    def line(self) -> str:
        return f"{self.kind} {self.key}: {show_value(self.a)} -> {show_value(self.b)}"


@dataclass
class RankDiff:
    rank: int
    node_a: str | None
    node_b: str | None
    changes: list[Change] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"rank": self.rank, "node_a": self.node_a, "node_b": self.node_b,
                "changes": [c.as_dict() for c in self.changes]}


def show_value(v: Any) -> str:
    """A value as one short line for tables and messages."""
    if v is None:
        return "(none)"
    if isinstance(v, list):
        return " ".join(json.dumps(x, separators=(",", ":")) if isinstance(x, dict | list) else str(x) for x in v) \
            or "(bare)"
    return str(v)


def _dict_changes(kind: str, a: dict, b: dict) -> list[Change]:
    return [Change(kind, k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b), key=str) if a.get(k) != b.get(k)]


def _list_changes(kind: str, a: list, b: list) -> list[Change]:
    out = [Change(kind, x, x, None) for x in a if x not in b]
    return out + [Change(kind, x, None, x) for x in b if x not in a]


def _by_target(mounts: list[str]) -> dict[str, str]:
    """`-v SRC:DST[:ro]` as DST -> SRC[:ro], so a moved source reads as one change of that mount."""
    out = {}
    for m in mounts:
        src, _, rest = m.partition(":")
        dst, _, opts = rest.partition(":")
        out[dst or src] = src + (f" ({opts})" if opts else "")
    return out


def launch_changes(a: dict | None, b: dict | None) -> list[Change]:
    """One rank's launch `a` against `b` (dicts with argv and files, as plans and records hold them)."""
    if a is None or b is None:
        return [Change("rank", "launch", "present" if a else None, "present" if b else None)]
    pa, pb = parse_docker_argv(a.get("argv") or []), parse_docker_argv(b.get("argv") or [])
    out: list[Change] = []
    if a.get("node") != b.get("node"):
        out.append(Change("node", "node", a.get("node"), b.get("node")))
    if pa["image"] != pb["image"]:
        out.append(Change("image", "image", pa["image"], pb["image"]))
    out += _list_changes("option", pa["options"], pb["options"])
    out += _dict_changes("mount", _by_target(pa["mounts"]), _by_target(pb["mounts"]))
    out += _dict_changes("env", pa["env"], pb["env"])
    if pa["command"] != pb["command"]:
        out.append(Change("command", "command", pa["command"], pb["command"]))
    out += _dict_changes("flag", pa["flags"], pb["flags"])
    fa, fb = a.get("files") or {}, b.get("files") or {}
    out += [Change("file", k, "(differs)" if k in fa else None, "(differs)" if k in fb else None)
            for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    if not out and (a.get("argv") != b.get("argv")) and pa["labels"] == pb["labels"]:
        out.append(Change("argv", "order", None, None))  # same parts, another order
    return out


def diff_launches(a: list[dict], b: list[dict]) -> list[RankDiff]:
    """Per rank (matched by rank number), what differs from `a` to `b`; ranks with no difference are left out."""
    by_a = {int(x["rank"]): x for x in a}
    by_b = {int(x["rank"]): x for x in b}
    out = []
    for rank in sorted(set(by_a) | set(by_b)):
        la, lb = by_a.get(rank), by_b.get(rank)
        changes = launch_changes(la, lb)
        if changes:
            out.append(RankDiff(rank, la.get("node") if la else None, lb.get("node") if lb else None, changes))
    return out
