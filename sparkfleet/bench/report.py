"""Bench output: results.json (raw, every request), report.md (tables like the seeds' README), PNG plots.

Plots need matplotlib, the optional `plots` extra (`pip install 'sparkfleet[plots]'`); without it the
JSON and Markdown are written and the report says that plots were skipped.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

from sparkfleet.bench.runner import BenchResult, Cell

RESULTS = "results.json"
REPORT = "report.md"
PLOTS = ("aggregate.png", "per_stream.png", "prefill.png")


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def concurrencies(result: BenchResult) -> list[int]:
    return sorted({c.concurrency for c in result.cells})


def categories(result: BenchResult) -> tuple[list[str], list[str]]:
    """(categories averaged in the mean row, ceiling categories), in the prompt set's order."""
    ceilings = list(result.prompt_set.get("ceilings") or [])
    present = list(dict.fromkeys(c.category for c in result.cells))
    order = [c for c in result.prompt_set.get("categories") or present if c in present]
    return [c for c in order if c not in ceilings], [c for c in order if c in ceilings]


def mean_row(result: BenchResult, value: Callable[[Cell], float | None]) -> dict[int, float | None]:
    """Per concurrency: the mean over the non-ceiling categories, or None if any of them has no value
    (a mean over fewer categories would not compare with other runs)."""
    means, _ = categories(result)
    out: dict[int, float | None] = {}
    for c in concurrencies(result):
        values = [value(cell) if (cell := result.cell(cat, c)) else None for cat in means]
        out[c] = statistics.fmean(values) if values and all(v is not None for v in values) else None
    return out


