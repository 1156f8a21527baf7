"""A real browser (Playwright, Debian's Chromium) signs in to the console through a real OpenID
Provider: the SSO button, the IdP's login page, the code+PKCE redirect back, and a tenant admin's
console showing only its tenant. The console (uvicorn on `localhost`) and the IdP (`127.0.0.1`) are
different sites, as in production: the session cookie (SameSite=Strict) must still reach the
console after the IdP's cross-site redirect."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from api.app import create_app
from api.console_settings import ConsoleSettings
from api.gateway.settings import GatewaySettings
from api.oidc_settings import OidcSettings
from api.stack import free_port
from tests.api.console.browser import VIEWPORT, launch_chromium
from tests.api.oidc_idp import AUDIENCE, CONSOLE_CLIENT, CONSOLE_SECRET, Idp, running_idp
from tests.api.test_oidc import RULES, SECRET, bearer


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    yield from launch_chromium()


@contextlib.contextmanager
def console_with_sso(root: Path) -> Iterator[tuple[str, Idp]]:
    port = free_port()
    url = f"http://localhost:{port}"
    with running_idp(root / "idp", redirect_uris=(f"{url}/console/oidc/callback",)) as idp:
        oidc = OidcSettings(issuer=idp.issuer, audience=AUDIENCE, role_rules=RULES, client_id=CONSOLE_CLIENT,
                            client_secret=CONSOLE_SECRET, redirect_uri=f"{url}/console/oidc/callback",
                            scopes=("openid", "sealed"), unsafe_http_loopback_issuer=True)
        (root / "gateway").mkdir()
        settings = GatewaySettings(data_dir=root / "gateway", dev=True, jwt_secret=SECRET, register_token="r" * 40,
                                   audit_dir=root / "audit", oidc=oidc,
                                   console=ConsoleSettings(audit_dir=root / "audit", unsafe_plain_http_loopback=True))
        server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            while not server.started:  # readiness, not a measured duration
                assert thread.is_alive()
                time.sleep(0.05)
            op = bearer(idp.client_credentials("automation"))
            for tenant in ("acme", "globex"):
                assert httpx.post(f"{url}/admin/v1/tenants", json={"name": tenant}, headers=op).status_code == 201
            yield url, idp
        finally:
            server.should_exit = True
            thread.join(10)


def test_a_tenant_admin_signs_in_through_the_idp_in_a_browser(tmp_path: Path, chromium: Any) -> None:
    with console_with_sso(tmp_path) as (url, idp):
        context = chromium.new_context(viewport=VIEWPORT)
        page = context.new_page()
        page.goto(f"{url}/console/audit")  # not signed in: the login page, with the SSO button
        page.wait_for_url(f"{url}/console/login")
        assert page.locator("textarea").count() == 0
        with page.expect_request(lambda r: r.url.startswith(idp.issuer + "/auth?")) as authorize:
            page.click("#sso")
        assert "code_challenge_method=S256" in authorize.value.url
        page.fill("input[name=login]", "tam")
        page.fill("input[name=password]", "any")
        page.click("button[type=submit]")
        page.wait_for_url(f"{url}/console/audit")
        assert "tam · tenant-admin" in page.inner_text(".whoami") and "acme" in page.inner_text(".whoami")
        page.goto(f"{url}/console/usage?tenant=globex")
        assert "globex" not in page.content().replace("tenant=globex", "")
        cookies = {c["name"]: c for c in context.cookies()}
        assert cookies["sealed_console"]["httpOnly"] and cookies["sealed_console"]["sameSite"] == "Strict"
        context.close()
