"""Cross-tenant matrix: a worker attested for tenant A's model never gets tenant B's key, through
any route (attest, key, key status, admin), even when both tenants allow the same measurement."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from attestation.bundle import RuntimeData
from key_broker.router import REFUSED
from protocol.broker.sealing import open_sealed, raw_public_key, release_info
from protocol.model_ref import ModelRef

Harness = Any
TENANTS = ("alpha", "bravo")
A_ONLY = bytes([1]) * 48
SHARED = bytes(range(48))


@pytest.fixture()
def two(kb: Harness) -> Harness:
    kb.keys = {
        t: kb.setup_tenant(t, measurements=(SHARED.hex(),) + ((A_ONLY.hex(),) if t == "alpha" else ()))
        for t in TENANTS
    }
    return kb


def _token(kb: Harness, tenant: str, measurement: bytes, worker: X25519PrivateKey) -> str:
    ch = kb.client.post("/v1/challenge").json()
    bundle = kb.bundle(RuntimeData(bytes.fromhex(ch["nonce"]), raw_public_key(worker)), measurement)
    r = kb.client.post(
        "/v1/attest",
        json={
            "session_id": ch["session_id"],
            "evidence": bundle.to_json(),
            "tenant": tenant,
            "model": "m",
            "version": "v1",
        },
    )
    assert r.status_code == 200, r.text
    return r.json()["token"]


@pytest.mark.parametrize("measurement", [A_ONLY, SHARED], ids=["a-only-measurement", "shared-measurement"])
def test_a_worker_attested_for_alpha_never_gets_bravos_key(two: Harness, measurement: bytes) -> None:
    kb = two
    worker = X25519PrivateKey.generate()
    token = _token(kb, "alpha", measurement, worker)
    scope = {"tenant": "bravo", "model": "m", "version": "v1"}
    # Route 1: the key endpoint with alpha's token.
    assert kb.client.post("/v1/key", json={"token": token, **scope}).json() == REFUSED
    # Route 2: key status with alpha's token for bravo.
    assert kb.client.post("/v1/key/status", json={"token": token, **scope}).json() == REFUSED
    # Route 3: the admin API without, or with alpha's own, credentials.
    alpha_admin = kb.admin("POST", "/tenants/alpha/admin-tokens").json()["token"]
    assert (
        kb.client.get(
            "/v1/admin/tenants/bravo/receipts", headers={"Authorization": f"Bearer {token}"}
        ).status_code
        == 401
    )
    assert kb.admin("GET", "/tenants/bravo/receipts", token=alpha_admin).status_code == 403
    # Route 4: alpha's sealed key cannot be opened as bravo's (the HPKE info binds the tenant).
    released = kb.client.post(
        "/v1/key", json={"token": token, "tenant": "alpha", "model": "m", "version": "v1"}
    )
    body = released.json()
    sealed = base64.b64decode(body["sealed_key"])
    assert open_sealed(sealed, worker, release_info(ModelRef("alpha", "m", "v1"), body["token_id"])) == kb.keys["alpha"]
    with pytest.raises(Exception):  # noqa: B017 (any HPKE failure)
        open_sealed(sealed, worker, release_info(ModelRef("bravo", "m", "v1"), body["token_id"]))
    # Route 5: attesting for bravo with alpha-only evidence is refused by bravo's policy.
    if measurement == A_ONLY:
        ch = kb.client.post("/v1/challenge").json()
        bundle = kb.bundle(RuntimeData(bytes.fromhex(ch["nonce"]), raw_public_key(worker)), measurement)
        r = kb.client.post(
            "/v1/attest", json={"session_id": ch["session_id"], "evidence": bundle.to_json(), **scope}
        )
        assert r.json() == REFUSED
    receipts = kb.admin("GET", "/tenants/bravo/receipts").json()["receipts"]
    assert receipts == []
    assert not [
        e
        for e in kb.audit_entries()
        if e["tenant"] == "bravo" and e["action"] == "release" and e["decision"] == "allow"
    ]


def test_a_data_key_file_moved_between_tenants_does_not_unwrap(two: Harness) -> None:
    kb = two
    base = kb.settings.data_dir / "keystore" / "datakeys"
    worker = X25519PrivateKey.generate()
    token = _token(kb, "bravo", SHARED, worker)
    (base / "bravo" / "m" / "v1.json").write_bytes((base / "alpha" / "m" / "v1.json").read_bytes())
    r = kb.client.post("/v1/key", json={"token": token, "tenant": "bravo", "model": "m", "version": "v1"})
    assert r.json() == REFUSED
    # The state ledger refuses the moved file; were it bypassed, the AEAD context would still refuse.
    assert "StateTampered" in kb.last_denial()["reason"]
