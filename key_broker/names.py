"""Identifiers that become file names: a strict pattern, so no input can escape its directory."""

from __future__ import annotations

import re

from key_broker.errors import InvalidName
from protocol.model_ref import ModelRef

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:
        raise InvalidName(f"{what} must match {_NAME.pattern} (got {value!r:.80})")
    return value


def check_ref(ref: ModelRef) -> ModelRef:
    """`ref`, if its names also pass the broker's stricter file-name rule (InvalidName otherwise)."""
    check_name(ref.tenant, "tenant"), check_name(ref.model, "model"), check_name(ref.version, "version")
    return ref


def broker_ref(tenant: str, model: str, version: str) -> ModelRef:
    """A model version named by an admin route's path: checked by the broker's rule first, so a bad
    name is the broker's typed InvalidName (a 422), never a ModelRef error."""
    return ModelRef(check_name(tenant, "tenant"), check_name(model, "model"), check_name(version, "version"))
