"""Prompt sets for `sparkfleet bench`: the shipped `v1` or a user's YAML file, with the file's sha256.

A set is a YAML document::

    name: v1
    description: ...
    prompts:
      - id: code-lru          # unique in the set
        category: code        # cells are (category, concurrency); a category may have several prompts
        max_tokens: 256       # the prompt's budget
        text: "..."
        ceiling: false        # true: a peak ceiling (counting), reported apart from the category mean

The sha256 of the file's bytes goes into every result, so two runs are known to have used the same
prompts (the seeds checked "prompt set sha1 618898aa on all three arms", GATE-08).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
SHIPPED = ("v1",)
# BEN-01: the eight categories of prompt set v1, in the order its tables list them.
V1_CATEGORIES = ("code", "format", "json", "math", "reasoning", "prose", "summary", "narrative")


class PromptSetError(ValueError):
    """A prompt set that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str
    max_tokens: int
    ceiling: bool = False


@dataclass(frozen=True)
class PromptSet:
    name: str
    description: str
    prompts: tuple[Prompt, ...]
    sha256: str
    source: str  # "shipped:v1" or the file's path

    @property
    def categories(self) -> list[str]:
        """Categories in the order they first appear (ceilings included)."""
        return list(dict.fromkeys(p.category for p in self.prompts))

    @property
    def ceiling_categories(self) -> list[str]:
        return [c for c in self.categories if all(p.ceiling for p in self.by_category(c))]

    @property
    def mean_categories(self) -> list[str]:
        """The categories the mean row averages over (every one that is not a ceiling)."""
        ceilings = set(self.ceiling_categories)
        return [c for c in self.categories if c not in ceilings]

    def by_category(self, category: str) -> list[Prompt]:
        return [p for p in self.prompts if p.category == category]

    def only(self, categories: list[str]) -> PromptSet:
        """The same set restricted to some categories (the sha256 still names the whole file)."""
        unknown = [c for c in categories if c not in self.categories]
        if unknown:
            raise PromptSetError(f"prompt set {self.name}: no category {', '.join(unknown)} "
                                 f"(it has {', '.join(self.categories)})")
        return PromptSet(self.name, self.description, tuple(p for p in self.prompts if p.category in categories),
                         self.sha256, self.source)

    def summary(self) -> dict:
        return {"name": self.name, "sha256": self.sha256, "source": self.source,
                "categories": self.categories, "ceilings": self.ceiling_categories, "prompts": len(self.prompts)}


def _field(where: str, item: dict, key: str, kind: type, required: bool = True) -> object:
    value = item.get(key)
    if value is None:
        if required:
            raise PromptSetError(f"{where}: '{key}' is missing")
        return None
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise PromptSetError(f"{where}: '{key}' must be {kind.__name__}, not {type(value).__name__}")
    return value


def parse(data: bytes, source: str) -> PromptSet:
    """A prompt set from a YAML document's bytes (source names it in errors)."""
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise PromptSetError(f"{source}: not YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("prompts"), list) or not doc["prompts"]:
        raise PromptSetError(f"{source}: expected a mapping with a non-empty 'prompts' list")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for i, item in enumerate(doc["prompts"]):
        where = f"{source}: prompts[{i}]"
        if not isinstance(item, dict):
            raise PromptSetError(f"{where}: expected a mapping")
        unknown = sorted(set(item) - {"id", "category", "text", "max_tokens", "ceiling"})
        if unknown:
            raise PromptSetError(f"{where}: unknown field(s) {', '.join(unknown)}")
        pid = str(_field(where, item, "id", str))
        if pid in seen:
            raise PromptSetError(f"{where}: id {pid!r} is used twice")
        seen.add(pid)
        text = str(_field(where, item, "text", str)).strip()
        if not text:
            raise PromptSetError(f"{where}: 'text' is empty")
        budget = _field(where, item, "max_tokens", int)
        assert isinstance(budget, int)
        if budget < 1:
            raise PromptSetError(f"{where}: 'max_tokens' must be at least 1")
        ceiling = _field(where, item, "ceiling", bool, required=False) or False
        prompts.append(Prompt(pid, str(_field(where, item, "category", str)), text, budget, bool(ceiling)))
    name = doc.get("name")
    return PromptSet(str(name) if name else Path(source).stem, str(doc.get("description") or ""), tuple(prompts),
                     hashlib.sha256(data).hexdigest(), source)


def load(name_or_path: str) -> PromptSet:
    """`v1` (shipped) or a YAML file's path."""
    if name_or_path in SHIPPED:
        path = PROMPTS_DIR / f"{name_or_path}.yaml"
        return parse(path.read_bytes(), f"shipped:{name_or_path}")
    path = Path(name_or_path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PromptSetError(f"prompt set {name_or_path!r}: {exc.strerror or exc} (shipped sets: "
                             f"{', '.join(SHIPPED)})") from None
    return parse(data, str(path))
