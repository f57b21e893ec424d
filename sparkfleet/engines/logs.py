"""Engine logs -> facts: KV tokens, MoE backend, Engram mode per layer, autotune, fatal lines. Pure.

Each engine adapter names its lines in a LogVocabulary (vLLM's are REFERENCE.md §3 and the seeds';
llama.cpp's are in engines/llamacpp.py); `feed` folds any engine's log with its own
vocabulary. A WARNING line is never fatal: a fast-fail that matched WARNING killed a healthy boot in
the seeds (FM-50).

A line is what `tail` counts: text up to a `\n`. vLLM's lines carry a process prefix, coloured in
0.11-0.13 (`\x1b[1;36m(Worker_TP0 pid=N)\x1b[0;0m `, vllm/utils/__init__.py:3463 in 0.11.0,
vllm/utils/system_utils.py:178-181 in 0.13.0), and tqdm's progress bars rewrite one line with `\r`
(tqdm/std.py:457), so a line is matched on `text`: its last `\r` segment, without ANSI colour and
without the prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b.*")
WARNING = re.compile(r"\bWARN(ING)?\b")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PREFIX = re.compile(r"^\([^()\s]+(?: [^()\s]+)* pid=\d+\) ")  # vLLM's `(Name pid=N) `
# vLLM's record header, `%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] ` (vllm/logger.py:25, 0.11.0); a
# multi-line message (logger.exception's traceback) repeats it on every line after `\r\n`
# (logging_utils/formatter.py:78)
HEADER = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] ")


def shown(line: str) -> str:
    """What a terminal shows of one log line: its last non-blank `\r` segment (tqdm redraws its bar after
    a `\r`, and pads each display to the last one's length), colour kept."""
    segments = [seg for seg in line.rstrip("\n").split("\r") if ANSI.sub("", seg).strip()]
    return segments[-1] if segments else ""


def text(line: str) -> str:
    """What one log line says: the last non-blank `\r` segment, ANSI colour and the process prefix removed."""
    out = shown(ANSI.sub("", line))
    while m := PREFIX.match(out):  # a wrapper applied twice (pre-0.20 decorate_logs) prefixes twice
        out = out[m.end():]
    return out.rstrip()


def split_lines(stdout: str) -> list[str]:
    """The complete lines of a log read, as `tail` counts them: split on `\n` only (`str.splitlines()`
    also splits on `\r`, which tqdm writes between bar updates); a last line not yet ended by `\n` is
    left for the next read, which starts at it again."""
    return stdout.split("\n")[:-1]


@dataclass(frozen=True)
class LogVocabulary:
    """The lines one engine prints, as regexes; None where the engine has no such line.

    `kv_tokens` and `max_concurrency` capture a number (group 1 / group 2), `moe_backend` the backend
    (group 1), `engram_disk` layer, start, end. `phases` are (regex, phase) for the live display: the
    last one seen is where the boot is. `fatal` are the engine's own fatal signatures, added to the
    profile's `fatal_signatures`."""

    started: re.Pattern | None = None  # the process is up and says what it is
    loaded: re.Pattern | None = None  # the weights are in memory
    serving: re.Pattern | None = None  # the API answers
    kv_tokens: re.Pattern | None = None
    max_concurrency: re.Pattern | None = None
    moe_backend: re.Pattern | None = None
    engram_disk: re.Pattern | None = None
    engram_node_local: re.Pattern | None = None
    engram_layer_read: re.Pattern | None = None  # one Engram layer's read: layer (1), node-local or not (2)
    autotune_loaded: re.Pattern | None = None
    autotune_preloaded: re.Pattern | None = None
    rehome: re.Pattern | None = None
    phases: tuple[tuple[re.Pattern, str], ...] = ()
    fatal: tuple[str, ...] = ()
    expected: tuple[str, ...] = ()  # the profile's expect.log_lines: regexes looked for in every line as it comes


@dataclass
class LogFacts:
    """What one rank's log has said so far."""

    kv_tokens: int | None = None
    max_concurrency: float | None = None
    moe_backend_line: str | None = None
    moe_backend: str | None = None
    engram_rows: dict[int, tuple[int, int]] = field(default_factory=dict)  # layer -> [start, end)
    engram_node_local: bool = False
    engram_layer_local: dict[int, bool] = field(default_factory=dict)  # layer -> its boot line said node-local
    autotune_loaded: int | None = None
    autotune_preloaded: tuple[int, int] | None = None
    rehome_layers: int | None = None
    started: bool = False  # the engine said it is up (its `started` line)
    loaded: bool = False  # the engine said its weights are loaded
    api_up: bool = False
    fatal: str | None = None  # the first fatal line
    fatal_detail: str | None = None  # for a traceback: the exception line that ends it
    expected_seen: dict[str, str] = field(default_factory=dict)  # expected regex -> the first line it matched
    lines_seen: int = 0
    phase: str = "starting"  # the latest boot phase seen, for the live display

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["engram_rows"] = {str(k): list(v) for k, v in self.engram_rows.items()}
        d["engram_layer_local"] = {str(k): v for k, v in self.engram_layer_local.items()}
        return d


def fatal_match(line: str, signatures: list[str] | tuple[str, ...]) -> bool:
    """True when a fatal signature matches; WARNING lines never do."""
    if WARNING.search(line):
        return False
    return any(re.search(p, line) for p in signatures)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def feed(facts: LogFacts, lines: list[str], signatures: list[str], vocab: LogVocabulary) -> LogFacts:
    """Fold more lines into `facts` (in place, and returned) — call it as the log grows.

    `vocab` is the engine's (`engine_for(profile).log`): the reader has no engine of its own."""
    fatal = [*signatures, *vocab.fatal]
    for raw in lines:
        facts.lines_seen += 1
        line = text(raw)
        for pattern in vocab.expected:
            if pattern not in facts.expected_seen and re.search(pattern, line):
                facts.expected_seen[pattern] = line
        if vocab.kv_tokens and (m := vocab.kv_tokens.search(line)):
            facts.kv_tokens = _number(m.group(1))
        if vocab.max_concurrency and (m := vocab.max_concurrency.search(line)):
            facts.max_concurrency = float(m.group(2))
        if vocab.moe_backend and (m := vocab.moe_backend.search(line)):
            facts.moe_backend_line, facts.moe_backend = m.group(0), next(g for g in m.groups() if g)
        if vocab.engram_disk and (m := vocab.engram_disk.search(line)):
            facts.engram_rows[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
        if vocab.engram_node_local and vocab.engram_node_local.search(line):
            facts.engram_node_local = True
        if vocab.engram_layer_read and (m := vocab.engram_layer_read.search(line)):
            facts.engram_layer_local[int(m.group(1))] = m.group(2) == "node-local"
        if vocab.autotune_loaded and (m := vocab.autotune_loaded.search(line)):
            facts.autotune_loaded = int(m.group(1))
        if vocab.autotune_preloaded and (m := vocab.autotune_preloaded.search(line)):
            facts.autotune_preloaded = (int(m.group(1)), int(m.group(2)))
        if vocab.rehome and (m := vocab.rehome.search(line)):
            facts.rehome_layers = int(m.group(1))
        if vocab.started and vocab.started.search(line):
            facts.started = True
        if vocab.loaded and vocab.loaded.search(line):
            facts.loaded = True
        if vocab.serving and vocab.serving.search(line):
            facts.api_up = True
        for regex, phase in vocab.phases:
            if regex.search(line):
                facts.phase = phase
        if facts.fatal is None and fatal_match(line, fatal):
            facts.fatal = line.strip()
        elif facts.fatal and facts.fatal_detail is None and not EXCEPTION.match(HEADER.sub("", facts.fatal)) \
                and EXCEPTION.match(msg := HEADER.sub("", line)):
            # the exception a traceback (or vLLM's `EngineCore failed to start.` and the traceback
            # logger.exception prints under it, header on every line) ends with: what the report names
            facts.fatal_detail = msg.strip()
    return facts


def parse(log: str, signatures: list[str], vocab: LogVocabulary) -> LogFacts:
    """A whole log (ending with its last line's `\n`, as a file does) folded at once."""
    return feed(LogFacts(), split_lines(log if log.endswith("\n") else log + "\n"), signatures, vocab)
