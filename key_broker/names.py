"""Identifiers that become file names: a strict pattern, so no input can escape its directory."""

from __future__ import annotations

import re

from key_broker.errors import InvalidName

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:
        raise InvalidName(f"{what} must match {_NAME.pattern} (got {value!r:.80})")
    return value
