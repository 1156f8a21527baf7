"""Negative tables for issue #46's invitation and governing-key checks (no trust on first use).

The tenant's side (protocol/broker/tenancy.py, used by `sealed keys admin-key` and every tenant-side
command): an invitation or governing-key answer that does not verify under the attested broker
instance key, names another tenant or instance, has expired or answers another nonce is refused.
The broker's side (key_broker/invitations.py, policy_admin.py): a first key binds only as the answer
to a nonce this broker instance issued for this tenant, unexpired, never used, signed by that key.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy.release_documents import admin_key_statement, invitation_acceptance, public_pem
from protocol.broker.tenancy import (
    TenancyRefused,
    check_governing_key,
    check_invitation,
    sign_governing_key,
    sign_invitation,
)
from tests.key_broker.conftest import Clock, Harness

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
INSTANCE = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
RAW = INSTANCE.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
OTHER = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
NONCE = "ab" * 32
TENANT_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(2, 34)))


def _invitation(**changes: Any) -> dict[str, Any]:
    doc = sign_invitation(INSTANCE, "acme", NONCE, NOW + dt.timedelta(days=1))
    doc["payload"].update(changes)
    return doc


def _resigned(key: Ed25519PrivateKey, **changes: Any) -> dict[str, Any]:
    """An invitation with ``changes``, signed again by ``key`` (what a forger could make)."""
    payload = {**sign_invitation(INSTANCE, "acme", NONCE, NOW + dt.timedelta(days=1))["payload"], **changes}
    return sign_invitation(key, str(payload["tenant"]), str(payload["nonce"]),
                           dt.datetime.fromisoformat(str(payload["expires"])))


INVITATIONS: list[tuple[str, Callable[[], Any], str]] = [
    ("bad signature: signed by another key", lambda: _resigned(OTHER), "signature does not verify"),
    ("edited after signing: another tenant", lambda: _invitation(tenant="evil"), "signature does not verify"),
    ("edited after signing: later expiry", lambda: _invitation(expires=(NOW + dt.timedelta(days=99)).isoformat()),
     "signature does not verify"),
    ("for another tenant", lambda: sign_invitation(INSTANCE, "evil", NONCE, NOW + dt.timedelta(days=1)),
     "for tenant 'evil'"),
    ("expired", lambda: sign_invitation(INSTANCE, "acme", NONCE, NOW - dt.timedelta(seconds=1)), "expired"),
    ("malformed nonce", lambda: sign_invitation(INSTANCE, "acme", "xyz", NOW + dt.timedelta(days=1)), "nonce"),
    ("not an invitation", lambda: {"payload": {}, "sig": ""}, "unexpected fields"),
    ("not an object", lambda: "invitation", "not a tenant invitation"),
]


@pytest.mark.parametrize(("case", "make", "match"), INVITATIONS, ids=[c[0] for c in INVITATIONS])
def test_a_bad_invitation_is_refused_by_the_tenant(case: str, make: Callable[[], Any], match: str) -> None:
    with pytest.raises(TenancyRefused, match=match):
        check_invitation(make(), instance_key=RAW, tenant="acme", now=NOW)


def test_an_invitation_of_another_broker_instance_is_refused() -> None:
    """Signed by a second broker (or a re-initialised one): the pinned instance's key does not verify it."""
    with pytest.raises(TenancyRefused, match="signature does not verify"):
        check_invitation(sign_invitation(OTHER, "acme", NONCE, NOW + dt.timedelta(days=1)), instance_key=RAW,
                         tenant="acme", now=NOW)
    assert check_invitation(_invitation(), instance_key=RAW, tenant="acme", now=NOW)["nonce"] == NONCE  # control


OWN = {"key_id": "acme-admin", "public_key_pem": public_pem(TENANT_KEY.public_key()), "version": 1}
THEIRS = {"key_id": "acme-admin", "public_key_pem": public_pem(OTHER.public_key()), "version": 1}
GOVERNING: list[tuple[str, Callable[[], Any], str]] = [
    ("governed by another key (the operator's)", lambda: sign_governing_key(INSTANCE, "acme", NONCE, THEIRS),
     "NOT yours"),
    ("no key bound yet", lambda: sign_governing_key(INSTANCE, "acme", NONCE, None), "accept its invitation"),
    ("replayed answer (another nonce)", lambda: sign_governing_key(INSTANCE, "acme", "cd" * 32, OWN), "replayed"),
    ("for another tenant", lambda: sign_governing_key(INSTANCE, "evil", NONCE, OWN), "another tenant"),
    ("signed by another broker instance", lambda: sign_governing_key(OTHER, "acme", NONCE, OWN),
     "signature does not verify"),
]


