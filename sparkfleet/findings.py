"""A finding: one observation with a status, what was seen, what was expected and what to do."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

# unknown: the check could not be judged (idle GPU, N/A fields, probe skipped); never counted as passed
Status = Literal["ok", "warn", "fail", "unknown"]


@dataclass(frozen=True)
class Finding:
    check: str  # rule or check name
    status: Status
    message: str
    remedy: str = ""
    node: str | None = None
    field: str | None = None  # profile field, for lane rules
    where: str | None = None  # file:line
    observed: str | None = None
    expected: str | None = None
    # the node's facts part this check could not read (an "unknown" that `up` stops on, unlike "not judged")
    unread: str | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}


def failed(findings: list[Finding]) -> bool:
    return any(f.status == "fail" for f in findings)


def unread(findings: list[Finding]) -> list[Finding]:
    """The unknowns caused by a facts part the node could not read (not the idle clock's "not judged")."""
    return [f for f in findings if f.status == "unknown" and f.unread]
