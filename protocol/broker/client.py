"""Worker-side client of the key-release protocol (runs inside the attested worker)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from pydantic import BaseModel, ValidationError

from attestation.bundle import EvidenceBundle, RuntimeData
from protocol.broker.errors import BrokerClientError, BrokerRateLimited, BrokerRefused
from protocol.broker.schemas import (
    AttestRequest,
    AttestResponse,
    ChallengeResponse,
    KeyRequest,
    KeyResponse,
    KeyStatusRequest,
    KeyStatusResponse,
)
from protocol.broker.sealing import open_sealed, raw_public_key, release_info


@dataclass(frozen=True)
class ReleasedKey:
    data_key: bytes
    token: str
    token_id: str
    bundle: EvidenceBundle
    receipt: dict[str, Any]


Answer = TypeVar("Answer", bound=BaseModel)


def _post(client: httpx.Client, path: str, request: BaseModel | None, answer: type[Answer]) -> Answer:
    """Requests are checked by the broker (the client builds them unvalidated, so a bad name is the
    broker's 422 as before); answers are parsed here, so nothing untyped leaves this module."""
    response = client.post(path, json=request.model_dump() if request is not None else {})
    if response.status_code == 403:
        raise BrokerRefused("the key broker refused the request")
    if response.status_code == 429:
        raise BrokerRateLimited("the key broker rate-limited the request; retry later")
    response.raise_for_status()
    try:
        return answer.model_validate_json(response.content)
    except ValidationError as exc:
        raise BrokerClientError(f"malformed answer from the key broker to {path}") from exc


def obtain_data_key(
    client: httpx.Client,
    *,
    tenant: str,
    model: str,
    version: str,
    make_bundle: Callable[[RuntimeData], EvidenceBundle],
    channel_binding: bytes = b"",
) -> ReleasedKey:
    """Challenge -> evidence bound to a fresh HPKE key (and the worker's channel keys) -> token ->
    sealed data key -> open it."""
    ephemeral = X25519PrivateKey.generate()
    challenge = _post(client, "/v1/challenge", None, ChallengeResponse)
    runtime = RuntimeData(nonce=bytes.fromhex(challenge.nonce), hpke_public_key=raw_public_key(ephemeral),
                          channel_binding=channel_binding)
    bundle = make_bundle(runtime)
    attest = AttestRequest.model_construct(session_id=challenge.session_id, evidence=bundle.to_json(),
                                           tenant=tenant, model=model, version=version)
    token = _post(client, "/v1/attest", attest, AttestResponse).token
    key = KeyRequest.model_construct(token=token, tenant=tenant, model=model, version=version)
    released = _post(client, "/v1/key", key, KeyResponse)
    data_key = open_sealed(base64.b64decode(released.sealed_key), ephemeral,
                           release_info(tenant, model, version, released.token_id))
    return ReleasedKey(data_key, token, released.token_id, bundle, released.receipt)


def check_key_status(client: httpx.Client, released: ReleasedKey, *, tenant: str, model: str,
                     version: str) -> str:
    """Poll the broker: "active" or "revoked". A worker drops the data key (and stops serving the
    model) on "revoked" and on a refusal; on a network error or 429 it keeps it and polls again.
    The broker suggests the poll interval in `check_after_s` (30 s)."""
    try:
        request = KeyStatusRequest.model_construct(token=released.token, tenant=tenant, model=model, version=version)
        body = _post(client, "/v1/key/status", request, KeyStatusResponse)
    except BrokerRateLimited:
        raise
    except BrokerClientError:  # refused, or an answer that is not a status: drop the key
        return "revoked"
    return body.status if body.status in ("active", "revoked") else "revoked"
