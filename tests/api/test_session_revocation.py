"""Console sessions and management tokens end server-side, at once: logout, revocation (by id,
subject, tenant, all), tenant removal, JWT key rotation. On SQLite and, where reachable, on the
fleet's PostgreSQL (tests/api/fleet.py). Also: the session cookie is Secure except for the named
plain-HTTP-on-loopback opt-out, and a TLS terminator's X-Forwarded-Proto keeps it Secure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request

from api.console.session import COOKIE, cookie_secure
from api.gateway.__main__ import main as gateway_main
from api.gateway.settings import GatewaySettings
from api.management.auth import issue_token
from tests.api.fleet import postgres_database
from tests.api.gateway_client import GatewayClient

SECRET = "s" * 40


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None
    else:
        yield from postgres_database()


@pytest.fixture()
def gw(tmp_path: Path, database_url: str | None) -> Iterator[GatewayClient]:
    settings = GatewaySettings(data_dir=tmp_path, dev=True, jwt_secret=SECRET, register_token="r" * 40,
                               database_url=database_url)
    # https: TestClient's peer is not loopback, so the cookie is Secure, and httpx sends a Secure
    # cookie only over https.
    with GatewayClient(settings, base_url="https://testserver") as client:
        for tenant in ("acme", "globex"):
            assert client.post("/admin/v1/tenants", json={"name": tenant}, headers=bearer(token())).status_code == 201
        yield client


def token(role: str = "operator", tenant: str | None = None, subject: str = "alice") -> str:
    return issue_token(SECRET, subject, role, tenant)


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def whoami(gw: GatewayClient, value: str) -> int:
    return gw.get("/admin/v1/whoami", headers=bearer(value)).status_code


def revoke(gw: GatewayClient, kind: str, value: str = "", by: str | None = None) -> httpx.Response:
    return gw.post("/admin/v1/revocations", json={"kind": kind, "value": value}, headers=bearer(by or token(
        subject="root")))


def console(gw: GatewayClient, management_token: str) -> httpx.Client:
    """A browser: logged in to the console with its own cookie jar."""
    browser = TestClient(gw.app, base_url="https://testserver")
    r = browser.post("/console/login", data={"token": management_token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    assert browser.get("/console/audit", follow_redirects=False).status_code == 200
    return browser


def logged_out(browser: httpx.Client) -> bool:
    r = browser.get("/console/audit", follow_redirects=False)
    return r.status_code == 303 and r.headers["location"] == "/console/login"


def session_ids(gw: GatewayClient, subject: str) -> list[str]:
    rows = gw.get("/admin/v1/sessions", headers=bearer(token(subject="root"))).json()["data"]
    return [row["id"] for row in rows if row["subject"] == subject]


# -- management tokens

def test_a_revoked_token_ends_at_once_and_only_it(gw: GatewayClient) -> None:
    first, second = token(), token()
    assert whoami(gw, first) == whoami(gw, second) == 200
    assert revoke(gw, "jti", _jti(first)).status_code == 201
    assert whoami(gw, first) == 401
    assert whoami(gw, second) == 200  # the same subject's other token is untouched


def test_logout_ends_the_callers_own_token(gw: GatewayClient) -> None:
    mine, other = token("auditor", subject="bob"), token("auditor", subject="bob")
    assert gw.post("/admin/v1/logout", headers=bearer(mine)).status_code == 200
    assert whoami(gw, mine) == 401 and whoami(gw, other) == 200


def test_revoking_a_subject_ends_its_tokens_not_later_ones_nor_others(gw: GatewayClient) -> None:
    old, bystander = token(subject="mallory"), token(subject="carol")
    assert revoke(gw, "subject", "mallory").status_code == 201
    assert whoami(gw, old) == 401
    assert whoami(gw, token(subject="mallory")) == 200  # issued after the revocation
    assert whoami(gw, bystander) == 200


def test_revoking_a_tenant_ends_its_tokens_only(gw: GatewayClient) -> None:
    acme, globex = token("tenant-admin", "acme"), token("tenant-admin", "globex")
    assert revoke(gw, "tenant", "acme").status_code == 201
    assert whoami(gw, acme) == 401 and whoami(gw, globex) == 200


def test_revoking_all_ends_every_token_issued_until_then(gw: GatewayClient) -> None:
    before = [token(), token("auditor", subject="x"), token("tenant-user", "acme")]
    assert revoke(gw, "all").status_code == 201
    assert [whoami(gw, t) for t in before] == [401, 401, 401]
    assert whoami(gw, token()) == 200


def test_rotating_the_jwt_secret_ends_every_token_and_session(tmp_path: Path, gw: GatewayClient) -> None:
    """Key rotation: a gateway on the same store with a new secret accepts none of the old ones."""
    old = token()
    browser = console(gw, old)
    settings = GatewaySettings(data_dir=tmp_path, dev=True, jwt_secret="n" * 40, register_token="r" * 40,
                               database_url=gw.service.settings.database_url)
    with GatewayClient(settings, base_url="https://testserver") as rotated:
        assert rotated.get("/admin/v1/whoami", headers=bearer(old)).status_code == 401
        rotated.cookies.set(COOKIE, browser.cookies[COOKIE])
        r = rotated.get("/console/audit", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/console/login"


# -- console sessions

def test_console_logout_ends_the_session_even_for_a_copied_cookie(gw: GatewayClient) -> None:
    browser = console(gw, token("auditor", subject="dave"))
    copied = browser.cookies[COOKIE]
    page = browser.get("/console/audit").text
    csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    assert browser.post("/console/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    thief = TestClient(gw.app, base_url="https://testserver", cookies={COOKIE: copied})
    assert logged_out(thief)


def test_revoking_a_console_session_by_id_ends_it_at_once(gw: GatewayClient) -> None:
    one, two = console(gw, token("auditor", subject="erin")), console(gw, token("auditor", subject="erin"))
    first, _ = session_ids(gw, "erin")
    assert revoke(gw, "jti", first).json()["sessions_ended"] == 1
    assert sorted([logged_out(one), logged_out(two)]) == [False, True]  # exactly the one revoked


def test_revoking_the_management_token_ends_its_console_sessions_and_its_next_login(gw: GatewayClient) -> None:
    management = token("operator", subject="frank")
    browser = console(gw, management)
    assert revoke(gw, "jti", _jti(management)).json()["sessions_ended"] == 1
    assert logged_out(browser)
    again = TestClient(gw.app, base_url="https://testserver")
    assert again.post("/console/login", data={"token": management}, follow_redirects=False).status_code == 401


def test_revoking_a_subject_ends_its_console_sessions(gw: GatewayClient) -> None:
    browser, bystander = console(gw, token("auditor", subject="gina")), console(gw, token("auditor", subject="hal"))
    assert revoke(gw, "subject", "gina").status_code == 201
    assert logged_out(browser) and not logged_out(bystander)
    console(gw, token("auditor", subject="gina"))  # a new login works


def test_tenant_removal_ends_its_sessions_tokens_and_keys(gw: GatewayClient) -> None:
    acme_token, globex_token = token("tenant-admin", "acme", "ivy"), token("tenant-admin", "globex", "jo")
    acme, globex = console(gw, acme_token), console(gw, globex_token)
    key = gw.post("/admin/v1/tenants/acme/keys", json={"name": "k"}, headers=bearer(token())).json()
    api_key = key["secret"]
    assert api_key and gw.service.store.lookup_key(api_key) is not None
    assert gw.delete("/admin/v1/tenants/acme", headers=bearer(token())).status_code == 200
    assert logged_out(acme) and whoami(gw, acme_token) == 401
    assert gw.service.store.lookup_key(api_key) is None
    names = [t["name"] for t in gw.get("/admin/v1/tenants", headers=bearer(token())).json()["data"]]
    assert names == ["globex"]
    assert not logged_out(globex) and whoami(gw, globex_token) == 200


# -- refusals: each changes nothing

@pytest.mark.parametrize(("method", "path", "body", "role", "tenant", "status"), [
    ("POST", "/admin/v1/revocations", {"kind": "all"}, "auditor", None, 403),
    ("POST", "/admin/v1/revocations", {"kind": "all"}, "tenant-admin", "acme", 403),
    ("POST", "/admin/v1/revocations", {"kind": "tenant", "value": "globex"}, "tenant-admin", "acme", 403),
    ("POST", "/admin/v1/revocations", {"kind": "tenant", "value": "acme"}, "tenant-user", "acme", 403),
    ("POST", "/admin/v1/revocations", {"kind": "everything"}, "operator", None, 400),
    ("POST", "/admin/v1/revocations", {"kind": "all", "value": "x"}, "operator", None, 422),
    ("POST", "/admin/v1/revocations", {"kind": "subject"}, "operator", None, 422),
    ("POST", "/admin/v1/revocations", {"kind": "jti", "value": "x" * 257}, "operator", None, 400),
    ("POST", "/admin/v1/revocations", {"kind": "jti", "value": "a", "extra": 1}, "operator", None, 400),
    ("POST", "/admin/v1/revocations", {"kind": "all"}, None, None, 401),
    ("POST", "/admin/v1/logout", None, None, None, 401),
    ("GET", "/admin/v1/sessions", None, "tenant-admin", "acme", 403),
    ("DELETE", "/admin/v1/tenants/acme", None, "tenant-admin", "acme", 403),
    ("DELETE", "/admin/v1/tenants/acme", None, "auditor", None, 403),
    ("DELETE", "/admin/v1/tenants/nobody", None, "operator", None, 404),
])
def test_refused_requests_end_nothing(gw: GatewayClient, method: str, path: str, body: dict | None, role: str | None,
                                      tenant: str | None, status: int) -> None:
    watched = [token(), token("tenant-admin", "acme"), token("auditor", subject="x")]
    browser = console(gw, token("tenant-admin", "acme", "kim"))
    headers = bearer(token(role, tenant, "caller")) if role else {}
    assert gw.request(method, path, json=body, headers=headers).status_code == status
    assert [whoami(gw, t) for t in watched] == [200, 200, 200]
    assert not logged_out(browser)
    assert [t["name"] for t in gw.get("/admin/v1/tenants", headers=bearer(token())).json()["data"]] == [
        "acme", "globex"]


def test_a_token_without_an_id_is_refused(gw: GatewayClient) -> None:
    """Revocation names tokens by jti: one without (or with a wrong-typed one) cannot be revoked, so it is refused."""
    import datetime as dt

    import jwt

    from api.management.auth import AUDIENCE

    now = dt.datetime.now(dt.UTC)
    base = {"sub": "x", "role": "operator", "aud": AUDIENCE, "iat": now, "exp": now + dt.timedelta(minutes=5)}
    for extra in ({}, {"jti": 7}, {"jti": ""}):
        assert whoami(gw, jwt.encode({**base, **extra}, SECRET, algorithm="HS256")) == 401
    assert whoami(gw, jwt.encode({**base, "jti": "ok"}, SECRET, algorithm="HS256")) == 200


def _jti(value: str) -> str:
    import jwt

    return str(jwt.decode(value, options={"verify_signature": False})["jti"])


# -- the Secure flag

def _request(scheme: str, host: str, peer: str, headers: dict[str, str] | None = None) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in {"host": host, **(headers or {})}.items()]
    return Request({"type": "http", "scheme": scheme, "server": (host, 80), "client": (peer, 5000), "path": "/",
                    "headers": raw, "method": "POST", "query_string": b""})


@pytest.mark.parametrize(("opt_out", "scheme", "host", "peer", "headers", "secure"), [
    (False, "http", "127.0.0.1", "127.0.0.1", None, True),  # the default: Secure, even on loopback
    (False, "https", "gw.example", "10.0.0.5", None, True),
    (True, "http", "127.0.0.1", "127.0.0.1", None, False),  # the named opt-out, direct on loopback
    (True, "http", "localhost", "::1", None, False),
    (True, "http", "127.0.0.1", "127.0.0.1", {"X-Forwarded-Proto": "https"}, True),  # a TLS terminator
    (True, "http", "127.0.0.1", "127.0.0.1", {"X-Forwarded-Proto": "http"}, True),  # any proxy
    (True, "http", "127.0.0.1", "127.0.0.1", {"X-Forwarded-For": "203.0.113.9"}, True),
    (True, "http", "127.0.0.1", "127.0.0.1", {"Forwarded": "for=203.0.113.9;proto=https"}, True),
    (True, "http", "gw.example", "127.0.0.1", None, True),  # a non-loopback host name
    (True, "http", "127.0.0.1", "10.0.0.5", None, True),  # a non-loopback peer
    (True, "https", "127.0.0.1", "127.0.0.1", None, True),
])
def test_the_cookie_is_secure_except_for_plain_http_on_loopback(opt_out: bool, scheme: str, host: str, peer: str,
                                                                headers: dict[str, str] | None,
                                                                secure: bool) -> None:
    assert cookie_secure(_request(scheme, host, peer, headers), opt_out) is secure


def test_the_gateway_refuses_the_opt_out_on_a_non_loopback_bind(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        gateway_main(["--data-dir", str(tmp_path), "--host", "0.0.0.0", "--unsafe-console-plain-http-loopback"])
    assert exc.value.code == 2
