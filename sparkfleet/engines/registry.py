"""Which engines there are: one line per engine, `name: "module:Class"`. Adding an engine is one
adapter module here, one command template under templates/ and one line below (README "Adding an engine").

Adapters are imported on first use. The profile schema knows no engine: `check_lane` (which the loader
runs, sparkfleet/opsdir.py) judges a lane's `engine:` and the fields its adapter needs.
"""

from __future__ import annotations

from functools import cache
from importlib import import_module
from typing import TYPE_CHECKING

from sparkfleet.schema.errors import SpecError
from sparkfleet.schema.yamlsrc import locate

if TYPE_CHECKING:
    from sparkfleet.engines.base import Engine
    from sparkfleet.schema.load import Loaded

ADAPTERS: dict[str, str] = {
    "vllm": "sparkfleet.engines.vllm:Vllm",
    "tensorfold": "sparkfleet.engines.tensorfold:TensorFold",
    "sglang": "sparkfleet.engines.sglang:SGLang",
    "llamacpp": "sparkfleet.engines.llamacpp:LlamaCpp",
}

NAMES: tuple[str, ...] = tuple(ADAPTERS)


@cache
def engine_for(name: str) -> Engine:
    """The adapter of engine `name` (a profile's `engine:`, already validated against NAMES)."""
    module, _, cls = ADAPTERS[name].partition(":")
    return getattr(import_module(module), cls)()


def check_lane(loaded: Loaded) -> None:
    """A lane names a known engine and sets every field its adapter needs; else a SpecError at the field."""

    p = loaded.profile

    def error(field: str, message: str) -> SpecError:
        file, line = locate(loaded.marks, (field,))
        return SpecError(message, file or loaded.chain[-1], line, field)

    if p.engine not in ADAPTERS:
        raise error("engine", f"Input should be {', '.join(repr(n) for n in NAMES[:-1])} or {NAMES[-1]!r}")
    missing = [f for f in engine_for(p.engine).required if getattr(p, f) is None]
    if missing:
        raise error(missing[0], f"a lane needs {', '.join(missing)} (set them here or in the profile it extends, "
                    "or mark this file abstract: true)")
