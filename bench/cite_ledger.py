"""Point shipped files' citations of the design catalog (not shipped) at the failure ledger instead.

The catalog is the developers' requirements document; what ships is docs/failure-modes.md, whose rows keep
the catalog's FM ids. Every "CATALOG ..." citation in sparkfleet/, profiles/, templates/ and playbooks/ is
rewritten, line by line, by the rules below, in order:

  1. a few phrasings, word for word (EXACT);
  2. "CATALOG §8", "CATALOG.md §8.1" (the failure modes) -> "docs/failure-modes.md";
  3. "(CATALOG §5.3)": a parenthesis that cites only a catalog section -> removed (the ledger has no sections);
  4. "CATALOG §2.4, " at the head of a list -> removed, the ids after it stay;
  5. "CATALOG A-1, FM-12, B-2" -> "docs/failure-modes.md FM-12; A-1, B-2" when the list holds an FM id
     (the ledger's), else "A-1, B-2" (the seed requirement's id, kept as provenance).

tests/ and docs/ are rewritten by the same rules, so that what a test expects and a doc shows is what the
code now says. Lines the rewrite makes longer than ruff's 120 are listed (`ruff check` names them) and
wrapped by hand. Idempotent: a second run changes nothing. tests/test_failure_ledger.py checks that no
shipped file cites CATALOG.

    python3 bench/cite_ledger.py           # rewrite in place, print each changed file
    python3 bench/cite_ledger.py --check   # exit 1 and list what would change
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIPPED = ("sparkfleet", "profiles", "templates", "playbooks")
FOLLOW = ("tests", "docs")  # rewritten too, so their expectations and samples stay the code's
LEDGER = "docs/failure-modes.md"
CAT = r"CATALOG(?:\.md)?"
EXACT = (
    ("(CATALOG.md ids in the messages' remedies)", f"({LEDGER} ids in the messages' remedies)"),
    ("(CATALOG ids in the remedies)", f"({LEDGER} ids in the remedies)"),
    ("each with its CATALOG id", "each with its requirement id"),
    ("The seeds (CATALOG.md) give", "The seeds give"),
    ("each one of the failures in CATALOG.md §8 (or §1)", f"each a failure of {LEDGER} or an inventory fact"),
    ("and the seeds'\nCATALOG.md §5.2; llama.cpp's", "and the seeds';\nllama.cpp's"),
    ('against 3, CATALOG "\n            "ENG-16)', 'against 3, "\n            "ENG-16)'),  # a test's split string
)
SECTION8 = re.compile(CAT + r" §8(?:\.\d+)?")
ONLY_SECTION = re.compile(r" ?\(" + CAT + r" §\d+(?:\.\d+)*\)")
HEAD_SECTION = re.compile(CAT + r" §\d+(?:\.\d+)*, ")
ID = r"(?:[A-Z]+-[A-Z]?\d+(?:\.\.\d+|/[A-Z]?\d+)*|\[\d{3}\])"
LIST = re.compile(CAT + r" (" + ID + r"(?:(?:, | / )" + ID + r")*)")


def _list(m: re.Match) -> str:
    ids = re.split(r", | / ", m.group(1))
    fm = [i for i in ids if i.startswith("FM-")]
    other = [i for i in ids if not i.startswith("FM-")]
    if not fm:
        return ", ".join(other) if ", " in m.group(1) else m.group(1)
    return f"{LEDGER} {', '.join(fm)}" + (f"; {', '.join(other)}" if other else "")


def rewrite(text: str) -> str:
    for old, new in EXACT:
        text = text.replace(old, new)
    text = SECTION8.sub(LEDGER, text)
    text = ONLY_SECTION.sub("", text)
    text = HEAD_SECTION.sub("", text)
    return LIST.sub(_list, text)


KEPT_AS_WRITTEN = ("tests/fixtures/records",)  # records an older sparkfleet wrote: data, kept byte for byte


def shipped(root: Path = REPO, dirs: tuple[str, ...] = SHIPPED) -> list[Path]:
    return [p for d in dirs for p in sorted((root / d).rglob("*")) if p.is_file() and p.suffix != ".pyc"
            and not any(p.relative_to(root).as_posix().startswith(k) for k in KEPT_AS_WRITTEN)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything would change")
    args = ap.parse_args(argv)
    changed = []
    for p in shipped(dirs=SHIPPED + FOLLOW):
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite(text)
        if new != text:
            changed.append(p.relative_to(REPO))
            if not args.check:
                p.write_text(new)
    for c in changed:
        print(c)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
