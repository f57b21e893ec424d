"""Tables that fit the terminal: fixed columns kept whole, free text last and wrapped at word boundaries.

Layouts, tried in order for the console's width (the terminal's, else $COLUMNS, else 80):
1. **table**: every column side by side; free-text columns wrap as whole words, each at least
   `MIN_FREE` wide (or its natural width when narrower), never narrower than its header.
2. **blocks**: the fixed columns as a table, each row's free text below it, indented, one
   `label: text` per column ("one finding per block"), when the free text would not fit beside;
   fixed columns that do not fit on the first line (rightmost first) go below with the free text.
3. **records**: when even the fixed columns do not fit: `label: value` lines per row.
`wide=True` prints the full table with nothing wrapped, whatever the width.

No box drawing: columns are separated by two spaces and the header is underlined with dashes,
so output reads the same in a terminal, a pipe, a log file or a mail. Styles (status colours) are
rich styles, which rich drops when the output is not a terminal unless colour was asked for.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from rich.console import Console
from rich.text import Text

SEP = "  "
MIN_FREE = 30  # below this a free-text column reads as vertical fragments: switch to blocks instead
INDENT = "    "

Cell = str | Text | None


@dataclass(frozen=True)
class Column:
    header: str
    wrap: bool = False  # free text (wraps at word boundaries); False: fixed, never wrapped


def _plain(cell: Cell) -> str:
    if cell is None:
        return ""
    text = cell.plain if isinstance(cell, Text) else str(cell)
    return text


def _style(cell: Cell) -> str:
    return str(cell.style) if isinstance(cell, Text) and cell.style else ""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def wrap_words(text: str, width: int) -> list[str]:
    """Whole words per line; a single word longer than the line (a path, a digest) is split."""
    lines: list[str] = []
    for para in text.splitlines() or [""]:
        lines.extend(textwrap.wrap(para, width=max(1, width), break_long_words=True, break_on_hyphens=False)
                     or [""])
    return lines


def layout(columns: list[Column], rows: list[list[Cell]], width: int | None,
           wide: bool = False) -> tuple[str, list[int]]:
    """The layout that fits `width` ("table", "blocks" or "records") and the column widths it uses."""
    natural = []
    for i, col in enumerate(columns):
        cells = [_plain(r[i]) for r in rows]
        if col.wrap:
            longest = max((len(line) for c in cells for line in (c.splitlines() or [""])), default=0)
        else:
            longest = max((len(_one_line(c)) for c in cells), default=0)
        natural.append(max(len(col.header), longest))
    if wide or width is None:
        return "table", natural
    fixed = [i for i, c in enumerate(columns) if not c.wrap]
    free = [i for i, c in enumerate(columns) if c.wrap]
    sep = len(SEP) * (len(columns) - 1)
    used = sum(natural[i] for i in fixed) + sep
    if used + sum(natural[i] for i in free) <= width:
        return "table", natural
    floors = {i: max(len(columns[i].header), min(natural[i], MIN_FREE)) for i in free}
    room = width - used
    if free and room >= sum(floors.values()):
        widths = list(natural)
        for i in free:
            widths[i] = floors[i]
        spare = room - sum(floors.values())
        for i in free:  # the rest goes to the free columns in order, each up to its natural width
            extra = min(spare, natural[i] - widths[i])
            widths[i] += extra
            spare -= extra
        return "table", widths
    return ("blocks", natural) if fixed and _head(columns, natural, width) else ("records", natural)


def _head(columns: list[Column], natural: list[int], width: int) -> list[int]:
    """The fixed columns that fit on a block's first line (leftmost first); the rest go below it."""
    fixed = [i for i, c in enumerate(columns) if not c.wrap]
    while fixed and sum(natural[i] for i in fixed) + len(SEP) * (len(fixed) - 1) > width:
        fixed.pop()
    return fixed


def lines(columns: list[Column], rows: list[list[Cell]], width: int | None, wide: bool = False) -> list[Text]:
    """The rendered lines (rich Text, styles kept) for `rows` under `columns`."""
    kind, widths = layout(columns, rows, width, wide)
    if kind == "table":
        return _table(columns, rows, widths, wide)
    if kind == "blocks":
        return _blocks(columns, rows, widths, width or 0, _head(columns, widths, width or 0))
    return _records(columns, rows, width or 0)


