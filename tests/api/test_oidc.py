"""Single sign-on against a real OpenID Provider (oidc-provider under node, tests/api/oidc_idp.py):
the management API with the IdP's client-credentials access tokens, roles from its claims, a
tenant admin confined to its tenant, and every kind of bad token refused with its reason in the
audit log and nothing changed. The console's code+PKCE sign-in is in test_oidc_console.py."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from api.console_settings import ConsoleSettings
from api.gateway.settings import GatewaySettings
from api.management.auth import issue_token
from api.management.oidc import OidcVerifier
from api.management.oidc_errors import IdpUnavailable
from api.oidc_settings import OidcSettings, RoleRule
from api.stack import free_port
from tests.api.gateway_client import GatewayClient
from tests.api.oidc_idp import AUDIENCE, CONSOLE_CLIENT, CONSOLE_SECRET, POST_LOGOUT_URI, REDIRECT_URI, Idp, running_idp

SECRET = "s" * 40
RULES = (RoleRule("sealed-operators", "operator"), RoleRule("sealed-auditors", "auditor"),
         RoleRule("tenant-admins", "tenant-admin"), RoleRule("globex-admins", "tenant-admin", tenant="globex"))


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Idp]:
    with running_idp(tmp_path_factory.mktemp("idp")) as running:
        yield running


def sso_settings(idp: Idp, **overrides: Any) -> OidcSettings:
    fields: dict[str, Any] = dict(issuer=idp.issuer, audience=AUDIENCE, role_rules=RULES, client_id=CONSOLE_CLIENT,
                                  client_secret=CONSOLE_SECRET, redirect_uri=REDIRECT_URI,
                                  post_logout_redirect_uri=POST_LOGOUT_URI, scopes=("openid", "sealed"),
                                  unsafe_http_loopback_issuer=True)
    fields.update(overrides)
    return OidcSettings(**fields)


def gateway(root: Path, oidc: OidcSettings) -> GatewayClient:
    (root / "gateway").mkdir(exist_ok=True)
    settings = GatewaySettings(data_dir=root / "gateway", dev=True, jwt_secret=SECRET, register_token="r" * 40,
                               audit_dir=root / "audit", oidc=oidc,
                               console=ConsoleSettings(audit_dir=root / "audit"))
    return GatewayClient(settings, base_url="https://testserver")


@pytest.fixture()
def gw(tmp_path: Path, idp: Idp) -> Iterator[GatewayClient]:
    with gateway(tmp_path, sso_settings(idp)) as client:
        op = bearer(idp.client_credentials("automation"))
        for tenant in ("acme", "globex"):
            assert client.post("/admin/v1/tenants", json={"name": tenant}, headers=op).status_code == 201
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def tenants(gw: GatewayClient, idp: Idp) -> list[str]:
    r = gw.get("/admin/v1/tenants", headers=bearer(idp.client_credentials("automation")))
    assert r.status_code == 200, r.text
    return sorted(t["name"] for t in r.json()["data"])


def audit_entries(gw: GatewayClient) -> list[dict[str, Any]]:
    gw.service.audit.flush()
    path = Path(gw.service.audit.path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_client_credentials_token_of_an_operator_manages_every_tenant(gw: GatewayClient, idp: Idp) -> None:
    assert tenants(gw, idp) == ["acme", "globex"]
    r = gw.get("/admin/v1/whoami", headers=bearer(idp.client_credentials("automation")))
    assert r.status_code == 200 and r.json()["role"] == "operator" and r.json()["subject"] == "automation"


def test_a_tenant_admin_sees_only_its_tenant(gw: GatewayClient, idp: Idp) -> None:
    acme = bearer(idp.client_credentials("acme-bot"))
    assert gw.get("/admin/v1/whoami", headers=acme).json()["tenant"] == "acme"
    assert gw.get("/admin/v1/tenants/acme/keys", headers=acme).status_code == 200
    other = gw.get("/admin/v1/tenants/globex/keys", headers=acme)
    assert other.status_code == 404, other.text  # another tenant's existence is not disclosed
    assert gw.post("/admin/v1/tenants/globex/keys", json={"name": "x"}, headers=acme).status_code == 404
    assert gw.get("/admin/v1/tenants", headers=acme).status_code == 403  # the operator's list
    # A rule may fix the tenant itself (a group per tenant); the tenant claim is then not needed.
    globex = bearer(idp.client_credentials("globex-bot"))
    assert gw.get("/admin/v1/tenants/globex/keys", headers=globex).status_code == 200
    assert gw.get("/admin/v1/tenants/acme/keys", headers=globex).status_code == 404


def test_an_auditor_reads_but_changes_nothing(gw: GatewayClient, idp: Idp) -> None:
    auditor = bearer(idp.client_credentials("auditor-bot"))
    assert gw.get("/admin/v1/tenants", headers=auditor).status_code == 200
    assert gw.post("/admin/v1/tenants", json={"name": "initech"}, headers=auditor).status_code == 403
    assert tenants(gw, idp) == ["acme", "globex"]


def test_removing_the_group_at_the_idp_ends_access_at_the_next_token(gw: GatewayClient, idp: Idp) -> None:
    before = idp.client_credentials("acme-bot")
    assert gw.get("/admin/v1/tenants/acme/keys", headers=bearer(before)).status_code == 200
    idp.set_claims("acme-bot", {"groups": ["staff"], "tenant": "acme"})
    try:
        r = gw.get("/admin/v1/tenants/acme/keys", headers=bearer(idp.client_credentials("acme-bot")))
        assert r.status_code == 403 and r.json()["error"]["code"] == "no_role", r.text
    finally:
        idp.set_claims("acme-bot", {"groups": ["tenant-admins"], "tenant": "acme"})


def test_an_idp_token_is_revocable_like_a_local_one(gw: GatewayClient, idp: Idp) -> None:
    token = idp.client_credentials("acme-bot")
    assert gw.post("/admin/v1/logout", headers=bearer(token)).status_code == 200
    r = gw.get("/admin/v1/tenants/acme/keys", headers=bearer(token))
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    earlier = idp.client_credentials("acme-bot")
    assert gw.get("/admin/v1/tenants/acme/keys", headers=bearer(earlier)).status_code == 200
    op = bearer(idp.client_credentials("automation"))
    r = gw.post("/admin/v1/revocations", json={"kind": "subject", "value": "acme-bot"}, headers=op)
    assert r.status_code == 201, r.text
    assert gw.get("/admin/v1/tenants/acme/keys", headers=bearer(earlier)).status_code == 401


def _other_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _hs256_with_the_jwks(idp: Idp) -> str:
    """The classic confusion: HS256 keyed with the IdP's public key as its JWKS publishes it (made by
    hand: PyJWT itself refuses to use a JWK or PEM as an HMAC secret)."""
    public = jwt.algorithms.RSAAlgorithm.to_jwk(idp.key.public_key()).encode()
    now = int(time.time())
    head = {"alg": "HS256", "typ": "JWT", "kid": idp.kid}
    body = {"iss": idp.issuer, "aud": AUDIENCE, "sub": "mallory", "iat": now, "exp": now + 600, "jti": "x1",
            "groups": ["sealed-operators"]}
    signing_input = b".".join(jwt.utils.base64url_encode(json.dumps(part).encode()) for part in (head, body))
    mac = hmac.new(public, signing_input, hashlib.sha256).digest()
    return (signing_input + b"." + jwt.utils.base64url_encode(mac)).decode()


def _tampered(idp: Idp) -> str:
    head, body, sig = idp.mint().split(".")
    claims = json.loads(jwt.utils.base64url_decode(body))
    claims["groups"] = ["sealed-operators"]
    claims["sub"] = "mallory"
    return ".".join([head, jwt.utils.base64url_encode(json.dumps(claims).encode()).decode(), sig])


def _alg_none(idp: Idp) -> str:
    return jwt.encode({"iss": idp.issuer, "aud": AUDIENCE, "sub": "x", "iat": 1, "exp": 4102444800,
                       "groups": ["sealed-operators"]}, None, algorithm="none", headers={"kid": idp.kid})


NEGATIVE = {
    "wrong issuer": (lambda idp: idp.mint(iss="https://evil.example"), 401, "token_wrong_issuer"),
    "wrong audience": (lambda idp: idp.mint(aud="https://other.example/api"), 401, "token_wrong_audience"),
    "the console's ID-token audience": (lambda idp: idp.mint(aud=CONSOLE_CLIENT), 401, "token_wrong_audience"),
    "expired beyond the skew": (lambda idp: idp.mint(exp=1_700_000_000, iat=1_699_999_000), 401, "token_expired"),
    "alg none": (_alg_none, 401, "token_alg_refused"),
    "HS256 keyed with the JWKS": (_hs256_with_the_jwks, 401, "token_alg_refused"),
    "unknown kid": (lambda idp: idp.mint(kid="not-published"), 401, "token_unknown_key"),
    "signed by another key under the IdP's kid": (lambda idp: idp.mint(key=_other_key()), 401, "token_bad_signature"),
    "tampered claims": (_tampered, 401, "token_bad_signature"),
    "no exp": (lambda idp: idp.mint(exp=None), 401, "invalid_token"),
    "missing role claim": (lambda idp: idp.mint(groups=None), 403, "role_claim_missing"),
    "a group no rule maps": (lambda idp: idp.mint(groups=["staff"]), 403, "no_role"),
    "tenant role without tenant": (lambda idp: idp.mint(groups=["tenant-admins"]), 403, "tenant_claim_missing"),
    "not a JWT": (lambda idp: "opaque-token-123", 401, "token_malformed"),
    "a local HS256 token": (lambda idp: issue_token(SECRET, "alice", "operator"), 401, "token_alg_refused"),
}


@pytest.mark.parametrize("case", NEGATIVE)
def test_bad_tokens_are_refused_with_a_reason_audited_and_change_nothing(gw: GatewayClient, idp: Idp,
                                                                          case: str) -> None:
    make, status, code = NEGATIVE[case]
    token = make(idp)
    r = gw.post("/admin/v1/tenants", json={"name": "initech"}, headers=bearer(token))
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code, r.text
    assert r.json()["error"]["message"].startswith("management token refused: ")
    assert tenants(gw, idp) == ["acme", "globex"]
    refusals = [e for e in audit_entries(gw) if e["action"] == "edge-refusal"]
    assert any(e["reason"] == f"{status} {code}" and e["metadata"]["route"] == "/admin/v1/tenants" for e in refusals)


def test_a_good_minted_token_passes_so_the_table_tests_one_thing_each(gw: GatewayClient, idp: Idp) -> None:
    assert gw.get("/admin/v1/whoami", headers=bearer(idp.mint())).status_code == 200
    # within the clock skew: expired 30 s ago, allowed 60 s
    now = int(time.time())
    assert gw.get("/admin/v1/whoami", headers=bearer(idp.mint(exp=now - 30, iat=now - 600))).status_code == 200


def test_local_tokens_only_when_the_operator_opts_in(tmp_path: Path, idp: Idp) -> None:
    with gateway(tmp_path, sso_settings(idp, accept_local_tokens=True)) as gw:
        assert gw.get("/admin/v1/whoami", headers=bearer(issue_token(SECRET, "loop", "operator"))).status_code == 200
        assert gw.get("/admin/v1/whoami", headers=bearer(issue_token("x" * 40, "loop", "operator"))).status_code == 401
        assert gw.get("/admin/v1/whoami", headers=bearer(_hs256_with_the_jwks(idp))).status_code == 401
        assert gw.get("/admin/v1/whoami", headers=bearer(idp.client_credentials("automation"))).status_code == 200


def test_an_unreachable_idp_is_a_503_not_a_pass(tmp_path: Path, idp: Idp) -> None:
    with gateway(tmp_path, sso_settings(idp, issuer=f"http://127.0.0.1:{free_port()}", http_timeout_s=2)) as gw:
        r = gw.get("/admin/v1/whoami", headers=bearer(idp.mint()))
        assert r.status_code == 503 and r.json()["error"]["code"] == "idp_unavailable"


def test_a_down_idp_is_not_asked_again_on_every_request(idp: Idp) -> None:
    """After a failed discovery the verifier answers 'unavailable' at once until jwks_min_refresh_s
    has passed (an injected clock), so a down IdP cannot hold every request's thread for the timeout."""
    now = [1000.0]
    verifier = OidcVerifier(sso_settings(idp, issuer=f"http://127.0.0.1:{free_port()}", http_timeout_s=2),
                            clock=lambda: now[0])
    with pytest.raises(IdpUnavailable, match="discovery failed \\("):
        verifier.metadata()
    with pytest.raises(IdpUnavailable, match="failed recently"):
        verifier.access_token(idp.mint())
    now[0] += 31
    with pytest.raises(IdpUnavailable, match="discovery failed \\("):
        verifier.metadata()


def test_with_sso_the_api_mints_no_local_tokens(gw: GatewayClient, idp: Idp) -> None:
    r = gw.post("/admin/v1/tokens", json={"subject": "bob", "role": "operator"},
                headers=bearer(idp.client_credentials("automation")))
    assert r.status_code == 409 and r.json()["error"]["code"] == "sso_tokens_only", r.text
