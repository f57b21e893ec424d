"""Same-window CTL → CAND → CTL brackets with pre-registered bars (GATE-01..12).

`up` the control and bench it, `up` the candidate and bench it, `up` the control again and bench it;
then read every barred cell of the candidate against the mean of its two controls. The bars file is
read and checked before any lane is touched (pre-registered). Controls that disagree by more than the
drift band on a barred cell make the window invalid (GATE-02/09/11). The bracket never promotes: it
ends with the control serving and prints the decision for a person (GATE-12).

Bars file (YAML)::

    drift_band: 3%            # |control-1 - control-2| / their mean, per barred cell (default 3%)
    bench:                    # how every arm is benched (identical for all three)
      prompt_set: v1          # or a file
      concurrency: [1, 8]
      categories: [code, prose]   # optional; default every category
      ignore_eos: false
      max_tokens: null
      prefill: false
      prefill_tokens: [2048, 8192]
    bars:
      aggregate.C1: ">= -2%"                  # mean of the categories, relative to the control mean
      decode.code.C8: "control_mean * (1 - max(2%, 1.5 * control_spread))"   # the seeds' drafter rule
      decode.prose.C1: ">= 105"               # an absolute bar (GATE-13)
      ttft.C1: "<= +10%"                      # lower is better: a ceiling

Cell keys: METRIC[.CATEGORY].C<N> with METRIC one of aggregate, decode (per-stream), ttft, acceptance
(mean acceptance length); without a category the cell is the mean of the categories (the mean row of
the report). `prefill.<TOKENS>` is the cold prefill tok/s at that target length. An acceptance bar is
refused unless its cell holds at least 200 requests (concurrency x categories): on fewer it is noise (FM-60).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from sparkfleet.bench import promptsets
from sparkfleet.bench.report import mean_row
from sparkfleet.bench.runner import BenchOptions, BenchResult, Cell
from sparkfleet.gates.client import RequestFailed

# FM-60: the seeds' acceptance gate on 8 prompts a class was noise; they gate on 200 prompts
ACCEPTANCE_MIN_REQUESTS = 200
DEFAULT_DRIFT_BAND = 0.03  # GATE-03: "the reference itself drifts about 3% day to day"
METRICS: dict[str, Callable[[Cell], float | None]] = {
    "aggregate": lambda c: c.aggregate_tps,
    "decode": lambda c: c.decode_tps,
    "ttft": lambda c: c.ttft_s,
    "acceptance": lambda c: c.acceptance["mean_acceptance_length"] if c.acceptance else None,
}
ARMS = ("control-1", "candidate", "control-2")
_PCT = r"([+-]?\d+(?:\.\d+)?)\s*%"
_RELATIVE = re.compile(rf"^(>=|<=)\s*{_PCT}$")
_ABSOLUTE = re.compile(r"^(>=|<=)\s*([+-]?\d+(?:\.\d+)?)$")
_DRAFTER = re.compile(rf"^control_mean\s*\*\s*\(\s*1\s*-\s*max\(\s*{_PCT}\s*,\s*(\d+(?:\.\d+)?)\s*\*\s*"
                      r"control_spread\s*\)\s*\)$")


class BarsError(ValueError):
    """A bars file that cannot be used (named, with the field)."""


class BracketError(RuntimeError):
    """A lane could not be brought up or down during the window."""


def _fraction(text: str, where: str) -> float:
    """'3%' or 0.03 -> 0.03."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%\s*", str(text))
    if not m:
        raise BarsError(f"{where}: expected a percentage like 3%, not {text!r}")
    return float(m.group(1)) / 100


@dataclass(frozen=True)
class Rule:
    """One bar: `>= -2%` / `<= +10%` (relative to the control mean), `>= 105` (absolute), or the
    drafter rule `control_mean * (1 - max(2%, 1.5 * control_spread))` (the candidate must reach it)."""

    text: str
    kind: str  # relative | absolute | drafter
    op: str  # >= | <=
    value: float = 0.0  # relative: a fraction (-0.02); absolute: the bound
    floor: float = 0.0  # drafter: the minimum allowed drop (0.02)
    factor: float = 0.0  # drafter: times the control spread (1.5)

    @classmethod
    def parse(cls, text: str, where: str) -> Rule:
        t = " ".join(str(text).split())
        if m := _RELATIVE.match(t):
            return cls(t, "relative", m.group(1), float(m.group(2)) / 100)
        if m := _ABSOLUTE.match(t):
            return cls(t, "absolute", m.group(1), float(m.group(2)))
        if m := _DRAFTER.match(t):
            return cls(t, "drafter", ">=", floor=float(m.group(1)) / 100, factor=float(m.group(2)))
        raise BarsError(f"{where}: bar {text!r} is not '>= -2%', '<= +10%', '>= 105' or "
                        "'control_mean * (1 - max(2%, 1.5 * control_spread))'")

    def threshold(self, control_mean: float, control_spread: float) -> float:
        if self.kind == "absolute":
            return self.value
        if self.kind == "relative":
            return control_mean * (1 + self.value)
        return control_mean * (1 - max(self.floor, self.factor * control_spread))

    def passes(self, candidate: float, threshold: float) -> bool:
        return candidate >= threshold if self.op == ">=" else candidate <= threshold