@pytest.mark.parametrize(("case", "make", "match"), GOVERNING, ids=[c[0] for c in GOVERNING])
def test_a_governing_key_answer_that_is_not_the_tenants_own_is_refused(case: str, make: Callable[[], Any],
                                                                        match: str) -> None:
    with pytest.raises(TenancyRefused, match=match):
        check_governing_key(make(), instance_key=RAW, tenant="acme", nonce=NONCE,
                            own_public_pem=OWN["public_key_pem"])
    assert check_governing_key(sign_governing_key(INSTANCE, "acme", NONCE, OWN), instance_key=RAW, tenant="acme",
                               nonce=NONCE, own_public_pem=OWN["public_key_pem"]) == "acme-admin"  # control


@pytest.fixture()
def kb(tmp_path: Path) -> Iterator[Harness]:
    """The key broker harness with a controllable clock (invitations expire)."""
    harness = Harness(tmp_path / "kb", Clock())
    yield harness
    harness.close()


def _accept(kb: Harness, statement: dict[str, Any]) -> int:
    return kb.as_tenant("acme", "PUT", "/tenants/acme/policy-admin-key", json=statement).status_code


def _denial(kb: Harness) -> str:
    return str(kb.last_denial()["reason"])


def test_the_broker_binds_a_first_key_only_as_the_answer_to_its_invitation(kb: Harness) -> None:
    key = Ed25519PrivateKey.generate()
    invitation = kb.invitation("acme")["payload"]
    cases: list[tuple[dict[str, Any], str]] = [
        (admin_key_statement("acme", key.public_key(), "k", 1, key, "k"), "must answer an invitation"),
        (invitation_acceptance("acme", key, "k", {**invitation, "nonce": "00" * 32}), "not issued by this broker"),
        (invitation_acceptance("acme", key, "k", {**invitation, "broker_instance": "11" * 32}),
         "another broker instance"),
        (invitation_acceptance("acme", key, "k", kb.invitation("other")["payload"]), "not issued by this broker"),
    ]
    forged = invitation_acceptance("acme", key, "k", invitation)
    forged["sig"] = Ed25519PrivateKey.generate().sign(b"x").hex()  # not signed by the key it binds
    cases.append((forged, "signature does not verify"))
    for statement, match in cases:
        assert _accept(kb, statement) == 403
        assert match in _denial(kb), (match, _denial(kb))
    assert kb.admin("GET", "/tenants/acme/policy-admin-key").status_code == 404  # nothing bound
    assert _accept(kb, invitation_acceptance("acme", key, "k", invitation)) == 200  # the invitation is still good
    replay = invitation_acceptance("acme", Ed25519PrivateKey.generate(), "k2", invitation)
    assert _accept(kb, replay) == 403 and "used already" in _denial(kb)
    assert kb.admin("POST", "/tenants/acme/invitations").status_code == 409  # governed: no new invitation


def test_an_expired_or_replayed_invitation_binds_nothing(kb: Harness) -> None:
    invitation = kb.invitation("acme")["payload"]
    kb.clock.advance(7 * 86400 + 1)
    key = Ed25519PrivateKey.generate()
    assert _accept(kb, invitation_acceptance("acme", key, "k", invitation)) == 403 and "expired" in _denial(kb)
    fresh = kb.invitation("acme")["payload"]
    assert _accept(kb, invitation_acceptance("acme", key, "k", fresh)) == 200
    assert _accept(kb, invitation_acceptance("acme", key, "k", fresh)) == 403 and "used already" in _denial(kb)


def test_the_governing_key_answer_is_signed_by_the_attested_instance(kb: Harness) -> None:
    kb.policy_key("acme")
    identity = kb.service.attested.identity  # type: ignore[union-attr]
    answer = kb.client.post("/v1/broker/tenants/acme/governing-key", json={"nonce": NONCE}).json()
    own = public_pem(kb.policy_key("acme").public_key())
    assert check_governing_key(answer, instance_key=identity.instance_key, tenant="acme", nonce=NONCE,
                               own_public_pem=own) == "acme-admin"
    with pytest.raises(TenancyRefused, match="NOT yours"):
        check_governing_key(answer, instance_key=identity.instance_key, tenant="acme", nonce=NONCE,
                            own_public_pem=public_pem(OTHER.public_key()))
    assert kb.client.post("/v1/broker/tenants/acme/governing-key", json={"nonce": "zz"}).status_code == 422
    assert kb.client.post("/v1/broker/tenants/..%2Fx/governing-key", json={"nonce": NONCE}).status_code in (404, 422)
