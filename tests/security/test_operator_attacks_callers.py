"""The operator attacks who may call the tenant's model (issue #46, attack 5a).

On main at c92c9f1 an API key the operator created for the tenant with its own management login
answered plaintext and sealed requests (receipt tenant `acme`, billed to it). Now the tenant's signed
policy set names its callers (policy/callers.py): its own API keys by digest, principals of its own
identity provider, or, as an explicit opt-in, keys the operator makes. The gateway enforces it for
plaintext requests, the worker for sealed ones, from the credential the client seals inside the
envelope (the gateway cannot put another caller's there). The real gateway app and a real worker
servicer enforcing the same signed policy (caller_harness.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from api.management.auth import issue_token
from policy.release_documents import public_pem
from protocol.sealed import SealedRequest
from protocol.sealed.caller import CallerCredential
from protocol.sealed.http import ResponseHead
from tests.security.caller_harness import JWT_SECRET, TENANT, Deployment, deployment, policy_doc


def _inner_status(answer: Any, sealed: SealedRequest) -> int:
    assert answer.status_code == 200, answer.text
    plain = [p for p, _ in sealed.opener.feed(answer.content)]
    return ResponseHead.decode(plain[0]).status


def _refused(answer: Any, *words: str) -> None:
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "caller_not_allowed", error
    assert "caller policy" in error["message"] and all(w in error["message"] for w in words), error


async def test_an_operator_made_key_is_refused_plaintext_and_sealed(tmp_path: Path) -> None:
    async with deployment(tmp_path, {}) as d:
        # The tenant's own key, listed in its signed policy, is answered both ways.
        assert (await d.plaintext(d.tenant_key)).status_code == 200
        assert _inner_status(*await d.sealed(d.tenant_key)) == 200
        # The operator's management login makes a key for the tenant: refused both ways.
        operator = await d.operator_key()
        _refused(await d.plaintext(operator), "callers.api_keys")
        answer, _ = await d.sealed(operator)
        _refused(answer, "callers")
        # Nothing of the refused calls was metered.
        assert {r["key_id"] for r in d.service.store.usage_summary(TENANT)} == {
            d.service.store.lookup_key(d.tenant_key).key_id}  # type: ignore[union-attr]


async def test_the_operator_keys_opt_in_is_the_tenants_explicit_choice(tmp_path: Path) -> None:
    async with deployment(tmp_path, {"unsafe_operator_keys": True}) as d:
        operator = await d.operator_key()
        assert (await d.plaintext(operator)).status_code == 200
        assert _inner_status(*await d.sealed(operator)) == 200


async def _sealed_with(d: Deployment, bearer: str, carried: CallerCredential) -> Any:
    answer, _ = await d.sealed(bearer, carried)
    return answer


@pytest.mark.parametrize("case", ["no-credential", "listed-key-inside-another-bearer", "other-tenants-key",
                                  "unknown-key-inside", "malformed"])
async def test_the_worker_refuses_a_sealed_caller_the_policy_does_not_list(tmp_path: Path, case: str) -> None:
    """What the worker sees inside the envelope decides, whatever key the gateway authenticated."""
    async with deployment(tmp_path, {}) as d:
        operator = await d.operator_key()
        other = await d.operator_key("globex")  # a key of another tenant
        carried = {"no-credential": CallerCredential(),
                   # the operator cannot know the tenant's secret; and a client's own listed key does
                   # not admit a request sent (and bound) under another key's id
                   "listed-key-inside-another-bearer": CallerCredential(api_key=d.tenant_key),
                   "other-tenants-key": CallerCredential(api_key=other),
                   "unknown-key-inside": CallerCredential(api_key="sk-sealed-never-issued"),
                   "malformed": None}[case]
        if carried is None:  # a credential field that is not one: refused as a malformed request
            answer = await _raw_caller(d, operator, b"not json")
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "sealed_request_rejected"
            return
        _refused(await _sealed_with(d, operator, carried), "callers")


async def _raw_caller(d: Deployment, api_key: str, caller: bytes) -> Any:
    from protocol.sealed import RequestContext, api_key_id, seal_request
    from protocol.sealed.http import HEADER_KEY_ID, HEADER_MODEL, REQUEST_CONTENT_TYPE

    key = d.state.serving_key
    ctx = RequestContext(TENANT, "m", "/v1/chat/completions", key.key_id, version="v1",
                         api_key_id=api_key_id(api_key), policy_version=1)
    sealed = seal_request(key.public_bytes, ctx, b'{"model": "m", "messages": []}', time.time(), caller=caller)
    return await d.client.post("/v1/sealed/chat/completions", content=sealed.wire, headers={
        "Authorization": f"Bearer {api_key}", "Content-Type": REQUEST_CONTENT_TYPE, HEADER_MODEL: "m",
        HEADER_KEY_ID: key.key_id})


async def test_unknown_and_revoked_keys_are_refused_at_the_gateway(tmp_path: Path) -> None:
    async with deployment(tmp_path, {}) as d:
        assert (await d.plaintext("sk-sealed-unknown")).status_code == 401
        assert (await d.sealed("sk-sealed-unknown"))[0].status_code == 401
        key_id = d.service.store.lookup_key(d.tenant_key).key_id  # type: ignore[union-attr]
        admin = issue_token(JWT_SECRET, "alice", "tenant-admin", TENANT)
        revoked = await d.client.delete(f"/admin/v1/tenants/{TENANT}/keys/{key_id}",
                                        headers={"Authorization": f"Bearer {admin}"})
        assert revoked.status_code == 200
        # Still in the signed list, but revoked: refused both ways.
        assert (await d.plaintext(d.tenant_key)).status_code == 401
        assert (await d.sealed(d.tenant_key))[0].status_code == 401


async def test_an_operator_written_policy_does_not_open_the_gateway_or_the_worker(tmp_path: Path) -> None:
    """The operator PUTs, with its management login, a policy opting in its own keys: unsigned, it
    closes the gateway to every plaintext caller; signed with a key of its own (and that key's PEM), it
    opens plaintext at the gateway (which the operator runs anyway) but not the worker."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from policy.documents import sign_policy_document

    async with deployment(tmp_path, {}) as d:
        operator, token = await d.operator_key(), d.operator_token()
        opened = policy_doc({"unsafe_operator_keys": True}, version=2)
        unsigned = {"payload": opened, "key_id": "tenant-admin", "alg": "Ed25519", "sig": "00" * 64}
        answer = await d.client.put(f"/admin/v1/tenants/{TENANT}/policy", json={"document": unsigned},
                                    headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200  # stored without an admin key: not checked at upload
        _refused(await d.plaintext(d.tenant_key), "does not verify")
        own = Ed25519PrivateKey.generate()
        answer = await d.client.put(f"/admin/v1/tenants/{TENANT}/policy", headers={"Authorization": f"Bearer {token}"},
                                    json={"document": sign_policy_document(opened, own, "ops"),
                                          "admin_key_pem": public_pem(own.public_key())})
        assert answer.status_code == 200
        assert (await d.plaintext(operator)).status_code == 200  # the gateway's word (docs/security.md)
        _refused((await d.sealed(operator))[0], "callers")  # the worker holds the tenant's signed policy


def _idp() -> tuple[ec.EllipticCurvePrivateKey, dict[str, Any]]:
    key = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(ECAlgorithm.to_jwk(key.public_key()))
    return key, {"keys": [{**jwk, "kid": "idp-1", "alg": "ES256", "use": "sig"}]}


def _id_token(key: ec.EllipticCurvePrivateKey, **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": "https://idp.acme.example", "aud": "sealed", "sub": "alice", "iat": now, "exp": now + 300,
            "groups": ["ml-team"], **claims}
    return jwt.encode(body, key, algorithm="ES256", headers={"kid": "idp-1"})


@pytest.mark.parametrize("claims, admitted", [
    ({}, True),
    ({"sub": "mallory", "groups": ["ml-team"]}, True),  # admitted as a member of the listed group
    ({"sub": "mallory", "groups": []}, False),
    ({"iss": "https://idp.operator.example"}, False),
    ({"aud": "another-app"}, False),
    ({"exp": int(time.time()) - 3600}, False),
    ({"signer": "operator"}, False),
])
async def test_principals_of_the_tenants_identity_provider(tmp_path: Path, claims: dict[str, Any],
                                                           admitted: bool) -> None:
    key, jwks = _idp()
    listed = [{"issuer": "https://idp.acme.example", "audience": "sealed", "jwks": jwks, "subject": "alice"},
              {"issuer": "https://idp.acme.example", "audience": "sealed", "jwks": jwks, "group": "ml-team"}]
    async with deployment(tmp_path, {"oidc": listed}) as d:
        operator = await d.operator_key()  # routing and billing only: the ID token decides
        signer = ec.generate_private_key(ec.SECP256R1()) if claims.pop("signer", None) else key
        token = _id_token(signer, **claims)
        answer, sealed = await d.sealed(operator, CallerCredential(api_key=operator, oidc_token=token))
        if admitted:
            assert _inner_status(answer, sealed) == 200
        else:
            _refused(answer, "callers")
        # Plaintext: the gateway authenticates API keys only, so a principal is no plaintext caller.
        _refused(await d.plaintext(operator), "callers.api_keys")
