"""Engine adapters: render each rank's launch and (later) turn engine logs into facts."""

from __future__ import annotations

from sparkfleet.engines.base import Engine, LaneContext, Launch
from sparkfleet.engines.sglang import SGLang
from sparkfleet.engines.tensorfold import TensorFold
from sparkfleet.engines.vllm import Vllm

ENGINES: dict[str, Engine] = {"vllm": Vllm(), "tensorfold": TensorFold(), "sglang": SGLang()}

__all__ = ["ENGINES", "Engine", "Launch", "LaneContext"]
