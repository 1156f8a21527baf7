"""Wire schemas of the key broker API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

_NAME = r"^[a-z0-9][a-z0-9._-]{0,63}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChallengeResponse(Strict):
    session_id: str
    nonce: str
    expires_at: str


class AttestRequest(Strict):
    session_id: str = Field(max_length=64)
    tenant: str = Field(pattern=_NAME)
    model: str = Field(pattern=_NAME)
    version: str = Field(pattern=_NAME)
    evidence: dict[str, Any]


class AttestResponse(Strict):
    token: str


class KeyRequest(Strict):
    token: str = Field(max_length=16384)
    tenant: str = Field(pattern=_NAME)
    model: str = Field(pattern=_NAME)
    version: str = Field(pattern=_NAME)


class KeyResponse(Strict):
    sealed_key: str
    token_id: str
    receipt: dict[str, Any]


class KeyStatusRequest(KeyRequest):
    pass


class KeyStatusResponse(Strict):
    status: str  # "active" | "revoked"
    check_after_s: int
