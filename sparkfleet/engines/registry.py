"""Which engines there are: one line per engine, `name: "module:Class"`. Adding an engine is one
adapter module here, one command template under templates/ and one line below (README "Adding an engine").

Adapters are imported on first use, so the profile schema can read the names without importing them.
"""

from __future__ import annotations

from functools import cache
from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkfleet.engines.base import Engine

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
