"""One JSON line of an audit log, checkpoint file or witness file, read as outside bytes.

Those files live on disk an operator (or an attacker) can edit, so a line may be anything: not
ASCII, not JSON, nested a million deep, holding NaN or 1e999 (which the canonical encoder then
refuses), or fields of the wrong type. Every such line is an AuditIntegrityError naming the line;
no ValueError, TypeError or RecursionError escapes to the caller.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from policy.errors import AuditIntegrityError

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def json_object(line: str | bytes, index: int, path: str | None, what: str) -> dict[str, Any]:
    """The JSON object on one line; raises AuditIntegrityError(index, ...) for anything else."""
    try:
        text = line.decode("ascii") if isinstance(line, bytes) else line
        raw = json.loads(text, parse_float=_finite, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise AuditIntegrityError(index, f"malformed {what}: {str(exc)[:200]}", path) from None
    if not isinstance(raw, dict):
        raise AuditIntegrityError(index, f"malformed {what}: not a JSON object", path)
    return raw


def field(raw: dict[str, Any], name: str, kind: type, index: int, path: str | None, what: str) -> Any:
    """raw[name], which must be present and of `kind` (an int field refuses a bool)."""
    value = raw.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise AuditIntegrityError(index, f"malformed {what}: {name} missing or not {kind.__name__}", path)
    return value


def hex64(raw: dict[str, Any], name: str, index: int, path: str | None, what: str) -> str:
    """A 32-byte value as 64 lowercase hex digits (hashes and roots)."""
    value = field(raw, name, str, index, path, what)
    if not _HEX64.match(value):
        raise AuditIntegrityError(index, f"malformed {what}: {name} is not 64 hex digits", path)
    return str(value)
