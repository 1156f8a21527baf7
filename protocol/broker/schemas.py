"""Wire schemas of the key broker API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from protocol.model_ref import ModelRef

_NAME = r"^[a-z0-9][a-z0-9._-]{0,63}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Scoped(Strict):
    """A body naming a model version: the names form a ModelRef, or the schema refuses the body
    (a 422), so a route can take `ref` (the pattern alone lets ".." through)."""

    tenant: str = Field(pattern=_NAME)
    model: str = Field(pattern=_NAME)
    version: str = Field(pattern=_NAME)

    @model_validator(mode="after")
    def _names_form_a_model_ref(self) -> Scoped:
        ModelRef(self.tenant, self.model, self.version)  # InvalidModelRef is a ValueError: reported as invalid
        return self

    @property
    def ref(self) -> ModelRef:
        return ModelRef(self.tenant, self.model, self.version)


class ChallengeResponse(Strict):
    session_id: str
    nonce: str
    expires_at: str


class AttestRequest(Scoped):
    session_id: str = Field(max_length=64)
    evidence: dict[str, Any]


class AttestResponse(Strict):
    token: str


class KeyRequest(Scoped):
    token: str = Field(max_length=16384)


class KeyResponse(Strict):
    sealed_key: str
    token_id: str
    receipt: dict[str, Any]
    # The tenant-signed release policy the key was released under (the worker verifies the tenant's
    # signature with the policy-admin key it is measured with).
    release_policy: dict[str, Any] | None = None


class KeyStatusRequest(KeyRequest):
    pass


class KeyStatusResponse(Strict):
    status: str  # "active" | "revoked"
    check_after_s: int


class LeaseRequest(KeyRequest):
    """A renewal signed by the worker's attested identity key (see key_broker/leases.py)."""

    tls_spki: str = Field(max_length=2048, pattern=r"^([0-9a-f]{2})*$")
    identity_key: str = Field(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")
    seq: int = Field(ge=1, le=2**62)
    at: int = Field(ge=0, le=2**40)
    wait_s: float = Field(ge=0, le=3600)
    signature: str = Field(min_length=128, max_length=128, pattern=r"^[0-9a-f]{128}$")
    # The evidence bundle the token was issued for: the broker appraises it again at each renewal
    # (key_broker/lease_appraisal.py); a renewal without it is refused.
    evidence: dict[str, Any] | None = None


class LeaseResponse(Strict):
    token_id: str
    seq: int
    status: str  # "active" | "revoked"
    lease_s: int
    mac: str
