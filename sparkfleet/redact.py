"""Secrets out of everything sparkfleet writes or shows: records, gate evidence, bundles.

A neutral module (no runner, no gates) so every writer can use the one rule without import cycles.
"""

from __future__ import annotations

import re
from typing import Any

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)
REDACTED = "***"


def redact(value: Any, secret_values: set[str]) -> Any:
    """Deep copy with secret values replaced wherever they appear (also inside strings)."""
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and SECRET_NAME.search(k) and isinstance(v, str) and v
                    else redact(v, secret_values)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, secret_values) for v in value]
    if isinstance(value, str):
        for s in secret_values:
            if s and len(s) >= 4:
                value = value.replace(s, REDACTED)
        # KEY=value forms inside argv strings
        return re.sub(r"\b([A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD)[A-Z0-9_]*)=([^\s'\"]+)", rf"\1={REDACTED}", value)
    return value
