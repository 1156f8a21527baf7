"""Worker-side client of the key-release protocol (runs inside the attested worker)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from attestation.bundle import EvidenceBundle, RuntimeData
from key_broker.errors import RateLimited, ReleaseRefused
from key_broker.sealing import open_sealed, raw_public_key, release_info


@dataclass(frozen=True)
class ReleasedKey:
    data_key: bytes
    token: str
    token_id: str
    bundle: EvidenceBundle
    receipt: dict


def _post(client: httpx.Client, path: str, body: dict | None = None) -> dict:
    response = client.post(path, json=body or {})
    if response.status_code == 403:
        raise ReleaseRefused("the key broker refused the request")
    if response.status_code == 429:
        raise RateLimited("the key broker rate-limited the request; retry later")
    response.raise_for_status()
    return response.json()


def obtain_data_key(
    client: httpx.Client,
    *,
    tenant: str,
    model: str,
    version: str,
    make_bundle: Callable[[RuntimeData], EvidenceBundle],
    channel_binding: bytes = b"",
    hpke_key: X25519PrivateKey | None = None,
) -> ReleasedKey:
    """Challenge -> evidence bound to an HPKE key (and the worker's channel keys) -> token ->
    sealed data key -> open it. ``hpke_key``: the worker's serving key, which sealed-mode clients
    encrypt to (docs/sealed-mode.md); without it, a key made for this release only."""
    ephemeral = hpke_key or X25519PrivateKey.generate()
    challenge = _post(client, "/v1/challenge")
    runtime = RuntimeData(nonce=bytes.fromhex(challenge["nonce"]), hpke_public_key=raw_public_key(ephemeral),
                          channel_binding=channel_binding)
    bundle = make_bundle(runtime)
    scope = {"tenant": tenant, "model": model, "version": version}
    token = _post(client, "/v1/attest", {"session_id": challenge["session_id"], "evidence": bundle.to_json(),
                                         **scope})["token"]
    released = _post(client, "/v1/key", {"token": token, **scope})
    data_key = open_sealed(base64.b64decode(released["sealed_key"]), ephemeral,
                           release_info(tenant, model, version, released["token_id"]))
    return ReleasedKey(data_key, token, released["token_id"], bundle, released["receipt"])


def renew_attestation(
    client: httpx.Client,
    *,
    tenant: str,
    model: str,
    version: str,
    make_bundle: Callable[[RuntimeData], EvidenceBundle],
    hpke_public_key: bytes,
    channel_binding: bytes = b"",
) -> tuple[str, EvidenceBundle]:
    """Fresh evidence for the same keys (a new broker nonce) -> a fresh token. No key is released:
    this keeps the attestation document that clients verify valid for the worker's whole life."""
    challenge = _post(client, "/v1/challenge")
    runtime = RuntimeData(nonce=bytes.fromhex(challenge["nonce"]), hpke_public_key=hpke_public_key,
                          channel_binding=channel_binding)
    bundle = make_bundle(runtime)
    token = _post(client, "/v1/attest", {"session_id": challenge["session_id"], "evidence": bundle.to_json(),
                                         "tenant": tenant, "model": model, "version": version})["token"]
    return token, bundle


def check_key_status(client: httpx.Client, released: ReleasedKey, *, tenant: str, model: str,
                     version: str) -> str:
    """Poll the broker: "active" or "revoked". A worker drops the data key (and stops serving the
    model) on "revoked" and on a refusal; on a network error or 429 it keeps it and polls again.
    The broker suggests the poll interval in `check_after_s` (30 s)."""
    try:
        body = _post(client, "/v1/key/status", {"token": released.token, "tenant": tenant, "model": model,
                                                "version": version})
    except ReleaseRefused:
        return "revoked"
    status = str(body.get("status"))
    return status if status in ("active", "revoked") else "revoked"
