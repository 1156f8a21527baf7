"""The release protocol end to end (in-process broker, simulated evidence): release succeeds only
when every condition holds; each refusal is the same opaque 403 with its precise audit reason."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from attestation.bundle import EvidenceBundle, RuntimeData, expected_report_data
from key_broker.router import REFUSED
from protocol.broker.sealing import open_sealed, raw_public_key, release_info
from protocol.model_ref import ModelRef
from protocol.package.signing import signer_identity

MEASUREMENT = bytes(range(48))
SIGNER = signer_identity(Ed25519PrivateKey.from_private_bytes(bytes(range(32))).public_key())  # as conftest
Harness = Any  # the `kb` fixture's type lives in conftest.py


def _challenge(kb: Harness) -> dict[str, Any]:
    r = kb.client.post("/v1/challenge")
    assert r.status_code == 200
    return r.json()


def _attest(
    kb: Harness,
    *,
    tenant: str = "acme",
    model: str = "m",
    version: str = "v1",
    make: Callable[[RuntimeData], EvidenceBundle] | None = None,
    session: dict | None = None,
    worker: X25519PrivateKey | None = None,
) -> httpx.Response:
    ch = session or _challenge(kb)
    worker = worker or X25519PrivateKey.generate()
    runtime = RuntimeData(bytes.fromhex(ch["nonce"]), raw_public_key(worker))
    bundle = (make or kb.bundle)(runtime)
    return kb.client.post(
        "/v1/attest",
        json={
            "session_id": ch["session_id"],
            "evidence": bundle.to_json(),
            "tenant": tenant,
            "model": model,
            "version": version,
        },
    )


def _key(
    kb: Harness, token: str, tenant: str = "acme", model: str = "m", version: str = "v1"
) -> httpx.Response:
    return kb.client.post(
        "/v1/key", json={"token": token, "tenant": tenant, "model": model, "version": version}
    )


def test_release_succeeds_when_every_condition_holds(kb: Harness) -> None:
    data_key = kb.setup_tenant("acme")
    worker = X25519PrivateKey.generate()
    r = _attest(kb, worker=worker)
    assert r.status_code == 200
    token = r.json()["token"]
    released = _key(kb, token).json()
    opened = open_sealed(
        base64.b64decode(released["sealed_key"]),
        worker,
        release_info(ModelRef("acme", "m", "v1"), released["token_id"]),
    )
    assert opened == data_key
    receipt = released["receipt"]["receipt"]
    assert receipt["measurement"] == MEASUREMENT.hex() and receipt["tee"] == "sim"
    assert receipt["policy_id"] == "acme-m" and receipt["policy_version"] == 1
    entries = kb.audit_entries()
    allow = [e for e in entries if e["action"] == "attest" and e["decision"] == "allow"][-1]
    assert allow["metadata"]["evidence_digest"] and allow["metadata"]["policy_version"] == 1


def test_version_specific_policy_overrides_the_model_policy(kb: Harness) -> None:
    kb.setup_tenant("acme", version="v1")
    kb.setup_tenant(
        "acme",
        version="v2",
        create_key=False,
        measurements=("aa" * 48,),
        policy_id="acme-m-v2",
        model_version="v2",
    )
    assert _attest(kb, version="v1").status_code == 200
    assert _attest(kb, version="v2").status_code == 403  # v2's own policy allows another measurement
    assert "measurement" in kb.last_denial()["reason"]


# --- one row per refusal ---------------------------------------------------------------------------


def _replayed_nonce(kb: Harness) -> httpx.Response:
    ch = _challenge(kb)
    assert _attest(kb, session=ch).status_code == 200
    return _attest(kb, session=ch)


def _expired_nonce(kb: Harness) -> httpx.Response:
    ch = _challenge(kb)
    kb.clock.advance(61)
    return _attest(kb, session=ch)


def _unknown_nonce(kb: Harness) -> httpx.Response:
    return _attest(kb, session={"session_id": secrets.token_hex(16), "nonce": secrets.token_hex(32)})


def _evidence_for_another_nonce(kb: Harness) -> httpx.Response:
    ch, other = _challenge(kb), _challenge(kb)
    return _attest(kb, session={"session_id": ch["session_id"], "nonce": other["nonce"]})


def _binding_mismatch(kb: Harness) -> httpx.Response:
    def make(rt: RuntimeData) -> EvidenceBundle:
        # The report vouches for another HPKE key than the bundle presents.
        other = RuntimeData(rt.nonce, raw_public_key(X25519PrivateKey.generate()))
        good = kb.bundle(other)
        return EvidenceBundle(tee="sim", cpu_evidence=good.cpu_evidence, runtime_data=rt)

    return _attest(kb, make=make)


def _forged_platform(kb: Harness) -> httpx.Response:
    return _attest(kb, make=lambda rt: kb.bundle(rt, platform=Ed25519PrivateKey.generate()))


def _sim_not_allowed(kb: Harness) -> httpx.Response:
    kb.put_policy(
        "acme",
        {
            "policy_id": "acme-m",
            "version": 2,
            "tenant": "acme",
            "model": "m",
            "allowed_tee": ["sim"],
            "allowed_measurements": [MEASUREMENT.hex()],
            "required_signer": SIGNER,
        },
    )
    return _attest(kb)


def _policy_edit(**changes: Any) -> Callable[[Harness], httpx.Response]:
    def run(kb: Harness) -> httpx.Response:
        doc = {
            "policy_id": "acme-m",
            "version": 2,
            "tenant": "acme",
            "model": "m",
            "allowed_tee": ["sim"],
            "allowed_measurements": [MEASUREMENT.hex()],
            "required_signer": SIGNER,
            "unsafe_allow_simulated_tee": True,
            **changes,
        }
        kb.put_policy("acme", doc)
        return _attest(kb)

    return run


def _debug_on(kb: Harness) -> httpx.Response:
    return _attest(
        kb,
        make=lambda rt: EvidenceBundle(
            tee="sim",
            cpu_evidence=kb.sim_report(MEASUREMENT, expected_report_data(rt, ()), debug=True),
            runtime_data=rt,
        ),
    )


def _no_policy(kb: Harness) -> httpx.Response:
    return _attest(kb, model="m2")


def _revoked(kb: Harness) -> httpx.Response:
    assert kb.admin("POST", "/tenants/acme/key/revoke").status_code == 200
    return _attest(kb)


def _token_then(action: Callable[[Harness, str], httpx.Response]) -> Callable[[Harness], httpx.Response]:
    def run(kb: Harness) -> httpx.Response:
        r = _attest(kb)
        assert r.status_code == 200
        return action(kb, r.json()["token"])

    return run


def _replayed_token(kb: Harness, token: str) -> httpx.Response:
    assert _key(kb, token).status_code == 200
    return _key(kb, token)


def _expired_token(kb: Harness, token: str) -> httpx.Response:
    kb.clock.advance(301)
    return _key(kb, token)


def _forged_token(kb: Harness, token: str) -> httpx.Response:
    claims = jwt.decode(token, options={"verify_signature": False})
    header = jwt.get_unverified_header(token)
    return _key(kb, jwt.encode(claims, ec.generate_private_key(ec.SECP256R1()), "ES256", headers=header))


def _policy_changed_after_attest(kb: Harness, token: str) -> httpx.Response:
    _policy_edit()(kb)
    return _key(kb, token)


def _revoked_after_attest(kb: Harness, token: str) -> httpx.Response:
    kb.admin("POST", "/tenants/acme/key/revoke")
    return _key(kb, token)


REFUSALS: list[tuple[str, Callable[[Harness], httpx.Response], str]] = [
    ("replayed nonce", _replayed_nonce, "unknown or already used challenge"),
    ("expired nonce", _expired_nonce, "challenge expired"),
    ("unknown nonce", _unknown_nonce, "unknown or already used challenge"),
    ("evidence for another nonce", _evidence_for_another_nonce, "different nonce"),
    ("binding mismatch", _binding_mismatch, "REPORT_DATA does not bind"),
    ("evidence signed by an unpinned platform key", _forged_platform, "SignatureError"),
    ("simulated TEE not allowed by policy", _sim_not_allowed, "simulated (insecure) TEE"),
    ("measurement not allowed", _policy_edit(allowed_measurements=["ab" * 48]), "measurement"),
    ("TEE type not allowed", _policy_edit(allowed_tee=["snp"]), "TEE type is not allowed"),
    ("TCB below minimum", _policy_edit(min_tcb={"sim": 2}), "below floor"),
    ("debug forbidden", _debug_on, "debug mode"),
    ("GPU CC required", _policy_edit(require_gpu_cc=True), "GPU confidential computing is off"),
    (
        "wrong model signer",
        _policy_edit(required_signer="ed25519:someone-else"),
        "model signer is not the required signer",
    ),
    ("no policy for the model (default deny)", _no_policy, "no release policy"),
    ("tenant key revoked", _revoked, "revoked"),
    ("token for another tenant", _token_then(lambda kb, t: _key(kb, t, tenant="other")), "another tenant"),
    ("token for another model", _token_then(lambda kb, t: _key(kb, t, model="m2")), "another tenant, model"),
    (
        "token for another version",
        _token_then(lambda kb, t: _key(kb, t, version="v2")),
        "another tenant, model",
    ),
    ("replayed token", _token_then(_replayed_token), "already used"),
    ("expired token", _token_then(_expired_token), "expired"),
    ("forged token", _token_then(_forged_token), "TokenError"),
    ("policy changed after attestation", _token_then(_policy_changed_after_attest), "policy changed"),
    ("tenant key revoked after attestation", _token_then(_revoked_after_attest), "revoked"),
]


@pytest.mark.parametrize(("case", "scenario", "reason"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_refusal_is_one_opaque_403_with_its_reason_audited(
    kb: Harness, case: str, scenario: Callable, reason: str
) -> None:
    kb.setup_tenant("acme")
    kb.setup_tenant("other", create_key=True)
    kb.setup_tenant("acme", model="m2", create_key=False, with_policy=False)  # default-deny row
    response = scenario(kb)
    assert response.status_code == 403, (case, response.text)
    assert response.json() == REFUSED
    assert reason in kb.last_denial()["reason"], kb.last_denial()
    for entry in kb.audit_entries():
        assert "data_key" not in entry["metadata"]


def test_refusals_are_indistinguishable_to_the_caller(kb: Harness) -> None:
    kb.setup_tenant("acme")
    bodies = {_unknown_nonce(kb).content, _binding_mismatch(kb).content, _no_policy(kb).content}
    assert len(bodies) == 1
