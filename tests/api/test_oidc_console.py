"""Console sign-in through a real OpenID Provider (tests/api/oidc_idp.py): authorization code flow
with PKCE, driven as a browser would through the IdP's own login pages; the role and tenant from
the IdP's claims; refusals audited in the console's log; logout ends the IdP's session too
(RP-initiated logout), and the store's revocations still end a signed-in session."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import pytest
from fastapi.testclient import TestClient

from api.console.session import COOKIE
from api.console.sso import STATE_AUDIENCE, STATE_COOKIE
from api.console.state import bound_console
from api.management.auth import issue_token
from tests.api.gateway_client import GatewayClient
from tests.api.oidc_idp import CONSOLE_CLIENT, Idp, idp_login, running_idp
from tests.api.test_oidc import SECRET, bearer, gateway, sso_settings


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Idp]:
    with running_idp(tmp_path_factory.mktemp("idp")) as running:
        yield running


@pytest.fixture()
def gw(tmp_path: Path, idp: Idp) -> Iterator[GatewayClient]:
    with gateway(tmp_path, sso_settings(idp)) as client:
        op = bearer(idp.client_credentials("automation"))
        for tenant in ("acme", "globex"):
            assert client.post("/admin/v1/tenants", json={"name": tenant}, headers=op).status_code == 201
        yield client


def start(gw: GatewayClient) -> tuple[TestClient, str]:
    """A fresh browser at the console's SSO button: its cookie jar and the IdP URL it is sent to."""
    browser = TestClient(gw.app, base_url="https://testserver")
    r = browser.get("/console/oidc/start", follow_redirects=False)
    assert r.status_code == 303, r.text
    return browser, r.headers["location"]


def back(browser: TestClient, url: str) -> httpx.Response:
    parts = urlsplit(url)
    return browser.get(f"{parts.path}?{parts.query}", follow_redirects=False)


def sign_in(gw: GatewayClient, account: str) -> tuple[TestClient, httpx.Response]:
    browser, authorize = start(gw)
    with httpx.Client(timeout=10) as idp_browser:
        return browser, back(browser, idp_login(idp_browser, authorize, account))


def console_audit(gw: GatewayClient) -> list[dict[str, Any]]:
    path = bound_console(gw.app).settings.audit_dir / "console.audit.jsonl"  # type: ignore[arg-type, operator]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_authorization_request_uses_pkce_s256_state_and_nonce(gw: GatewayClient) -> None:
    _, authorize = start(gw)
    query = parse_qs(urlsplit(authorize).query)
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) == 43
    assert query["response_type"] == ["code"] and query["client_id"] == [CONSOLE_CLIENT]
    assert query["state"][0] and query["nonce"][0]
    assert "code_verifier" not in query  # the verifier stays with the console


def test_a_tenant_admin_signs_in_with_pkce_and_sees_only_its_tenant(gw: GatewayClient, idp: Idp) -> None:
    browser, r = sign_in(gw, "tam")
    assert r.status_code == 200, r.text
    assert COOKIE in browser.cookies
    page = browser.get("/console/usage?tenant=globex", follow_redirects=False)
    assert page.status_code == 200
    assert "tam · tenant-admin" in page.text and "tenant <b>acme</b>" in page.text
    assert "globex" not in page.text.replace("tenant=globex", "")
    # The session ends with the ID token (10 minutes at this IdP), not after the console's 8 hours.
    sessions = gw.get("/admin/v1/sessions", headers=bearer(idp.client_credentials("automation"))).json()["data"]
    mine = [s for s in sessions if s["subject"] == "tam"]
    assert len(mine) == 1 and mine[0]["tenant"] == "acme" and mine[0]["role"] == "tenant-admin"
    recorded = gw.service.store.revocations.live_sessions()
    session = next(s for s in recorded if s.subject == "tam")
    lifetime = session.expires_at.timestamp() - session.issued_at  # recorded values, not a clock reading
    assert lifetime <= 600
    assert any(e["action"] == "console-sign-in" and e["decision"] == "allow" and e["metadata"]["actor"] == "tam"
               for e in console_audit(gw))


