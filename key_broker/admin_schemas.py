"""Wire schemas of the admin API (tenant keys, data keys, policies, reference values, receipts)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from protocol.broker.schemas import Strict

_HEX64 = r"^[0-9a-f]{64}$"


class DataKeyUpload(Strict):
    """A package's data key, HPKE-sealed by the tenant to this broker's import key, with the signed
    manifest it belongs to. The key never travels in the clear, not even inside TLS."""

    sealed_key: dict[str, str]
    manifest: str = Field(max_length=8 << 20, description="base64 of manifest.json")
    signature_files: dict[str, str] = Field(description="file name -> base64 (manifest.sig or model-signing)")


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
