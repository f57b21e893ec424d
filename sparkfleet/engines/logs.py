"""Engine logs -> facts: KV tokens, MoE backend, Engram mode per layer, autotune, fatal lines. Pure.

Line formats are vLLM's (REFERENCE.md §3) and the seeds' (CATALOG.md §5.2). A WARNING line is never
fatal: a fast-fail that matched WARNING killed a healthy boot in the seeds (FM-50).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
MAX_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
MOE_BACKEND = re.compile(r"Using '([A-Za-z0-9_]+)' \w+ MoE backend")
ENGRAM_DISK = re.compile(r"Engram DISK mode: layer (\d+) rows \[(\d+), (\d+)\)")
NODE_LOCAL = re.compile(r"read from node-local")
AUTOTUNE_LOADED = re.compile(r"Loaded (\d+) configs")
AUTOTUNE_PRELOADED = re.compile(r"Preloaded (\d+)/(\d+)")
REHOME = re.compile(r"rehome done layers=(\d+)")
API_UP = re.compile(r"Application startup complete|Starting vLLM API server")
EXCEPTION = re.compile(r"^(\(\w+ pid=\d+\) )?[\w.]*(Error|Exception|Interrupt)\b.*")
WARNING = re.compile(r"\bWARN(ING)?\b")


@dataclass
class LogFacts:
    """What one rank's log has said so far."""

    kv_tokens: int | None = None
    max_concurrency: float | None = None
    moe_backend_line: str | None = None
    moe_backend: str | None = None
    engram_rows: dict[int, tuple[int, int]] = field(default_factory=dict)  # layer -> [start, end)
    engram_node_local: bool = False
    autotune_loaded: int | None = None
    autotune_preloaded: tuple[int, int] | None = None
    rehome_layers: int | None = None
    api_up: bool = False
    fatal: str | None = None  # the first fatal line
    fatal_detail: str | None = None  # for a traceback: the exception line that ends it
    lines_seen: int = 0
    phase: str = "starting"  # the latest boot phase seen, for the live display

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["engram_rows"] = {str(k): list(v) for k, v in self.engram_rows.items()}
        return d


PHASES = [  # (regex, phase name): the last matching one is where the boot is
    (re.compile(r"[Ll]oading (model )?weights|Loading safetensors"), "loading weights"),
    (ENGRAM_DISK, "engram"),
    (KV_TOKENS, "kv cache"),
    (re.compile(r"[Cc]apturing CUDA graph|Graph capturing"), "capturing graphs"),
    (re.compile(r"[Aa]utotun"), "autotune"),
    (API_UP, "serving"),
]


def fatal_match(line: str, signatures: list[str]) -> bool:
    """True when a fatal signature matches; WARNING lines never do."""
    if WARNING.search(line):
        return False
    return any(re.search(p, line) for p in signatures)


def feed(facts: LogFacts, lines: list[str], signatures: list[str]) -> LogFacts:
    """Fold more lines into `facts` (in place, and returned) — call it as the log grows."""
    for line in lines:
        facts.lines_seen += 1
        if m := KV_TOKENS.search(line):
            facts.kv_tokens = int(m.group(1).replace(",", ""))
        if m := MAX_CONCURRENCY.search(line):
            facts.max_concurrency = float(m.group(2))
        if m := MOE_BACKEND.search(line):
            facts.moe_backend_line, facts.moe_backend = m.group(0), m.group(1)
        if m := ENGRAM_DISK.search(line):
            facts.engram_rows[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
        if NODE_LOCAL.search(line):
            facts.engram_node_local = True
        if m := AUTOTUNE_LOADED.search(line):
            facts.autotune_loaded = int(m.group(1))
        if m := AUTOTUNE_PRELOADED.search(line):
            facts.autotune_preloaded = (int(m.group(1)), int(m.group(2)))
        if m := REHOME.search(line):
            facts.rehome_layers = int(m.group(1))
        if API_UP.search(line):
            facts.api_up = True
        for regex, phase in PHASES:
            if regex.search(line):
                facts.phase = phase
        if facts.fatal is None and fatal_match(line, signatures):
            facts.fatal = line.strip()
        elif facts.fatal and facts.fatal.startswith("Traceback") and facts.fatal_detail is None \
                and EXCEPTION.search(line):
            facts.fatal_detail = line.strip()
    return facts


def parse(text: str, signatures: list[str]) -> LogFacts:
    return feed(LogFacts(), text.splitlines(), signatures)
