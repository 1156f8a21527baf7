"""The operator attacks what releases the demo tenant's key, live (issue #32, release policies).

The same stack as tests/security/test_operator_attacks.py (fake-TEE harness, the real broker,
gateway and worker as `sealed up` runs them). The operator holds every file of the data directory,
the broker's operator admin token (`broker/admin-token`) and the simulated platform's key
(`sim/platform.pem`), so it can make simulated-TEE evidence for any measurement of its choosing.
On main before issue #32 both attacks worked: the operator's token PUT version 2 of the demo
release policy admitting its own measurement and the broker released the demo tenant's data key to
it; and a data key was imported without any tenant credential check beyond the operator's token.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.home import ed25519_key
from api.stack import DEMO_MODEL, DEMO_TENANT, DEMO_VERSION
from attestation.bundle import EvidenceBundle, expected_report_data
from attestation.sim import SimTee
from policy.release_documents import sign_release_policy
from protocol.broker.client import obtain_data_key
from protocol.broker.errors import BrokerRefused
from protocol.model_ref import ModelRef
from tests.api.test_fake_tee_stack import audit_records
from tests.key_broker.conftest import sealed_key_upload
from tests.security import test_operator_attacks as attacks
from tests.security.test_operator_attacks import Live

live = attacks.live  # the live stack fixture (module scope: a stack of this module's own)

ROGUE = bytes(range(200, 248))  # the operator's own build
DEMO = ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)


def _operator_token(live: Live) -> str:
    return (live.env.home.broker / "admin-token").read_text().strip()


def _broker(live: Live, method: str, path: str, token: str | None, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, f"{live.stack.broker_url}/v1/admin{path}", headers=headers, timeout=30, **kw)


def _policies(live: Live) -> list[dict]:
    answer = _broker(live, "GET", f"/tenants/{DEMO_TENANT}/policies", _operator_token(live))
    assert answer.status_code == 200, answer.text
    return sorted(answer.json(), key=lambda p: json.dumps(p, sort_keys=True))


def _rogue_release(live: Live) -> Any:
    """What the operator's own build gets: a simulated report for its measurement, signed with the
    simulated platform's key from the data directory."""
    platform = ed25519_key(live.env.home.sim_key)

    def bundle(runtime: Any) -> EvidenceBundle:
        report = SimTee(platform, ROGUE).get_report(expected_report_data(runtime, ()))
        return EvidenceBundle(tee="sim", cpu_evidence=report, runtime_data=runtime)

    with httpx.Client(base_url=live.stack.broker_url, timeout=30) as client:
        return obtain_data_key(client, DEMO, make_bundle=bundle)


def test_operator_written_release_policy_is_refused(live: Live) -> None:
    """The operator's admin token PUTs the next version of the demo policy admitting its own
    measurement (unsigned, and signed with a key of its own): refused, audited, and the demo
    tenant's key is not released to that measurement."""
    before = _policies(live)
    current = max(p["version"] for p in before if p["model"] == DEMO_MODEL)
    rogue = {**next(p for p in before if p["model"] == DEMO_MODEL), "version": current + 1,
             "allowed_tee": ["sim", "snp", "tdx"], "allowed_measurements": [ROGUE.hex()],
             "unsafe_allow_simulated_tee": True}
    own_key = Ed25519PrivateKey.generate()
    attempts = [rogue, sign_release_policy(rogue, own_key, "demo-admin"),
                sign_release_policy(rogue, own_key, "operator")]
    seen = len(audit_records(live.env.home))
    for body in attempts:
        answer = _broker(live, "PUT", f"/tenants/{DEMO_TENANT}/policies", _operator_token(live), json=body)
        assert answer.status_code == 403, answer.text
    # Nor can it make its own key the tenant's policy-admin key.
    answer = _broker(live, "PUT", f"/tenants/{DEMO_TENANT}/policy-admin-key", _operator_token(live),
                     json={"payload": {}, "key_id": "operator", "alg": "Ed25519", "sig": "00"})
    assert answer.status_code == 403
    assert _policies(live) == before
    denials = [r for r in audit_records(live.env.home)[seen:] if r["decision"] == "deny"]
    assert [r["action"] for r in denials if r["action"] == "policy-put"] == ["policy-put"] * 3
    assert any(r["action"] == "admin-auth" for r in denials)
    with pytest.raises(BrokerRefused):
        _rogue_release(live)


def test_unauthenticated_key_import_is_refused(live: Live) -> None:
    """A data key for the demo tenant's model, imported without the tenant's credential (none, and
    the operator's token): refused, audited, nothing stored."""
    pem = httpx.get(f"{live.stack.broker_url}/v1/import-key", timeout=30).json()["public_key_pem"]
    body, _ = sealed_key_upload(pem, DEMO_TENANT, DEMO_MODEL, "v9")
    path = f"/tenants/{DEMO_TENANT}/models/{DEMO_MODEL}/versions/v9/data-key"
    seen = len(audit_records(live.env.home))
    assert _broker(live, "PUT", path, None, json=body).status_code == 401
    assert _broker(live, "PUT", path, _operator_token(live), json=body).status_code == 403
    status = _broker(live, "GET", f"/tenants/{DEMO_TENANT}", _operator_token(live)).json()
    assert all(d["version"] != "v9" for d in status["data_keys"])
    records = audit_records(live.env.home)[seen:]
    assert any(r["action"] == "admin-auth" and r["decision"] == "deny" for r in records)
    assert any(r["action"] == "edge-refusal" and r["metadata"]["status"] == 401 for r in records)
    assert not any(r["action"] == "data-key-register" and r["decision"] == "allow" for r in records)
