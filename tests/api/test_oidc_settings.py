"""Single sign-on settings are refused when unsafe or incomplete (each rule, a negative case), the
claim mapping is default-deny, and without SSO the control plane says it runs the local
development mode (process log and console banner). No IdP needed here."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.gateway.settings import GatewaySettings
from api.management.claims import identity
from api.management.oidc_errors import RoleRefused, TokenRefused
from api.oidc_settings import OidcConfigError, OidcSettings, RoleRule

GOOD: dict[str, Any] = {"issuer": "https://idp.example.com/", "audience": "https://sealed.example.com/admin",
                        "role_rules": (RoleRule("ops", "operator"), RoleRule("admins", "tenant-admin"),
                                       RoleRule("acme-admins", "tenant-admin", tenant="acme"))}


def settings(**overrides: Any) -> OidcSettings:
    return OidcSettings(**{**GOOD, **overrides})


def test_good_settings_load_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("s3cret\n")
    (tmp_path / "oidc.json").write_text(json.dumps({
        "issuer": "https://idp.example.com/", "audience": "api://sealed", "client_id": "console",
        "client_secret_file": str(tmp_path / "secret"), "redirect_uri": "https://sealed.example.com/console/oidc/callback",
        "roles_claim": "roles", "role_rules": [{"value": "Sealed.Operator", "role": "operator"}]}))
    loaded = OidcSettings.from_file(tmp_path / "oidc.json")
    assert loaded.client_secret == "s3cret" and loaded.roles_claim == "roles" and loaded.console_enabled
    assert loaded.role_rules == (RoleRule("Sealed.Operator", "operator"),)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"issuer": "http://idp.example.com/"}, "issuer must be an https:// URL"),
    ({"issuer": "http://idp.example.com/", "unsafe_http_loopback_issuer": True}, "issuer must be an https:// URL"),
    ({"issuer": "idp.example.com"}, "issuer must be an https:// URL"),
    ({"audience": ""}, "audience is required"),
    ({"role_rules": ()}, "role_rules is empty"),
    ({"client_id": "console"}, "needs redirect_uri"),
    ({"client_id": "console", "redirect_uri": "http://sealed.example.com/cb"}, "redirect_uri must be an https://"),
    ({"algorithms": ("HS256",)}, "algorithms must be asymmetric"),
    ({"algorithms": ("none",)}, "algorithms must be asymmetric"),
    ({"algorithms": ()}, "algorithms must be asymmetric"),
    ({"scopes": ("profile",)}, "scopes must include openid"),
    ({"leeway_s": 3600}, "leeway_s must be"),
])
def test_unsafe_or_incomplete_settings_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(OidcConfigError, match=message):
        settings(**overrides)


def test_http_is_allowed_only_on_loopback_and_only_with_the_unsafe_option() -> None:
    assert settings(issuer="http://127.0.0.1:9000", unsafe_http_loopback_issuer=True).issuer
    with pytest.raises(OidcConfigError):
        settings(issuer="http://127.0.0.1:9000")


def test_a_rule_names_a_known_role() -> None:
    with pytest.raises(OidcConfigError, match="role must be one of"):
        RoleRule("ops", "superuser")


def test_an_unknown_setting_is_refused(tmp_path: Path) -> None:
    (tmp_path / "oidc.json").write_text(json.dumps({**GOOD, "role_rules": [], "audiance": "x"}))
    with pytest.raises(OidcConfigError, match="unknown or missing setting"):
        OidcSettings.from_file(tmp_path / "oidc.json")


BASE = {"sub": "u1", "iat": 1_800_000_000, "jti": "j1"}


def test_the_first_matching_rule_in_order_gives_the_role() -> None:
    who = identity({**BASE, "groups": ["admins", "ops"], "tenant": "globex"}, settings(), "t")
    assert (who.role, who.tenant) == ("operator", None)  # "ops" is the earlier rule
    who = identity({**BASE, "groups": "admins", "tenant": "globex"}, settings(), "t")
    assert (who.role, who.tenant) == ("tenant-admin", "globex")  # a single string is one group
    who = identity({**BASE, "groups": ["acme-admins"], "tenant": "globex"}, settings(), "t")
    assert (who.role, who.tenant) == ("tenant-admin", "acme")  # the rule's tenant wins over the claim


@pytest.mark.parametrize(("claims", "error", "code"), [
    ({"groups": []}, RoleRefused, "role_claim_missing"),
    ({}, RoleRefused, "role_claim_missing"),
    ({"groups": {"ops": True}}, RoleRefused, "role_claim_missing"),
    ({"groups": ["Ops"]}, RoleRefused, "no_role"),  # exact match only
    ({"groups": [["ops"]]}, RoleRefused, "no_role"),
    ({"groups": ["admins"]}, RoleRefused, "tenant_claim_missing"),
    ({"groups": ["admins"], "tenant": "../etc"}, RoleRefused, "tenant_claim_missing"),
    ({"groups": ["admins"], "tenant": ["acme"]}, RoleRefused, "tenant_claim_missing"),
    ({"groups": ["ops"], "sub": ""}, TokenRefused, "token_bad_claims"),
    ({"groups": ["ops"], "iat": "yesterday"}, TokenRefused, "token_bad_claims"),
])
def test_claims_that_map_to_no_role_are_refused(claims: dict[str, Any], error: type[Exception], code: str) -> None:
    with pytest.raises(error) as raised:
        identity({**BASE, **claims}, settings(), "t")
    assert getattr(raised.value, "code", None) == code


def test_without_a_jti_the_token_digest_names_it_for_revocation() -> None:
    a = identity({"sub": "u1", "iat": 1, "groups": ["ops"]}, settings(), "token-a")
    b = identity({"sub": "u1", "iat": 1, "groups": ["ops"]}, settings(), "token-b")
    assert a.token_id.startswith("sha256:") and a.token_id != b.token_id


def test_without_sso_the_local_development_mode_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="api.app"):
        app = create_app(GatewaySettings(data_dir=tmp_path, dev=True, jwt_secret="s" * 40, register_token="r" * 40))
    assert any("LOCAL DEVELOPMENT MODE" in r.getMessage() for r in caplog.records)
    with TestClient(app, base_url="https://testserver") as client:
        page = client.get("/console/login")
        assert "Local development sign-in" in page.text and "textarea" in page.text
        assert "/console/oidc/start" not in page.text
        assert client.get("/console/oidc/start", follow_redirects=False).status_code == 403