def _row_lines(cells: list[tuple[str, str]], widths: list[int], wraps: list[bool], wide: bool) -> list[Text]:
    split = []
    for (text, _), w, wrap in zip(cells, widths, wraps, strict=True):
        if wrap and not wide:
            split.append(wrap_words(text, w))
        elif wrap:
            split.append(text.splitlines() or [""])
        else:
            split.append([_one_line(text)])
    height = max(len(s) for s in split)
    out = []
    for n in range(height):
        line = Text()
        for i, ((_, style), w, parts) in enumerate(zip(cells, widths, split, strict=True)):
            part = parts[n] if n < len(parts) else ""
            last = i == len(cells) - 1
            line.append(part, style=style or None)
            if not last:
                line.append(" " * (w - len(part)) + SEP)
        line.rstrip()
        out.append(line)
    return out


def _table(columns: list[Column], rows: list[list[Cell]], widths: list[int], wide: bool) -> list[Text]:
    wraps = [c.wrap for c in columns]
    head = _row_lines([(c.header, "bold") for c in columns], widths, [False] * len(columns), True)
    rule = Text(SEP.join("-" * w for w in widths))
    body = []
    for r in rows:
        body.extend(_row_lines([(_plain(c), _style(c)) for c in r], widths, wraps, wide))
    return head + [rule] + body


def _blocks(columns: list[Column], rows: list[list[Cell]], widths: list[int], width: int,
            fixed: list[int]) -> list[Text]:
    free = [i for i in range(len(columns)) if i not in fixed]
    fw = [widths[i] for i in fixed]
    out = _row_lines([(columns[i].header, "bold") for i in fixed], fw, [False] * len(fixed), True)
    out.append(Text(SEP.join("-" * w for w in fw)))
    label_w = max(len(columns[i].header) for i in free) + 2
    for n, r in enumerate(rows):
        if n:
            out.append(Text(""))  # a blank line between blocks: each reads on its own
        out.extend(_row_lines([(_plain(r[i]), _style(r[i])) for i in fixed], fw, [False] * len(fixed), True))
        for i in free:
            text = _plain(r[i])
            if not text.strip():
                continue
            label = f"{columns[i].header}:".ljust(label_w)
            body = wrap_words(text, width - len(INDENT) - label_w)
            for k, part in enumerate(body):
                lead = INDENT + (label if k == 0 else " " * label_w)
                out.append(Text(lead + part, style=_style(r[i]) or ""))
    return out


def _records(columns: list[Column], rows: list[list[Cell]], width: int) -> list[Text]:
    label_w = max(len(c.header) for c in columns) + 2
    out: list[Text] = []
    for n, r in enumerate(rows):
        if n:
            out.append(Text(""))
        for i, col in enumerate(columns):
            text = _plain(r[i])
            if not text.strip():
                continue
            first = i == 0
            indent = "" if first else INDENT
            label = f"{col.header}:".ljust(label_w)
            for k, part in enumerate(wrap_words(text, max(1, width - len(indent) - label_w))):
                out.append(Text(indent + (label if k == 0 else " " * label_w) + part, style=_style(r[i]) or ""))
    return out


# up to this many nodes a command prints every node's part; past it (a fleet) only what failed and a summary,
# so a failure does not hide among 64 healthy blocks: --wide (or --json) for the whole (issue 42)
WHOLE_UP_TO = 8


def render(columns: list[Column], rows: list[list[Cell]], *, wide: bool = False, console: Console | None = None,
           title: str | None = None) -> None:
    """Print a table on `console` (stdout by default) in the layout that fits its width."""
    if console is None:
        from sparkfleet.cli.console import out as console
    if title:
        for i, part in enumerate(wrap_words(title, max(20, console.width - 4) if not wide else 10**6)):
            console.print(("    " if i else "") + part, markup=False, highlight=False, soft_wrap=True)
    for line in lines(columns, rows, console.width, wide):
        console.print(line, highlight=False, soft_wrap=True)


def say(text: str, *, console: Console | None = None, indent: str = "    ") -> None:
    """One message, wrapped at whole words to the console's width (continuation lines indented)."""
    if console is None:
        from sparkfleet.cli.console import out as console
    for i, part in enumerate(wrap_words(text, max(20, console.width - len(indent)))):
        console.print((indent if i else "") + part, markup=False, highlight=False, soft_wrap=True)
