"""`ModelRef`: which tenant's model, at which version. Every role names a model version with it:
the broker's token scope and sealed-key context, the worker's settings and status, the gateway's
registry and the control loop. Its canonical string form is ``tenant/model/version``.

Each part becomes one path component somewhere (packages, key files, refs), so all three follow
one rule: letters, digits, '.', '_', '-', starting with a letter or digit, no "..", at most 256
characters (the management API's longest name). Where a name becomes a file name, the owner adds
its own stricter rule: the key broker's key_broker/names.py, the package store's 128 characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,255}$")


class InvalidModelRef(ValueError):
    """A tenant, model or version that is not a valid name, or a malformed canonical string."""


def valid_name(value: object) -> bool:
    return isinstance(value, str) and NAME_PATTERN.fullmatch(value) is not None and ".." not in value


@dataclass(frozen=True, order=True)
class ModelRef:
    tenant: str
    model: str
    version: str

    def __post_init__(self) -> None:
        for what in ("tenant", "model", "version"):
            value = getattr(self, what)
            if not valid_name(value):
                raise InvalidModelRef(f"{what} is not a valid name (letters, digits, '.', '_', '-'; "
                                      f"got {value!r:.80})")

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        """The inverse of ``str(ref)``."""
        parts = text.split("/") if isinstance(text, str) else []
        if len(parts) != 3:
            raise InvalidModelRef(f"a model reference is tenant/model/version (got {text!r:.80})")
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.tenant}/{self.model}/{self.version}"

    def as_dict(self) -> dict[str, str]:
        """The three fields as the wire messages carry them (JSON bodies, token scope)."""
        return {"tenant": self.tenant, "model": self.model, "version": self.version}