@dataclass(frozen=True)
class CellKey:
    """`aggregate.C1`, `decode.code.C8`, `prefill.8192`."""

    text: str
    metric: str
    category: str | None = None  # None: the mean of the categories
    concurrency: int | None = None
    prefill_tokens: int | None = None

    @classmethod
    def parse(cls, text: str, where: str) -> CellKey:
        parts = str(text).split(".")
        if parts[0] == "prefill":
            if len(parts) != 2 or not parts[1].isdigit():
                raise BarsError(f"{where}: {text!r}: a prefill cell is prefill.<TOKENS>, e.g. prefill.8192")
            return cls(text, "prefill", prefill_tokens=int(parts[1]))
        if parts[0] not in METRICS or len(parts) not in (2, 3) or not re.fullmatch(r"C\d+", parts[-1]):
            raise BarsError(f"{where}: {text!r} is not METRIC[.CATEGORY].C<N> with METRIC one of "
                            f"{', '.join(METRICS)} (or prefill.<TOKENS>)")
        return cls(text, parts[0], parts[1] if len(parts) == 3 else None, int(parts[-1][1:]))

    def value(self, result: BenchResult) -> float | None:
        """This cell's number in one arm's result (None: missing or errored)."""
        if self.metric == "prefill":
            rec = next((p for p in result.prefill if p.target == self.prefill_tokens), None)
            return rec.tps if rec else None
        fn = METRICS[self.metric]
        if self.category is not None:
            cell = result.cell(self.category, self.concurrency or 0)
            return fn(cell) if cell is not None and cell.ok else None
        return mean_row(result, lambda c: fn(c) if c.ok else None).get(self.concurrency or 0)


@dataclass
class Bars:
    path: str
    sha256: str
    drift_band: float
    bench: BenchOptions
    prompt_set: str
    bars: list[tuple[CellKey, Rule]]

    def needs(self) -> None:
        """Every barred cell is one the bench will measure (else the window could not judge it)."""
        cats = set(self.bench.categories or [])
        for key, _ in self.bars:
            if key.metric == "prefill":
                if not self.bench.prefill or key.prefill_tokens not in self.bench.prefill_tokens:
                    raise BarsError(f"{self.path}: {key.text}: the bench section does not run prefill at "
                                    f"{key.prefill_tokens} tokens")
                continue
            if key.concurrency not in self.bench.concurrency:
                raise BarsError(f"{self.path}: {key.text}: C{key.concurrency} is not in the bench's concurrency "
                                f"{list(self.bench.concurrency)}")
            if key.category is not None and cats and key.category not in cats:
                raise BarsError(f"{self.path}: {key.text}: category {key.category} is not benched")
            if key.metric == "acceptance":
                self._enough_for_acceptance(key)

    def _enough_for_acceptance(self, key: CellKey) -> None:
        """An acceptance bar judged on a few requests is noise: the seeds' 8 prompts a class "measured
        determinism, not tolerance", and they gated on 200 (docs/failure-modes.md FM-60)."""
        if key.category is not None:
            classes = 1
        elif self.bench.categories:
            classes = len(self.bench.categories)
        else:
            try:
                pset = promptsets.load(self.prompt_set)
            except promptsets.PromptSetError as exc:
                raise BarsError(f"{self.path}: bench.prompt_set: {exc}") from None
            classes = len([c for c in pset.categories if not all(p.ceiling for p in pset.by_category(c))])
        requests = (key.concurrency or 0) * classes
        if requests < ACCEPTANCE_MIN_REQUESTS:
            raise BarsError(f"{self.path}: {key.text}: an acceptance bar on {requests} request(s) (C{key.concurrency} "
                            f"x {classes} categor{'y' if classes == 1 else 'ies'}) is noise: it needs at least "
                            f"{ACCEPTANCE_MIN_REQUESTS} (docs/failure-modes.md FM-60)")


BENCH_KEYS = {"prompt_set", "concurrency", "categories", "ignore_eos", "max_tokens", "prefill", "prefill_tokens",
              "warmup", "timeout_s"}


