"""Worker-side client of the key-release protocol (runs inside the attested worker)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import BaseModel, ValidationError

from protocol.broker.errors import BrokerClientError, BrokerRateLimited, BrokerRefused
from protocol.broker.evidence import Evidence, RuntimeData
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
from protocol.model_ref import ModelRef


@dataclass(frozen=True)
class ReleasedKey:
    data_key: bytes
    token: str
    token_id: str
    bundle: Evidence
    receipt: dict[str, Any]
    sealed_key: bytes = b""  # the HPKE blob as received: its receipt must cover exactly it
    release_policy: dict[str, Any] | None = None  # the tenant-signed envelope, as received (unverified)


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
    ref: ModelRef,
    *,
    make_bundle: Callable[[RuntimeData], Evidence],
    channel_binding: bytes = b"",
    hpke_key: X25519PrivateKey | None = None,
) -> ReleasedKey:
    """Challenge -> evidence bound to an HPKE key (and the worker's channel keys) -> token ->
    sealed data key -> open it. ``hpke_key``: the worker's serving key, which sealed-mode clients
    encrypt to (docs/sealed-mode.md); without it, a key made for this release only."""
    ephemeral = hpke_key or X25519PrivateKey.generate()
    challenge = _post(client, "/v1/challenge", None, ChallengeResponse)
    runtime = RuntimeData(nonce=bytes.fromhex(challenge.nonce), hpke_public_key=raw_public_key(ephemeral),
                          channel_binding=channel_binding)
    bundle = make_bundle(runtime)
    attest = AttestRequest.model_construct(session_id=challenge.session_id, evidence=bundle.to_json(),
                                           tenant=ref.tenant, model=ref.model, version=ref.version)
    token = _post(client, "/v1/attest", attest, AttestResponse).token
    key = KeyRequest.model_construct(token=token, tenant=ref.tenant, model=ref.model, version=ref.version)
    released = _post(client, "/v1/key", key, KeyResponse)
    sealed = base64.b64decode(released.sealed_key)
    data_key = open_sealed(sealed, ephemeral, release_info(ref, released.token_id))
    return ReleasedKey(data_key, token, released.token_id, bundle, released.receipt, sealed,
                       released.release_policy)


def renew_attestation(
    client: httpx.Client,
    ref: ModelRef,
    *,
    make_bundle: Callable[[RuntimeData], Evidence],
    hpke_public_key: bytes,
    channel_binding: bytes = b"",
) -> tuple[str, Evidence]:
    """Fresh evidence for the same keys (a new broker nonce) -> a fresh token. No key is released:
    this keeps the attestation document that clients verify valid for the worker's whole life."""
    challenge = _post(client, "/v1/challenge", None, ChallengeResponse)
    runtime = RuntimeData(nonce=bytes.fromhex(challenge.nonce), hpke_public_key=hpke_public_key,
                          channel_binding=channel_binding)
    bundle = make_bundle(runtime)
    attest = AttestRequest.model_construct(session_id=challenge.session_id, evidence=bundle.to_json(),
                                           tenant=ref.tenant, model=ref.model, version=ref.version)
    return _post(client, "/v1/attest", attest, AttestResponse).token, bundle


def check_key_status(client: httpx.Client, released: ReleasedKey, ref: ModelRef) -> str:
    """Poll the broker: "active" or "revoked". A worker drops the data key (and stops serving the
    model) on "revoked" and on a refusal; on a network error or 429 it keeps it and polls again.
    The broker suggests the poll interval in `check_after_s` (30 s)."""
    try:
        request = KeyStatusRequest.model_construct(token=released.token, tenant=ref.tenant, model=ref.model,
                                                   version=ref.version)
        body = _post(client, "/v1/key/status", request, KeyStatusResponse)
    except BrokerRateLimited:
        raise
    except BrokerClientError:  # refused, or an answer that is not a status: drop the key
        return "revoked"
    return body.status if body.status in ("active", "revoked") else "revoked"


# --- The key lease -----------------------------------------------------------------------------
# A released key is a lease. The worker renews it with requests signed by its attested identity
# key (the usage-signing key whose hash, with its TLS key, is the channel binding in REPORT_DATA and
# in the broker's token), so the public attestation token alone cannot renew, watch or starve it.
# The broker's answers are MACed under a key derived from the data key: only the broker that
# released the key can renew the lease or say "revoked"; a network attacker can only drop answers,
# which lets the lease run out (the worker then wipes). The worker authenticated that broker first
# (its evidence, then the token and the receipt under its attested keys: enclave_worker/broker_auth.py),
# so the data key, and the MAC key derived from it, are the attested broker's; no answer of an
# impersonator carries a valid MAC.

LEASE_REQUEST_DOMAIN = b"sealed-lease-request-v1\x00"
LEASE_ANSWER_DOMAIN = b"sealed-lease-answer-v1\x00"


def canonical_json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def lease_mac_key(data_key: bytes, token_id: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"sealed-lease-mac-v1\x00" + token_id.encode()).derive(data_key)


def lease_answer_mac(mac_key: bytes, answer: dict[str, Any]) -> str:
    fields = {k: answer[k] for k in ("token_id", "seq", "status", "lease_s")}
    return hmac.new(mac_key, LEASE_ANSWER_DOMAIN + canonical_json(fields), hashlib.sha256).hexdigest()


def lease_request_payload(body: dict[str, Any], token_id: str) -> bytes:
    """What the identity key signs: every field of the request but the token itself (its id
    stands for it) and the signature."""
    fields = {k: body[k] for k in ("tenant", "model", "version", "tls_spki", "identity_key", "seq", "at",
                                   "wait_s")}
    return LEASE_REQUEST_DOMAIN + canonical_json({**fields, "token_id": token_id})


@dataclass(frozen=True)
class WorkerIdentity:
    """The key a running worker proves itself with: its usage-signing key, bound (with the TLS
    key) into its attestation. Made in memory at process start, never stored."""

    signing_key: Ed25519PrivateKey
    tls_spki: bytes = b""  # DER SubjectPublicKeyInfo of the worker's mTLS key; empty without mTLS

    @property
    def public_key(self) -> bytes:
        return self.signing_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                          serialization.PublicFormat.Raw)