def _table(result: BenchResult, title: str, value: Callable[[Cell], float | None], digits: int) -> list[str]:
    cs = concurrencies(result)
    means, ceilings = categories(result)
    lines = [f"### {title}", "", "| category | " + " | ".join(f"C{c}" for c in cs) + " |",
             "|---|" + "---:|" * len(cs)]

    def row(label: str, cat: str) -> str:
        cells = []
        for c in cs:
            cell = result.cell(cat, c)
            cells.append("error" if cell is not None and cell.error else _num(value(cell) if cell else None, digits))
        return f"| {label} | " + " | ".join(cells) + " |"

    lines += [row(cat, cat) for cat in means]
    if len(means) > 1:
        m = mean_row(result, value)
        lines.append(f"| **mean of {len(means)}** | " + " | ".join(f"**{_num(m[c], digits)}**" for c in cs) + " |")
    lines += [row(f"{cat} (ceiling)", cat) for cat in ceilings]
    return lines + [""]


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def markdown(result: BenchResult, plots: list[str] | None = None, plot_note: str | None = None) -> str:
    """The report: header, tables per category with the mean row, prefill, acceptance, errors, caveats."""
    ps = result.prompt_set
    who = result.profile or result.endpoint
    lines = [f"# sparkfleet bench: {who}", ""]
    if result.simulated:
        lines += ["> **SIMULATION**: the endpoint is the sparkfleet sim engine; no GPU, no model.", ""]
    lines += [f"- endpoint `{result.endpoint}`, model `{result.model}`",
              f"- prompt set `{ps.get('name')}` sha256 `{ps.get('sha256')}` ({ps.get('source')})",
              f"- run {result.started_at} → {result.finished_at}; streaming, temperature 0, thinking off, "
              "token counts from usage blocks",
              ""]
    if result.cells:
        lines += ["## Decode", ""]
        lines += _table(result, "Aggregate tok/s (all streams' tokens ÷ batch wall time, TTFT included)",
                        lambda c: c.aggregate_tps, 1)
        lines += _table(result, "Per-stream decode tok/s (tokens after the first ÷ time after the first token; "
                        "mean over the streams)", lambda c: c.decode_tps, 1)
        lines += _table(result, "TTFT, s (first token delta; mean over the streams)", lambda c: c.ttft_s, 3)
        if any(c.acceptance for c in result.cells):
            lines += _table(result, "DSpark mean acceptance length per cell (/metrics deltas)",
                            lambda c: c.acceptance["mean_acceptance_length"] if c.acceptance else None, 2)
    if result.prefill:
        lines += ["## Cold prefill (1-token reply; tok/s = prompt tokens ÷ TTFT)", "",
                  "| target | prompt tokens | TTFT s | tok/s | note |", "|---:|---:|---:|---:|---|"]
        for p in result.prefill:
            note = p.skipped or p.error or ("whole request timed (no text in the reply)" if p.timed == "request"
                                            else "")
            lines.append(f"| {p.target:,} | {_num(p.prompt_tokens, 0)} | {_num(p.ttft_s, 3)} | {_num(p.tps, 0)} | "
                         f"{note} |")
        lines.append("")
    acc = result.acceptance
    lines += ["## DSpark acceptance over the run (/metrics counter deltas)", ""]
    if acc:
        lines += [f"- mean acceptance length **{acc['mean_acceptance_length']:.2f}** tokens per step "
                  f"({acc['drafts']:,} drafts, {acc['accepted_tokens']:,} accepted tokens)",
                  f"- acceptance rate {_pct(acc.get('acceptance_rate'))}",
                  "- per position: " + " / ".join(_pct(x) for x in acc["per_position"]), ""]
    else:
        lines += ["- not available (no spec-decode counters on /metrics, or no drafts during the run)", ""]
    errors = [c for c in result.cells if c.error] + [p for p in result.prefill if p.error]
    if errors:
        lines += ["## Errors", ""]
        for e in errors:
            where = f"{e.category} C{e.concurrency}" if isinstance(e, Cell) else f"prefill {e.target:,}"
            lines.append(f"- {where}: {e.error}")
        lines.append("")
    lines += ["## Caveats", ""] + [f"- {c}" for c in result.caveats] + [""]
    cl = result.client
    if cl.get("cpu_us_per_token") is not None:
        lag = cl.get("loop_lag_max_s")
        lines += [f"Client: {cl['streaming_cpu_s']:.2f} s CPU while streaming {cl['tokens']:,} tokens "
                  f"({cl['cpu_us_per_token']:.0f} µs per token; {cl['cpu_s']:.2f} s for the whole run)"
                  + (f"; its event loop lagged at most {1000 * lag:.0f} ms." if lag is not None else "."), ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    elif plot_note:
        lines += [plot_note, ""]
    return "\n".join(lines)


def plots(result: BenchResult, out_dir: Path) -> tuple[list[str], str | None]:
    """PNG plots when matplotlib is importable: (files written, or a note saying why none were)."""
    try:  # an optional extra (sparkfleet[plots]): imported only where plots are asked for
        import matplotlib

        matplotlib.use("Agg")  # files only; never a display
        import matplotlib.pyplot as plt  # after use("Agg"): pyplot picks its backend on import
    except ImportError:
        return [], "Plots skipped: matplotlib is not installed (`pip install 'sparkfleet[plots]'`)."
    written = []
    cs = concurrencies(result)
    means, ceilings = categories(result)
    title = f"{result.profile or result.endpoint}" + (" (SIMULATION)" if result.simulated else "")
    for name, label, value in (("aggregate.png", "aggregate tok/s", lambda c: c.aggregate_tps),
                               ("per_stream.png", "per-stream decode tok/s", lambda c: c.decode_tps)):
        lines = {cat: [(c, y) for c in cs if (cell := result.cell(cat, c)) and (y := value(cell)) is not None]
                 for cat in means + ceilings}
        if not any(lines.values()):
            continue  # every cell errored: nothing to draw
        fig, ax = plt.subplots(figsize=(8, 5))
        for cat, pts in lines.items():
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linewidth=1,
                        linestyle="--" if cat in ceilings else "-", label=cat + (" (ceiling)" if cat in ceilings
                                                                                 else ""))
        m = mean_row(result, value)
        pts = [(c, m[c]) for c in cs if m[c] is not None]
        if pts and len(means) > 1:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", linewidth=2.5, color="black",
                    label=f"mean of {len(means)}")
        ax.set_xlabel("concurrency (streams released together)")
        ax.set_ylabel(label)
        ax.set_xticks(cs)
        ax.set_title(f"{label}: {title}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(str(out_dir / name))
    pre = [p for p in result.prefill if p.tps is not None and p.prompt_tokens]
    if pre:
        fig, ax = plt.subplots(figsize=(8, 5))
        ax.plot([p.prompt_tokens for p in pre], [p.tps for p in pre], marker="o")
        ax.set_xscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("cold prefill tok/s")
        ax.set_title(f"cold prefill: {title}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "prefill.png", dpi=110)
        plt.close(fig)
        written.append(str(out_dir / "prefill.png"))
    return written, None


def write(result: BenchResult, out_dir: Path) -> dict[str, list[str] | str]:
    """results.json, report.md and the plots into out_dir; returns what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RESULTS).write_text(json.dumps(result.as_dict(), indent=1) + "\n")
    written, note = plots(result, out_dir)
    (out_dir / REPORT).write_text(markdown(result, written, note))
    return {"results": str(out_dir / RESULTS), "report": str(out_dir / REPORT), "plots": written,
            **({"plot_note": note} if note else {})}


def load(path: Path) -> BenchResult:
    """A result back from results.json (a file or the directory holding it)."""
    path = path / RESULTS if path.is_dir() else path
    return BenchResult.from_dict(json.loads(path.read_text()))