def load_bars(path: str | Path) -> Bars:
    """Read and check a bars file (before any lane is touched)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise BarsError(f"bars file {path}: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise BarsError(f"{path}: not YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("bars"), dict) or not doc["bars"]:
        raise BarsError(f"{path}: expected a mapping with a non-empty 'bars' mapping (cell: rule)")
    unknown = sorted(set(doc) - {"drift_band", "bench", "bars", "description"})
    if unknown:
        raise BarsError(f"{path}: unknown key(s) {', '.join(unknown)}")
    band = _fraction(doc.get("drift_band", DEFAULT_DRIFT_BAND), f"{path}: drift_band")
    bench = doc.get("bench") or {}
    if not isinstance(bench, dict):
        raise BarsError(f"{path}: 'bench' must be a mapping")
    extra = sorted(set(bench) - BENCH_KEYS)
    if extra:
        raise BarsError(f"{path}: bench: unknown key(s) {', '.join(extra)} (known: {', '.join(sorted(BENCH_KEYS))})")
    opts: dict[str, Any] = {k: v for k, v in bench.items() if k != "prompt_set"}
    for key in ("concurrency", "categories", "prefill_tokens"):
        if opts.get(key) is not None:
            if not isinstance(opts[key], list):
                raise BarsError(f"{path}: bench.{key} must be a list")
            opts[key] = tuple(opts[key])
    try:
        options = BenchOptions(**opts)
    except (TypeError, ValueError) as exc:
        raise BarsError(f"{path}: bench: {exc}") from None
    bars = [(CellKey.parse(k, str(path)), Rule.parse(v, f"{path}: {k}")) for k, v in doc["bars"].items()]
    out = Bars(str(p), hashlib.sha256(data).hexdigest(), band, options, str(bench.get("prompt_set") or "v1"), bars)
    out.needs()
    return out


# ---------------------------------------------------------------------------------------------- lanes


class Lanes(Protocol):
    """How the bracket brings lanes up and down (the runner's playbooks, or a test's stand-in)."""

    def up(self, profile: str) -> str:
        """Bring the lane up (serving); returns its API base URL. Raises BracketError."""

    def down(self, profile: str) -> None:
        """Stop the lane. Raises BracketError."""


# ---------------------------------------------------------------------------------------------- verdict


@dataclass
class CellVerdict:
    key: str
    bar: str
    control_1: float | None
    control_2: float | None
    candidate: float | None
    control_mean: float | None = None
    spread: float | None = None  # |c1 - c2| / mean
    change: float | None = None  # candidate / control mean - 1
    threshold: float | None = None
    verdict: str = "error"  # pass | fail | drift | error


@dataclass
class ArmRecord:
    arm: str
    profile: str
    endpoint: str | None = None
    up_s: float | None = None
    bench_ok: bool | None = None
    error: str | None = None
    result: str | None = None  # results.json of the arm
    other_traffic: bool | None = None


@dataclass
class BracketResult:
    control: str
    candidate: str
    bars_file: str
    bars_sha256: str
    drift_band: float
    prompt_set: dict = field(default_factory=dict)
    arms: list[ArmRecord] = field(default_factory=list)
    cells: list[CellVerdict] = field(default_factory=list)
    window_valid: bool = False
    invalid_reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    passed: bool = False
    serving: str | None = None  # the lane serving when the bracket ended
    promoted: bool = False  # always False: promotion is a person's decision
    decision: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def judge(bars: Bars, ctl1: BenchResult, cand: BenchResult, ctl2: BenchResult) -> tuple[list[CellVerdict], list[str]]:
    """Every barred cell against the mean of its two controls; the reasons the window is invalid."""
    verdicts, invalid = [], []
    for key, rule in bars.bars:
        c1, c2, cv = key.value(ctl1), key.value(ctl2), key.value(cand)
        v = CellVerdict(key.text, rule.text, c1, c2, cv)
        if c1 is None or c2 is None:
            invalid.append(f"{key.text}: a control has no value (an errored or missing cell)")
            verdicts.append(v)
            continue
        v.control_mean = (c1 + c2) / 2
        v.spread = abs(c1 - c2) / v.control_mean if v.control_mean else 0.0
        v.threshold = rule.threshold(v.control_mean, v.spread)
        if cv is not None and v.control_mean:
            v.change = cv / v.control_mean - 1
        if v.spread > bars.drift_band:
            v.verdict = "drift"
            invalid.append(f"{key.text}: the controls differ by {100 * v.spread:.1f}% "
                           f"({c1:.4g} vs {c2:.4g}), beyond the {100 * bars.drift_band:.1f}% drift band")
        elif cv is None:
            v.verdict = "error"
        else:
            v.verdict = "pass" if rule.passes(cv, v.threshold) else "fail"
        verdicts.append(v)
    return verdicts, invalid


def decide(res: BracketResult) -> str:
    """The decision text for a person (the bracket itself never promotes)."""
    serving = (f"The control {res.serving} is serving again." if res.serving == res.control else
               f"WARNING: the control {res.control} is NOT serving (serving: {res.serving or 'nothing'}).")
    if not res.window_valid:
        return (f"WINDOW INVALID: {'; '.join(res.invalid_reasons)}. The candidate {res.candidate} cannot be judged "
                f"in this window; run the bracket again. {serving} Nothing was promoted.")
    failed = [c for c in res.cells if c.verdict != "pass"]
    if failed:
        return (f"The candidate {res.candidate} FAILED {len(failed)} of {len(res.cells)} pre-registered bar(s): "
                + ", ".join(f"{c.key} ({c.verdict})" for c in failed)
                + f". Do not promote. {serving} Nothing was promoted.")
    return (f"The candidate {res.candidate} passed all {len(res.cells)} pre-registered bar(s) in a valid window. "
            f"Promotion is a person's decision: to serve it, run `sparkfleet up --profile {res.candidate}` yourself. "
            f"{serving} Nothing was promoted.")


# ---------------------------------------------------------------------------------------------- the run


BenchFn = Callable[[str, BenchOptions, promptsets.PromptSet, str], BenchResult]  # (endpoint, opts, set, arm)
Notify = Callable[[str, str, dict], None]  # (arm, phase, data): phases up, benched, down, error


def run_bracket(control: str, candidate: str, bars: Bars, lanes: Lanes, bench: BenchFn,
                notify: Notify | None = None, save: Callable[[str, BenchResult], str] | None = None) -> BracketResult:
    """CTL → CAND → CTL in one window; always tries to leave the control serving.

    `notify(arm, phase, data)` is told of every phase (down, up, benched, error) as it starts or ends."""
    note = notify or (lambda arm, phase, data: None)
    pset = promptsets.load(bars.prompt_set)
    if bars.bench.categories:
        try:
            pset.only(list(bars.bench.categories))
        except promptsets.PromptSetError as exc:
            raise BarsError(f"{bars.path}: bench.categories: {exc}") from None
    res = BracketResult(control, candidate, bars.path, bars.sha256, bars.drift_band, pset.summary())
    results: dict[str, BenchResult] = {}
    current: str | None = None  # the lane that is (or may be, half up) on the nodes now
    for arm, profile in zip(ARMS, (control, candidate, control), strict=True):
        rec = ArmRecord(arm, profile)
        res.arms.append(rec)
        try:
            if current is not None and current != profile:
                note(arm, "down", {"profile": current})
                lanes.down(current)
                current = None
            note(arm, "up", {"profile": profile})
            t0 = time.monotonic()
            current = profile  # from here on the lane may be up, if only partly: the next arm stops it
            rec.endpoint = lanes.up(profile)
            rec.up_s = time.monotonic() - t0
            try:
                result = bench(rec.endpoint, bars.bench, pset, arm)
            except RequestFailed as exc:  # the endpoint would not even list its models
                raise BracketError(f"bench of {profile}: {exc}") from None
            rec.bench_ok = result.ok
            rec.other_traffic = result.traffic.get("seen")
            if save is not None:
                rec.result = save(arm, result)
            results[arm] = result
            note(arm, "benched", {"profile": profile, "result": result})
        except BracketError as exc:
            rec.error = str(exc)
            note(arm, "error", {"profile": profile, "error": str(exc)})
            if arm != "candidate":
                break  # control-1: nothing to compare with; control-2: it did not come back (said loudly)
    last = res.arms[-1]
    # Serving: the last arm is the control and its `up` finished (a failed bench leaves it serving).
    res.serving = control if last.profile == control and last.endpoint else None
    if all(a in results for a in ARMS):
        res.cells, res.invalid_reasons = judge(bars, results["control-1"], results["candidate"],
                                               results["control-2"])
    else:
        res.invalid_reasons = [f"{a.arm} ({a.profile}): {a.error}" for a in res.arms if a.error] or [
            "the window did not complete"]
    for r, a in ((results.get(a.arm), a) for a in res.arms):
        if r is not None and r.traffic.get("seen"):
            res.warnings.append(f"{a.arm}: other traffic was seen on the endpoint during its bench")
        if r is not None and not r.ok:
            res.warnings.append(f"{a.arm}: some cells errored (see its results)")
    res.window_valid = not res.invalid_reasons
    res.passed = res.window_valid and bool(res.cells) and all(c.verdict == "pass" for c in res.cells)
    res.decision = decide(res)
    return res
