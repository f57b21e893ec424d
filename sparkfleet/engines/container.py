"""A rank's container as data (ContainerSpec), and the one place its `docker run` argv and shell are rendered.

Adapters build a ContainerSpec; nothing else writes `docker run` options. Readers (facts requests, the
mounts and storage checks, restore points) read its fields instead of parsing argv back out of text.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Bind:
    """A host-path bind mount (`-v source:target[:ro]`)."""

    source: str
    target: str
    readonly: bool = False
    field: str | None = None  # the profile field that names the source, for findings about it

    @property
    def option(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.readonly else "")

    @classmethod
    def parse(cls, text: str) -> Bind:
        """A profile's or patch set's `SRC:DST[:ro]` string."""
        source, _, rest = text.partition(":")
        target, _, opts = rest.partition(":")
        return cls(source, target, "ro" in opts.split(","))


@dataclass
class ContainerSpec:
    """Everything `docker run -d` is given for one rank, in the order it is rendered.

    `env` values of None pass the variable from the launching shell's environment (`-e NAME`): how a
    secret reaches the container without being in argv or a record. `ports` are what the rank listens
    on (host network: not published, but checked for conflicts), port -> what it is, with the profile
    field that sets it. `command` is the argv after the image; `command_text` is the same, as the
    engine's template printed it. A bind's `field` names the profile field its source comes from.
    """

    name: str
    image: str
    command: list[str]
    command_text: str
    labels: dict[str, str] = field(default_factory=dict)
    options: list[list[str]] = field(default_factory=list)  # the profile's `docker:` options, one per flag
    mounts: list[Bind] = field(default_factory=list)
    env: dict[str, str | None] = field(default_factory=dict)
    ports: dict[int, str] = field(default_factory=dict)
    entrypoint: str | None = None

    @property
    def devices(self) -> list[str]:
        """Host devices handed to the container (`--device`, and `--gpus` as `gpus:<value>`)."""
        out = []
        for group in self.options:
            for flag, value in zip(group[::2], group[1::2], strict=False):
                if flag == "--device":
                    out.append(value)
                elif flag == "--gpus":
                    out.append(f"gpus:{value}")
        return out

    @property
    def bind_sources(self) -> list[str]:
        """Normalised host paths of the binds, each once, in order."""
        out: list[str] = []
        for b in self.mounts:
            src = posixpath.normpath(b.source)
            if src not in out:
                out.append(src)
        return out

    def source_of(self, target: str) -> str | None:
        """The host path bound at `target`, or None."""
        return next((posixpath.normpath(b.source) for b in self.mounts if b.target == target), None)

    def env_items(self) -> dict[str, str]:
        """The env as a launch reports it: pass-through variables with an empty value, never the secret."""
        return {k: ("" if v is None else v) for k, v in self.env.items()}

    def as_dict(self) -> dict:
        return {"name": self.name, "image": self.image, "labels": dict(self.labels),
                "options": [list(g) for g in self.options],
                "mounts": [{"source": b.source, "target": b.target, "readonly": b.readonly} for b in self.mounts],
                "env": self.env_items(), "ports": {str(k): v for k, v in self.ports.items()},
                "entrypoint": self.entrypoint, "devices": self.devices,
                "command": list(self.command)}


def _lines(spec: ContainerSpec) -> list[tuple[str, list[str]]]:
    """(indent, tokens) per shell line of the docker part; the layout the plans have always shown."""
    lines: list[tuple[str, list[str]]] = [("", ["docker", "run", "-d", "--name", spec.name])]
    lines += [("  ", ["--label", f"{k}={v}"]) for k, v in spec.labels.items()]
    lines += [(" ", list(g)) for g in spec.options]
    if spec.entrypoint is not None:
        lines.append(("  ", ["--entrypoint", spec.entrypoint]))
    lines += [("  ", ["-v", b.option]) for b in spec.mounts]
    lines += [("  ", ["-e", k if v is None else f"{k}={v}"]) for k, v in spec.env.items()]
    lines.append(("  ", [spec.image]))
    return lines


def docker_argv(spec: ContainerSpec) -> list[str]:
    """The `docker run` argv of a spec."""
    return [t for _, tokens in _lines(spec) for t in tokens] + list(spec.command)


def docker_script(spec: ContainerSpec) -> str:
    """The same launch as one quoted shell command, one option per line (what runs on the node). It
    splits back into `docker_argv(spec)` by construction: every docker token is shlex-quoted here, and
    `command` is the split of `command_text` (engines.base.render_command)."""
    head = "".join(indent + " ".join(shlex.quote(t) for t in tokens) + " \\\n" for indent, tokens in _lines(spec))
    return head + spec.command_text
