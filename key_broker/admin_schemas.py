"""Wire schemas of the admin API (tenant keys, data keys, policies, reference values, receipts)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from key_broker.schemas import Strict

_HEX64 = r"^[0-9a-f]{64}$"


class DataKeyUpload(Strict):
    data_key: str = Field(pattern=r"^[A-Za-z0-9+/]{43}=$", description="base64 of the 32-byte data key")
    key_id: str = Field(min_length=1, max_length=128)
    signer: str | None = Field(default=None, max_length=256)
    model_digest: str = Field(pattern=_HEX64)


class SigningKeyUpload(Strict):
    public_key_pem: str = Field(max_length=1024)


class RotationResponse(Strict):
    kek_version: int
    rewrapped: int


class TenantTokenResponse(Strict):
    token_id: str
    token: str  # shown once; only its hash is stored


class ReceiptsResponse(Strict):
    tenant: str
    broker_public_key_pem: str
    receipts: list[dict[str, Any]]


class ReferenceValuesResponse(Strict):
    id: str
    version: int
    measurements: list[str]
    digest: str
