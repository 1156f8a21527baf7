"""Console over HTTP (no browser): login and sessions, scope per role, filters, exports, the chain
status, CSRF and the revoke action's checks, and a scan of every page and export for secrets."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
from collections.abc import Iterator

import httpx
import pytest

from api.console.session import COOKIE
from api.console.state import bound_console
from policy.audit.entry import entry_hash, parse_entry
from tests.api.console.site import TENANTS, Site, connect_broker, login

PAGES = ("audit", "workers", "keys", "usage", "policies")
EXPORTS = ("jsonl", "csv", "ocsf")
ROLES = (("auditor", None), ("operator", None), ("tenant-admin", "acme"))


@contextlib.contextmanager
def _client(site: Site, role: str, tenant: str | None = None, *, broker: bool = True) -> Iterator[httpx.Client]:
    """Logged in; with ``broker``, the person has also given the console its own broker token."""
    with httpx.Client(timeout=30.0) as client:
        login(client, site, role, tenant)
        token = site.broker_token(role, tenant)
        if broker and token is not None:
            assert connect_broker(client, site, token).status_code == 303
        yield client


def _rows(html: str) -> list[str]:
    return re.findall(r'<tr id="e-[^"]+" class="[^"]*" data-tenant="([^"]+)"', html)


def test_unauthenticated_pages_redirect_to_login(site: Site) -> None:
    with httpx.Client() as client:
        for page in (*PAGES, "audit/export.jsonl"):
            response = client.get(f"{site.url}/console/{page}")
            assert response.status_code == 303 and response.headers["location"] == "/console/login", page


@pytest.mark.parametrize("token", ["", "not-a-jwt", "eyJhbGciOiJIUzI1NiJ9.e30.x"])
def test_login_refuses_bad_tokens_and_sets_no_cookie(site: Site, token: str) -> None:
    with httpx.Client() as client:
        response = client.post(f"{site.url}/console/login", data={"token": token})
        assert response.status_code == 401
        assert COOKIE not in response.cookies
        if token:
            assert token not in response.text


def test_login_refuses_roles_without_console_and_foreign_keys(site: Site) -> None:
    import jwt

    with httpx.Client() as client:
        user = site.token("tenant-user", "acme")
        assert client.post(f"{site.url}/console/login", data={"token": user}).status_code == 403
        forged = jwt.encode({"sub": "x", "role": "operator", "aud": "sealed-management", "exp": 4_102_444_800},
                            "another-secret-of-enough-length-0123456789", algorithm="HS256")
        assert client.post(f"{site.url}/console/login", data={"token": forged}).status_code == 401
        # The session cookie itself is not a management token, and the reverse holds too.
        assert COOKIE not in client.cookies


def test_cross_site_posts_are_refused(site: Site) -> None:
    with httpx.Client() as client:
        evil = {"Origin": "https://evil.example"}
        response = client.post(f"{site.url}/console/login", data={"token": site.token("operator")}, headers=evil)
        assert response.status_code == 403 and COOKIE not in response.cookies
        own = {"Origin": site.url}
        assert client.post(f"{site.url}/console/login", data={"token": site.token("operator")},
                           headers=own).status_code == 303


def test_session_cookie_is_httponly_strict_and_scoped(site: Site) -> None:
    with httpx.Client() as client:
        response = client.post(f"{site.url}/console/login", data={"token": site.token("auditor")})
        cookie = response.headers["set-cookie"]
        assert f"{COOKIE}=" in cookie
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
        page = client.get(f"{site.url}/console/audit")
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
        # A management bearer token is not a session: the console wants its cookie.
        fresh = httpx.get(f"{site.url}/console/audit", headers={"Authorization": f"Bearer {site.token('operator')}"})
        assert fresh.status_code == 303


def test_behind_a_tls_terminator_the_cookie_is_secure(site: Site) -> None:
    """The console site runs with the loopback opt-out (as `sealed up` does); a proxy's
    X-Forwarded-Proto: https still gets the Secure flag, and a direct request does not."""
    login = {"token": site.token("auditor")}
    proxied = httpx.post(f"{site.url}/console/login", data=login, headers={"X-Forwarded-Proto": "https"})
    direct = httpx.post(f"{site.url}/console/login", data=login)
    assert proxied.status_code == direct.status_code == 303
    assert "secure" in proxied.headers["set-cookie"].lower()
    assert "secure" not in direct.headers["set-cookie"].lower()


@pytest.mark.parametrize(("role", "tenant"), ROLES)
def test_each_role_sees_exactly_its_scope(site: Site, role: str, tenant: str | None) -> None:
    with _client(site, role, tenant) as client:
        html = client.get(f"{site.url}/console/audit").text
        seen = set(_rows(html))
        expected = {tenant} if tenant else set(TENANTS)
        assert expected <= seen | {"-"}, seen
        if tenant:
            assert seen == {tenant}
            others = [t for t in TENANTS if t != tenant]
            for page in PAGES:
                for query in ("", *(f"?tenant={o}" for o in others)):
                    body = client.get(f"{site.url}/console/{page}{query}").text
                    for other in others:
                        assert other not in body, f"{page}{query} shows {other}"
            for fmt in EXPORTS:
                body = client.get(f"{site.url}/console/audit/export.{fmt}?tenant={others[0]}").text
                assert all(o not in body for o in others), fmt
        else:
            for page in ("workers", "usage"):
                body = client.get(f"{site.url}/console/{page}").text
                assert all(t in body for t in TENANTS), page


def test_audit_filters(site: Site) -> None:
    with _client(site, "auditor") as client:
        def tenants_of(query: str) -> list[str]:
            return _rows(client.get(f"{site.url}/console/audit?{query}").text)

        assert set(tenants_of("tenant=globex")) == {"globex"}
        html = client.get(f"{site.url}/console/audit?component=worker").text
        assert _rows(html) and all(c == "worker" for c in re.findall(r"<td>(key-broker|gateway|worker)</td>", html))
        html = client.get(f"{site.url}/console/audit?rule=admission.rate_limit&tenant=acme").text
        assert len(_rows(html)) == 2 and "admission.allow" not in html.split("<tbody>")[1]
        html = client.get(f"{site.url}/console/audit?decision=deny").text
        assert ">allow</td>" not in html and ">deny</td>" in html
        assert _rows(client.get(f"{site.url}/console/audit?since=2001-01-01T00:00&until=2001-01-02T00:00").text) == []
        assert _rows(client.get(f"{site.url}/console/audit?since=2001-01-01T00:00").text)
        bad = client.get(f"{site.url}/console/audit?since=yesterday")
        assert bad.status_code == 200 and "not a time" in bad.text


def test_audit_pagination(site: Site) -> None:
    with _client(site, "operator") as client:
        first = client.get(f"{site.url}/console/audit").text
        total = int(re.search(r"(\d+) entries\. Export", first).group(1))
        size = bound_console(site.app).settings.page_size
        pages = -(-total // size)
        assert f"page 1 of {pages}" in first
        seen = []
        for page in range(1, pages + 1):
            seen += re.findall(r'<tr id="(e-[^"]+)"', client.get(f"{site.url}/console/audit?page={page}").text)
        assert len(seen) == total == len(set(seen))


def test_exports_each_format(site: Site) -> None:
    with _client(site, "auditor") as client:
        jsonl = client.get(f"{site.url}/console/audit/export.jsonl?tenant=acme")
        assert jsonl.headers["content-disposition"].startswith("attachment;")
        lines = jsonl.text.splitlines()
        assert lines
        for line in lines:
            entry, body = parse_entry(line)
            assert entry.tenant == "acme" and entry_hash(body).hex() == entry.hash  # exported as logged
        rows = list(csv.DictReader(io.StringIO(client.get(f"{site.url}/console/audit/export.csv?tenant=acme").text)))
        assert len(rows) == len(lines) and {r["tenant"] for r in rows} == {"acme"}
        assert {r["hash"] for r in rows} == {json.loads(x)["hash"] for x in lines}
        ocsf = client.get(f"{site.url}/console/audit/export.ocsf?tenant=acme").text
        events = [json.loads(x) for x in ocsf.splitlines()]
        assert len(events) == len(lines)
        for event in events:
            assert event["class_uid"] == 6003 and event["category_uid"] == 6
            assert event["type_uid"] == 600300 + event["activity_id"]
            assert event["status_id"] in (1, 2) and event["metadata"]["version"] == "1.3.0"
            assert event["cloud"]["account"]["uid"] == "acme"
        denied = [e for e in events if e["status_id"] == 2]
        assert denied and all(e["status_detail"] for e in denied)
        assert client.get(f"{site.url}/console/audit/export.xml").status_code == 403


def test_no_page_or_export_contains_content_or_key_material(site: Site) -> None:
    forbidden = site.secrets()
    for role, tenant in ROLES:
        with _client(site, role, tenant) as client:
            bodies = [client.get(f"{site.url}/console/{p}").text for p in (*PAGES, "login")]
            bodies += [client.get(f"{site.url}/console/audit/export.{f}").text for f in EXPORTS]
            for body in bodies:
                for secret in forbidden:
                    assert secret not in body
                assert site.token("operator") not in body
                # Nothing that looks like a JWT (a worker's attestation token, a session) is shown.
                assert not re.search(r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.", body)


def test_chain_status_on_top(site: Site) -> None:
    with _client(site, "auditor") as client:
        html = client.get(f"{site.url}/console/audit").text
        assert html.index("chain verification") < html.index("<table")
        for log in ("gateway.audit.jsonl", "key-broker.audit.jsonl", "worker.audit.jsonl"):
            assert f'class="chain-ok" data-log="{log}"' in html
        assert "last checkpoint at" in html and "chain-broken" not in html


def test_revoke_checks_csrf_role_tenant_and_confirmation(site: Site) -> None:
    with _client(site, "auditor") as auditor:
        assert auditor.get(f"{site.url}/console/keys/revoke?tenant=acme").status_code == 403
        page = auditor.get(f"{site.url}/console/audit").text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
        r = auditor.post(f"{site.url}/console/keys/revoke", data={"tenant": "acme", "confirm": "acme", "csrf": csrf})
        assert r.status_code == 403
    with _client(site, "tenant-admin", "acme") as admin:
        form = admin.get(f"{site.url}/console/keys/revoke?tenant=acme").text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', form).group(1)
        assert admin.post(f"{site.url}/console/keys/revoke",
                          data={"tenant": "acme", "confirm": "acme"}).status_code == 403  # no CSRF token
        assert admin.post(f"{site.url}/console/keys/revoke",
                          data={"tenant": "acme", "confirm": "acme", "csrf": "0" * 64}).status_code == 403
        assert admin.post(f"{site.url}/console/keys/revoke",  # another tenant's key
                          data={"tenant": "globex", "confirm": "globex", "csrf": csrf}).status_code == 403
        assert admin.post(f"{site.url}/console/keys/revoke",  # not confirmed
                          data={"tenant": "acme", "confirm": "acm", "csrf": csrf}).status_code == 400
    for tenant in TENANTS:  # nothing was revoked by any of the refused attempts
        status = site.broker.admin("GET", f"/tenants/{tenant}").json()
        assert status["revoked"] is False


def test_usage_charts_per_tenant_key_and_model_against_budgets(site: Site) -> None:
    with _client(site, "operator") as client:
        html = client.get(f"{site.url}/console/usage").text
        # Per tenant: tokens (with its budget line), requests, worker-seconds; then one per key and model.
        assert html.count('<svg class="chart"') == 3 * len(TENANTS) + 2 * len(TENANTS)
        assert "budget 5.0k" in html and "budget 10.0k" in html and 'class="budget"' in html
        assert "Lifetime tokens 1335 of a budget of 5000" in html  # 30 records of (20+i) + 10 tokens
        assert "budget 3.0k" in html  # each key's own budget
    with _client(site, "tenant-admin", "acme") as client:
        html = client.get(f"{site.url}/console/usage?hours=168").text
        assert html.count('<svg class="chart"') == 3 + 2 and "globex" not in html


def test_the_console_holds_no_broker_credential_and_forwards_the_persons_own(site: Site) -> None:
    """The gateway is given no broker token (issue #32): without the person's own, the Keys page shows
    no key state and offers no revocation, and a revocation is refused before the broker is reached."""
    assert not hasattr(bound_console(site.app).settings, "broker_admin_token")
    assert site.broker.admin_token not in repr(vars(bound_console(site.app).broker))
    with _client(site, "tenant-admin", "acme", broker=False) as admin:
        html = admin.get(f"{site.url}/console/keys").text
        assert "Connect the key broker" in html and 'id="key-state"' not in html and "button danger" not in html
        form = admin.get(f"{site.url}/console/keys/revoke?tenant=acme").text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', form).group(1)
        r = admin.post(f"{site.url}/console/keys/revoke", data={"tenant": "acme", "confirm": "acme", "csrf": csrf})
        assert r.status_code == 502 and "not revoked" in r.text
        # Another tenant's broker token: the broker refuses it (the console checked the tenant first).
        assert connect_broker(admin, site, site.broker.tenant_token("globex")).status_code == 303
        r = admin.post(f"{site.url}/console/keys/revoke", data={"tenant": "acme", "confirm": "acme", "csrf": csrf})
        assert r.status_code == 502 and "refused your token" in r.text
        assert connect_broker(admin, site, site.broker.tenant_token("acme")).status_code == 303
        html = admin.get(f"{site.url}/console/keys").text
        assert 'id="key-state">active' in html and "button danger" in html
        assert site.broker.tenant_token("acme") not in html
        disconnect = admin.post(f"{site.url}/console/keys/broker", data={"disconnect": "1", "csrf": csrf})
        assert disconnect.status_code == 303
        assert 'id="key-state"' not in admin.get(f"{site.url}/console/keys").text
    assert site.broker.admin("GET", "/tenants/acme").json()["revoked"] is False
