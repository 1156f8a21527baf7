"""Management request bodies."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from api.gateway.errors import GatewayError
from protocol.model_ref import InvalidModelRef, ModelRef, valid_name


class Strict(BaseModel):
    # Types as the schema says: no "12" for 12, no 1.0 for an integer, no number for a timestamp.
    model_config = ConfigDict(extra="forbid", strict=True)


# Every number fits the database's 64-bit integers (a 500 otherwise) with room to add usage to it.
MAX_RATE = 1_000_000_000
MAX_TOKENS_BUDGET = 1 << 62


class TenantIn(Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    weight: float = Field(default=1.0, gt=0, le=1000)
    rpm: int | None = Field(default=None, ge=1, le=MAX_RATE)
    tpm: int | None = Field(default=None, ge=1, le=MAX_RATE)
    token_budget: int | None = Field(default=None, ge=0, le=MAX_TOKENS_BUDGET)
    max_queued: int | None = Field(default=None, ge=1, le=1_000_000)


class KeyIn(Strict):
    name: str = Field(min_length=1, max_length=128)
    models: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(default_factory=list, max_length=256)
    expires_at: dt.datetime | None = Field(default=None, strict=True)  # an RFC 3339 string, not a number
    rpm: int | None = Field(default=None, ge=1, le=MAX_RATE)
    tpm: int | None = Field(default=None, ge=1, le=MAX_RATE)
    priority: int = Field(default=0, ge=-10, le=10)
    token_budget: int | None = Field(default=None, ge=0, le=MAX_TOKENS_BUDGET,
                                     description="lifetime tokens of this key")


class KillSwitchIn(Strict):
    killed: StrictBool  # a switch takes true or false, never "yes" or 1


class ModelVersionIn(Strict):
    model: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
    version: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
    min_warm: int = Field(default=1, ge=0, le=1000, description="warm-pool floor; 0 lets it scale to zero")
    max_replicas: int | None = Field(default=None, ge=1, le=1000)
    ttft_slo_ms: int | None = Field(default=None, ge=1, le=600_000)

    @model_validator(mode="after")
    def _bounds(self) -> ModelVersionIn:
        # The names every role will put in a ModelRef (no "..": each becomes a path component);
        # refused here, not later in the control loop or the key broker.
        if not (valid_name(self.model) and valid_name(self.version)):
            raise ValueError("model and version must not contain '..'")
        if self.max_replicas is not None and self.max_replicas < self.min_warm:
            raise ValueError("max_replicas must be at least min_warm")
        return self


def new_version_ref(tenant: str, model: str, version: str) -> ModelRef:
    """The model version a request registers, from its path and body (a 400 when the names form none)."""
    try:
        return ModelRef(tenant, model, version)
    except InvalidModelRef as exc:
        raise GatewayError(400, str(exc), code="invalid_value") from exc


def stored_version_ref(tenant: str, model: str, version: str) -> ModelRef:
    """The model version a request names, parsed once from its path or body. A name no ModelRef
    takes was never registered: the same 404 as for a version that does not exist."""
    try:
        return ModelRef(tenant, model, version)
    except InvalidModelRef as exc:
        raise GatewayError(404, "no such model version", code="not_found") from exc


class RolloutIn(Strict):
    version: str = Field(min_length=1, max_length=64)
    percent: float = Field(ge=0, le=100)


class PolicyIn(Strict):
    document: dict[str, Any]
    # The tenant admin's Ed25519 public key (PEM) that signed `document`; workers are started with
    # it, and it is part of their measurement.
    admin_key_pem: str | None = Field(default=None, max_length=4096)
