"""Finding 1 (broker side): a key lease is renewed only by the attested worker, a flood made with
the public token cannot starve it, and a held renewal answers "revoked" as soon as it happens.

Also the same class of bug at release: a used (public) token drained the per-measurement bucket,
so new workers of that build got 429 and could not boot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.bundle import channel_binding
from protocol.broker.client import (
    WorkerIdentity,
    lease_mac_key,
    lease_request_payload,
    obtain_data_key,
    renew_lease,
)
from protocol.broker.errors import BrokerRefused
from protocol.model_ref import ModelRef
from tests.key_broker.conftest import Harness

SCOPE = {"tenant": "acme", "model": "m", "version": "v1"}


def attested_worker(kb: Harness) -> tuple[Any, WorkerIdentity]:
    """A worker whose attestation binds its identity key (as `enclave_worker` does)."""
    identity = WorkerIdentity(Ed25519PrivateKey.generate(), b"spki-der")
    released = obtain_data_key(kb.client, ModelRef(**SCOPE), make_bundle=kb.bundle,
                               channel_binding=channel_binding(identity.tls_spki, identity.public_key))
    return released, identity


def renew(kb: Harness, released: Any, identity: WorkerIdentity, seq: int, wait_s: float = 0.0) -> str:
    """The worker's own renewal call, through the in-process app."""
    async def go() -> str:
        transport = httpx.ASGITransport(app=kb.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://broker") as client:
            answer = await renew_lease(client, released, identity, ModelRef(**SCOPE), seq=seq, wait_s=wait_s,
                                       mac_key=lease_mac_key(released.data_key, released.token_id))
            return answer.status
    return asyncio.run(go())


def signed_body(released: Any, identity: WorkerIdentity, seq: int, **override: Any) -> dict[str, Any]:
    body = {**SCOPE, "tls_spki": identity.tls_spki.hex(), "identity_key": identity.public_key.hex(), "seq": seq,
            "at": int(time.time()), "wait_s": 0.0}
    body.update(override)
    body["signature"] = identity.signing_key.sign(lease_request_payload(body, released.token_id)).hex()
    return {**body, "token": released.token, "evidence": released.bundle.to_json()}


def test_the_attested_worker_renews_its_lease(kb: Harness) -> None:
    kb.setup_tenant("acme")
    released, identity = attested_worker(kb)
    assert renew(kb, released, identity, 1) == "active"
    assert renew(kb, released, identity, 2) == "active"


def _other_key(r: Any, i: WorkerIdentity) -> dict:
    return signed_body(r, WorkerIdentity(Ed25519PrivateKey.generate(), i.tls_spki), 5)


def _unbound_key_signed_by_itself(r: Any, i: WorkerIdentity) -> dict:
    other = WorkerIdentity(Ed25519PrivateKey.generate(), i.tls_spki)
    return signed_body(r, other, 5)


def _bad_signature(r: Any, i: WorkerIdentity) -> dict:
    return {**signed_body(r, i, 5), "signature": "ab" * 64}


def _changed_after_signing(r: Any, i: WorkerIdentity) -> dict:
    return {**signed_body(r, i, 5), "wait_s": 30.0}


def _other_tls_key(r: Any, i: WorkerIdentity) -> dict:
    return signed_body(r, WorkerIdentity(i.signing_key, b"other-spki"), 5)


def _stale(r: Any, i: WorkerIdentity) -> dict:
    return signed_body(r, i, 5, at=int(time.time()) - 3600)


def _other_scope(r: Any, i: WorkerIdentity) -> dict:
    return {**signed_body(r, i, 5), "model": "other"}


FORGERIES = [
    ("identity-key-not-bound", _other_key),
    ("self-signed-unbound-key", _unbound_key_signed_by_itself),
    ("bad-signature", _bad_signature),
    ("changed-after-signing", _changed_after_signing),
    ("other-tls-key", _other_tls_key),
    ("stale", _stale),
    ("other-model", _other_scope),
]


@pytest.mark.parametrize(("name", "make"), FORGERIES, ids=[f[0] for f in FORGERIES])
def test_the_public_token_alone_cannot_renew(kb: Harness, name: str, make: Any) -> None:
    kb.setup_tenant("acme")
    released, identity = attested_worker(kb)
    r = kb.client.post("/v1/lease", json=make(released, identity))
    assert r.status_code == 403 and r.json()["error"]["type"] == "refused"
    assert kb.last_denial()["action"] == "lease"


def test_a_replayed_renewal_is_refused(kb: Harness) -> None:
    kb.setup_tenant("acme")
    released, identity = attested_worker(kb)
    body = signed_body(released, identity, 7)
    assert kb.client.post("/v1/lease", json=body).status_code == 200
    assert kb.client.post("/v1/lease", json=body).status_code == 403
    assert kb.client.post("/v1/lease", json=signed_body(released, identity, 6)).status_code == 403


def test_a_flood_with_the_public_token_does_not_starve_the_worker(kb: Harness) -> None:
    """The red-team flood: the status endpoint and the lease endpoint hammered with the token from
    /.well-known/attestation, far past the rate limit (5/minute here). The worker still renews."""
    kb.setup_tenant("acme")
    released, identity = attested_worker(kb)
    statuses = set()
    for i in range(30):
        statuses.add(kb.client.post("/v1/key/status", json={"token": released.token, **SCOPE}).status_code)
        statuses.add(kb.client.post("/v1/lease", json=_other_key(released, identity)).status_code)
        statuses.add(kb.client.post("/v1/lease", json=signed_body(released, identity, 1000 + i,
                                                                   at=0)).status_code)
    assert 429 in statuses and 403 in statuses  # the flood itself is limited or refused
    for seq in range(1, 4):
        assert renew(kb, released, identity, seq) == "active"


def hold_for_an_hour(kb: Harness, recheck_s: float) -> None:
    """Held renewals of an hour: an answer before that can only come from the revocation (an event,
    or a re-read every `recheck_s`), so no test needs to time it."""
    kb.app.state.leases.settings = dataclasses.replace(kb.app.state.leases.settings, max_wait_s=3600.0,
                                                       recheck_s=recheck_s)


def held_renewal(kb: Harness, released: Any, identity: WorkerIdentity) -> tuple[threading.Thread, dict[str, str]]:
    result: dict[str, str] = {}
    thread = threading.Thread(target=lambda: result.update(status=renew(kb, released, identity, 2, wait_s=3600.0)),
                              daemon=True)
    thread.start()
    return thread, result


def test_a_held_renewal_answers_revoked_as_soon_as_the_tenant_key_is_revoked(kb: Harness) -> None:
    """Event-based: the renewal is held for an hour and never re-reads on its own; it answers
    "revoked" only because the revocation woke it."""
    kb.setup_tenant("acme")
    released, identity = attested_worker(kb)
    assert renew(kb, released, identity, 1) == "active"
    hold_for_an_hour(kb, recheck_s=3600.0)
    thread, result = held_renewal(kb, released, identity)
    time.sleep(1.0)
    assert "status" not in result  # held open while the key is active
    assert kb.admin("POST", "/tenants/acme/key/revoke").status_code == 200
    thread.join(60)  # a hang guard: without the wake-up it would answer in an hour
    assert not thread.is_alive() and result["status"] == "revoked"


def test_a_held_renewal_sees_a_revocation_made_outside_the_admin_api(kb: Harness) -> None:
    kb.setup_tenant("acme")
    released, identity = attested_worker(kb)
    assert renew(kb, released, identity, 1) == "active"
    hold_for_an_hour(kb, recheck_s=1.0)  # only the periodic re-read can see a change made elsewhere
    thread, result = held_renewal(kb, released, identity)
    kb.service.keystore.revoke_tenant_key("acme")
    thread.join(60)  # a hang guard: the hold itself lasts an hour
    assert not thread.is_alive() and result["status"] == "revoked"


def test_answers_are_bound_to_the_data_key(kb: Harness) -> None:
    """The broker MACs its answer under a key derived from the data key and this release's token
    id: a party that does not hold the data key cannot forge "active" (nor check a real answer)."""
    kb.setup_tenant("acme")
    released, identity = attested_worker(kb)
    with pytest.raises(BrokerRefused):
        async def go() -> None:
            transport = httpx.ASGITransport(app=kb.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://broker") as client:
                await renew_lease(client, released, identity, ModelRef(**SCOPE), seq=1, wait_s=0.0,
                                  mac_key=lease_mac_key(bytes(32), released.token_id))
        asyncio.run(go())


def test_a_used_public_token_does_not_drain_the_release_bucket(kb: Harness) -> None:
    kb.setup_tenant("acme")
    used = kb.obtain("acme")
    for _ in range(20):
        r = kb.client.post("/v1/key", json={"token": used.token, **SCOPE})
        assert r.status_code == 403
    fresh = kb.obtain("acme")  # was 429 before: the flood spent this build's release bucket
    assert fresh.data_key == used.data_key
