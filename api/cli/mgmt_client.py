"""Credentials and HTTP for the management commands (`sealed login|tenants|apikeys|models|policies`).

Secrets never come from the command line (argv is visible in `ps`): a token is read from a file,
stdin or an environment variable, and `sealed login` stores it in
`$SEALED_HOME/cli/credentials.json` (0600), one entry per profile.

    management token: $SEALED_MANAGEMENT_TOKEN, else the profile's stored token
    gateway URL:      --url, $SEALED_GATEWAY, the profile's, the local `sealed up`'s, http://127.0.0.1:8000
    broker token:     $SEALED_ADMIN_TOKEN, else the profile's (operators only; `sealed keys` too)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import typer

from api.home import Home, default_home
from protocol.fsutil import atomic_write

TOKEN_ENV = "SEALED_MANAGEMENT_TOKEN"
GATEWAY_ENV = "SEALED_GATEWAY"
PROFILE_ENV = "SEALED_PROFILE"
BROKER_TENANT_TOKEN_ENV = "SEALED_BROKER_TENANT_TOKEN"
BROKER_TOKEN_ENV = "SEALED_ADMIN_TOKEN"

PROFILE = typer.Option("default", "--profile", envvar=PROFILE_ENV, help="stored login to use")
URL = typer.Option(None, "--url", help=f"gateway URL (default ${GATEWAY_ENV}, the login's, or the local stack's)")


def credentials_path() -> Path:
    return Home(default_home()).root / "cli" / "credentials.json"


def load_profiles() -> dict[str, dict[str, Any]]:
    path = credentials_path()
    if not path.exists():
        return {}
    if path.stat().st_mode & 0o077:
        raise typer.BadParameter(f"{path} is readable by others; chmod 600 it (it holds tokens)")
    return dict(json.loads(path.read_text()))


def save_profile(name: str, profile: dict[str, Any]) -> Path:
    profiles = load_profiles()
    profiles[name] = profile
    atomic_write(credentials_path(), json.dumps(profiles, indent=1, sort_keys=True).encode(), mode=0o600)
    return credentials_path()


def read_secret(file: Path | None, env: str, what: str) -> str:
    """A secret from a file ('-' is stdin), else the environment variable, else piped stdin."""
    if file is not None:
        text = sys.stdin.read() if str(file) == "-" else file.read_text()
    elif os.environ.get(env):
        text = os.environ[env]
    elif not sys.stdin.isatty():
        text = sys.stdin.read()
    else:
        raise typer.BadParameter(f"give {what} with --token-file FILE, --token-file - (stdin) or ${env}")
    secret = text.strip()
    if not secret:
        raise typer.BadParameter(f"{what} is empty")
    return secret


def local_stack_url(key: str) -> str | None:
    pids = Home(default_home()).root / "run" / "pids.json"
    try:
        return str(json.loads(pids.read_text())[key])
    except (OSError, ValueError, KeyError):
        return None


def gateway_url(url: str | None, profile: str) -> str:
    stored = load_profiles().get(profile, {})
    return (url or os.environ.get(GATEWAY_ENV) or stored.get("url") or local_stack_url("gateway_url")
            or "http://127.0.0.1:8000").rstrip("/")


def management_token(profile: str) -> str:
    token = os.environ.get(TOKEN_ENV) or load_profiles().get(profile, {}).get("token")
    if not token:
        raise typer.BadParameter(f"not logged in: run `sealed login` (or set ${TOKEN_ENV})")
    return str(token)


def broker_credentials(profile: str) -> tuple[str, str] | None:
    """(broker URL, operator token) when this login can administer the key broker."""
    stored = load_profiles().get(profile, {})
    token = os.environ.get(BROKER_TOKEN_ENV) or stored.get("broker_token")
    url = os.environ.get("SEALED_BROKER_URL") or stored.get("broker_url") or local_stack_url("broker_url")
    return (str(url).rstrip("/"), str(token)) if token and url else None


def fail(response: httpx.Response) -> None:
    try:
        body = response.json()
        message = (body.get("error") or {}).get("message") if isinstance(body.get("error"), dict) else None
        message = message or body.get("detail") or body
    except ValueError:
        message = response.text[:300]
    typer.echo(f"error {response.status_code}: {message}", err=True)
    raise typer.Exit(1)


def call(method: str, path: str, *, profile: str, url: str | None = None, body: Any = None,
         token: str | None = None) -> Any:
    """A management API call (`/admin/v1` + path); prints the error and exits non-zero on failure."""
    try:
        response = httpx.request(method, f"{gateway_url(url, profile)}/admin/v1{path}", json=body, timeout=60.0,
                                 headers={"Authorization": f"Bearer {token or management_token(profile)}"})
    except httpx.HTTPError as exc:
        typer.echo(f"gateway unreachable: {type(exc).__name__}", err=True)
        raise typer.Exit(1) from exc
    if response.status_code >= 400:
        fail(response)
    return response.json()


def broker_call(method: str, path: str, *, profile: str, body: Any = None) -> Any:
    creds = broker_credentials(profile)
    if creds is None:
        raise typer.BadParameter(f"no key broker credentials: `sealed login --local-operator` or ${BROKER_TOKEN_ENV}")
    base, token = creds
    response = httpx.request(method, f"{base}/v1/admin{path}", json=body, timeout=60.0,
                             headers={"Authorization": f"Bearer {token}"})
    if response.status_code >= 400:
        fail(response)
    return response.json()


def broker_tenant_call(method: str, path: str, *, tenant: str, profile: str, body: Any = None,
                       missing_ok: bool = False) -> Any:
    """A broker admin call as the tenant itself (data-key import, policy-admin key), which the
    operator's token may not make. The tenant's tenant-admin token is $SEALED_BROKER_TENANT_TOKEN or
    kept in the profile; on the host of `sealed up` (operator and tenant are one person there) a
    `--local-operator` login mints one for the tenant once and keeps it (0600)."""
    creds = broker_credentials(profile)
    if creds is None:
        raise typer.BadParameter(f"no key broker credentials: `sealed login --local-operator` or ${BROKER_TOKEN_ENV}")
    base, operator_token = creds
    stored = load_profiles().get(profile, {})
    token = os.environ.get(BROKER_TENANT_TOKEN_ENV) or (stored.get("broker_tenant_tokens") or {}).get(tenant)
    if not token:
        minted = httpx.post(f"{base}/v1/admin/tenants/{tenant}/admin-tokens", timeout=60.0,
                            headers={"Authorization": f"Bearer {operator_token}"})
        if minted.status_code >= 400:
            fail(minted)
        token = str(minted.json()["token"])
        save_profile(profile, {**stored, "broker_tenant_tokens": {**(stored.get("broker_tenant_tokens") or {}),
                                                                  tenant: token}})
    response = httpx.request(method, f"{base}/v1/admin{path}", json=body, timeout=60.0,
                             headers={"Authorization": f"Bearer {token}"})
    if missing_ok and response.status_code == 404:
        return None
    if response.status_code >= 400:
        fail(response)
    return response.json()


def show(doc: Any, as_json: bool, rows: list[str] | None = None) -> None:
    if as_json or rows is None:
        typer.echo(json.dumps(doc, indent=1, sort_keys=True))
    else:
        for row in rows:
            typer.echo(row)