def test_an_operator_signs_in_and_sees_every_tenant(gw: GatewayClient) -> None:
    browser, r = sign_in(gw, "alice")
    assert r.status_code == 200, r.text
    page = browser.get("/console/usage", follow_redirects=False)
    assert "alice · operator" in page.text and "all tenants" in page.text and "globex" in page.text


def test_a_user_without_a_mapped_group_is_refused_and_audited(gw: GatewayClient) -> None:
    browser, r = sign_in(gw, "nobody")
    assert r.status_code == 403 and "no role" in r.text
    assert COOKIE not in browser.cookies
    assert browser.get("/console/audit", follow_redirects=False).status_code == 303
    assert any(e["action"] == "console-sign-in" and e["decision"] == "deny" and e["reason"].startswith("no_role")
               for e in console_audit(gw))


def test_removing_the_group_at_the_idp_refuses_the_next_sign_in(gw: GatewayClient, idp: Idp) -> None:
    assert sign_in(gw, "tam")[1].status_code == 200
    idp.set_claims("tam", {"groups": ["staff"], "tenant": "acme"})
    try:
        browser, r = sign_in(gw, "tam")
        assert r.status_code == 403 and COOKIE not in browser.cookies
    finally:
        idp.set_claims("tam", {"groups": ["tenant-admins", "staff"], "tenant": "acme"})


def test_a_callback_with_another_state_is_refused(gw: GatewayClient) -> None:
    browser, authorize = start(gw)
    with httpx.Client(timeout=10) as idp_browser:
        url = idp_login(idp_browser, authorize, "alice")
    r = back(browser, url.replace("state=", "state=x"))
    assert r.status_code == 401 and COOKIE not in browser.cookies
    assert any(e["decision"] == "deny" and e["reason"].startswith("sso_state") for e in console_audit(gw))


def test_the_code_is_bound_to_the_pkce_verifier(gw: GatewayClient) -> None:
    """Another verifier than the one the challenge was made from: the IdP does not redeem the code."""
    browser, authorize = start(gw)
    pending = jwt.decode(browser.cookies[STATE_COOKIE], SECRET, algorithms=["HS256"], audience=STATE_AUDIENCE)
    pending["cv"] = "another-verifier-" + "v" * 40
    browser.cookies.set(STATE_COOKIE, jwt.encode(pending, SECRET, algorithm="HS256"), domain="testserver.local",
                        path="/console/oidc")
    with httpx.Client(timeout=10) as idp_browser:
        url = idp_login(idp_browser, authorize, "alice")
    r = back(browser, url)
    assert r.status_code == 401 and "did not redeem the code" in r.text
    assert COOKIE not in browser.cookies


def test_logout_ends_the_session_and_the_idps(gw: GatewayClient, idp: Idp) -> None:
    browser, _ = sign_in(gw, "alice")
    page = browser.get("/console/audit")
    csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    out = browser.post("/console/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303
    assert out.headers["location"].startswith(idp.issuer + "/session/end?client_id=" + CONSOLE_CLIENT)
    assert browser.get("/console/audit", follow_redirects=False).status_code == 303


def test_a_revocation_still_ends_a_signed_in_session(gw: GatewayClient, idp: Idp) -> None:
    browser, _ = sign_in(gw, "tam")
    assert browser.get("/console/audit", follow_redirects=False).status_code == 200
    op = bearer(idp.client_credentials("automation"))
    assert gw.post("/admin/v1/revocations", json={"kind": "tenant", "value": "acme"}, headers=op).status_code == 201
    r = browser.get("/console/audit", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/login"


def test_with_sso_the_pasted_local_token_is_refused(gw: GatewayClient) -> None:
    browser = TestClient(gw.app, base_url="https://testserver")
    page = browser.get("/console/login")
    assert 'href="/console/oidc/start"' in page.text and "textarea" not in page.text
    assert "Local development sign-in" not in page.text
    r = browser.post("/console/login", data={"token": issue_token(SECRET, "alice", "operator")},
                     follow_redirects=False)
    assert r.status_code == 403 and COOKIE not in browser.cookies
