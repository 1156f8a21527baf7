"""`sealed up --oidc-config FILE`: single sign-on from the one-command start (docs/sso.md), against a
real OpenID Provider (oidc-provider under node, tests/api/oidc_idp.py); a bad settings file is one
line before anything starts; the gateway alone names the flag it lacks instead of a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from api.management.auth import issue_token
from tests.api.conftest import start_sealed_up, stop_sealed_up
from tests.api.oidc_idp import AUDIENCE, running_idp


def test_sealed_up_with_oidc_config_takes_the_idps_tokens(tmp_path: Path) -> None:
    with running_idp(tmp_path / "idp") as idp:
        config = tmp_path / "oidc.json"
        config.write_text(json.dumps({
            "issuer": idp.issuer, "audience": AUDIENCE, "unsafe_http_loopback_issuer": True,
            "role_rules": [{"value": "sealed-operators", "role": "operator"}]}))
        stack = start_sealed_up(tmp_path / "stack", ready_line=True, args=("--oidc-config", str(config)))
        try:
            log = (tmp_path / "stack" / "up.log").read_text()
            assert f"Sign-in: single sign-on with {idp.issuer}" in log
            admin = f"{stack.url}/admin/v1/tenants"
            token = idp.client_credentials("automation")  # an operator by its groups claim
            r = httpx.get(admin, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            assert r.status_code == 200, r.text
            assert "demo" in {t["name"] for t in r.json()["data"]}
            # The local development tokens are refused once SSO is on (accept_local_tokens is off by default).
            secret = (stack.home / "gateway" / "jwt-secret").read_text().strip()
            local = issue_token(secret, "ops", "operator")
            assert httpx.get(admin, headers={"Authorization": f"Bearer {local}"}, timeout=30).status_code == 401
            assert httpx.get(admin, headers={"Authorization": "Bearer not-a-token"}, timeout=30).status_code == 401
        finally:
            stop_sealed_up(stack)


def test_sealed_up_refuses_a_bad_oidc_config_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "oidc.json"
    config.write_text(json.dumps({"issuer": "https://idp.example", "role_rules": []}))
    r = subprocess.run([sys.executable, "-m", "api.cli.main", "up", "--oidc-config", str(config),
                        "--home", str(tmp_path / "home")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().startswith(f"sealed up: --oidc-config {config}:") and "audience" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "home" / "packages").exists()


def test_a_gateway_without_its_secret_files_names_the_flag(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "api.gateway", "--data-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--register-token-file" in r.stderr
