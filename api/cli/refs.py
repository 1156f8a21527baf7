"""Model versions named on the command line (`--tenant --model --version`), parsed into a ModelRef
once, before anything is sent or stored: a bad name is a usage error (exit 2), never a path
component of a URL or a file."""

from __future__ import annotations

import typer

from protocol.model_ref import InvalidModelRef, ModelRef, valid_name


def model_ref(tenant: str, model: str, version: str) -> ModelRef:
    try:
        return ModelRef(tenant, model, version)
    except InvalidModelRef as exc:
        raise typer.BadParameter(str(exc)) from exc


def model_name(tenant: str, model: str) -> tuple[str, str]:
    """A tenant's model without a version (a rollback moves traffic between its versions)."""
    for what, value in (("tenant", tenant), ("model", model)):
        if not valid_name(value):
            raise typer.BadParameter(f"{what} is not a valid name (letters, digits, '.', '_', '-'; got {value!r:.80})")
    return tenant, model