@dataclass(frozen=True)
class LeaseAnswer:
    status: str  # "active" | "revoked"
    lease_s: float


class LeaseAnswerInvalid(BrokerRefused):
    """The answer does not carry a valid MAC for this request: treated as no answer."""


async def renew_lease(client: httpx.AsyncClient, released: ReleasedKey, identity: WorkerIdentity,
                      ref: ModelRef, *, seq: int, wait_s: float,
                      mac_key: bytes) -> LeaseAnswer:
    """One renewal. With wait_s > 0 the broker holds the request (long poll) and answers at once
    when the key is revoked or the worker no longer passes the tenant's release policy, else after
    wait_s with a renewed lease. Raises on any failure."""
    body = {**ref.as_dict(), "tls_spki": identity.tls_spki.hex(),
            "identity_key": identity.public_key.hex(), "seq": seq, "at": int(time.time()),
            "wait_s": float(wait_s)}
    body["signature"] = identity.signing_key.sign(lease_request_payload(body, released.token_id)).hex()
    # The evidence the token was issued for rides along (not signed: the broker takes it only if its
    # digest is the token's), so each renewal is appraised again under the tenant's current policy.
    response = await client.post("/v1/lease", json={**body, "token": released.token,
                                                    "evidence": released.bundle.to_json()})
    if response.status_code == 403:
        raise BrokerRefused("the key broker refused the lease renewal")
    if response.status_code == 429:
        raise BrokerRateLimited("the key broker rate-limited the lease renewal")
    response.raise_for_status()
    answer = response.json()
    if not isinstance(answer, dict) or answer.get("token_id") != released.token_id or answer.get("seq") != seq:
        raise LeaseAnswerInvalid("lease answer is for another request")
    try:
        expected = lease_answer_mac(mac_key, answer)
    except (KeyError, TypeError) as exc:
        raise LeaseAnswerInvalid("malformed lease answer") from exc
    if not hmac.compare_digest(expected, str(answer.get("mac", ""))):
        raise LeaseAnswerInvalid("lease answer MAC does not verify")
    if answer["status"] not in ("active", "revoked") or not isinstance(answer["lease_s"], int | float):
        raise LeaseAnswerInvalid("malformed lease answer")
    return LeaseAnswer(status=answer["status"], lease_s=float(answer["lease_s"]))
