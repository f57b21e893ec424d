"""What every gate gets: the client, the model name to send, the profile's switches and the options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sparkfleet.gates.client import ApiClient

NEEDLE_DEFAULT = (32_768,)  # HLT-41: "a needle at 32K"
# HLT-57/47: 128K (DCP validation) and long_check.py's exact lengths
NEEDLE_LONG = (20_000, 131_072, 131_073, 145_152, 146_421, 149_796, 160_000, 300_000, 500_000)


@dataclass(frozen=True)
class MemSample:
    """One node's memory at one moment, with the lines it must stay above (bytes; None = no line)."""

    available: int | None
    floor: int | None = None  # the profile's expect.mem_available_floor_gb for the node's role
    sigterm: int | None = None  # earlyoom's SIGTERM threshold
    error: str | None = None  # why the node could not be read


# Called from the soak's sampling thread: node name -> its sample now.
MemSampler = Callable[[], dict[str, MemSample]]


@dataclass
class GateOptions:
    needle_tokens: tuple[int, ...] = NEEDLE_DEFAULT
    needle_depth: float = 0.5  # where the needle sits in the filler (0 = start, 1 = end)
    soak_seconds: float = 120.0  # HLT-44; the seeds ran 8-way for 12 and 20 minutes
    soak_streams: int = 8
    soak_sample_s: float = 10.0  # MemAvailable sampling period during the soak
    soak_max_errors: int = 10  # stop early: the gate has failed and the load only hides the cause
    mem_sampler: MemSampler | None = None
    determinism_prompts: int = 8  # HLT-50: 8 of 8 identical
    reasoning_effort: str | int | None = None  # sent with the reasoning gate when set; never "medium"
    timeout_s: float = 600.0  # per request
    api_key: str | None = None  # the key itself (from the env var the profile names)

    def __post_init__(self) -> None:
        if isinstance(self.reasoning_effort, str) and self.reasoning_effort.lower() == "medium":
            # The DeepSeek-V4.1 chat template rejects it (LCH-G11); the gate would test nothing.
            raise ValueError("reasoning_effort 'medium' is rejected by the V4.1 template; use low, high, max "
                             "or a number")
        if not 0.0 <= self.needle_depth <= 1.0:
            raise ValueError("needle_depth must be between 0 and 1")
        if self.soak_streams < 1:
            raise ValueError("soak_streams must be at least 1")
        if any(n < 256 for n in self.needle_tokens):
            raise ValueError("needle sizes must be at least 256 tokens")


@dataclass
class GateEnv:
    client: ApiClient
    model: str
    served_names: list[str]
    vision: bool
    tools: bool
    api_key_env: str | None
    options: GateOptions = field(default_factory=GateOptions)

    def body(self, messages: list[dict], *, max_tokens: int, thinking: bool = False, **extra) -> dict:
        """A chat body at temperature 0 with thinking set explicitly (lane defaults differ)."""
        return {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                "chat_template_kwargs": {"thinking": thinking}, **extra}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]
