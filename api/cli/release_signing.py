"""The tenant's side of release policies in the CLI: sign them with the tenant's policy-admin key,
and register that key at the key broker first if it has none yet.

The key broker takes a release policy only when the tenant's registered policy-admin key signed it
(policy/release_documents.py); it registers the key only from the tenant's own tenant-admin token.
On the one-machine demo the tenant's key is a local file (`<home>/tenants/<tenant>/policy-admin.pem`,
a tenant's file: in production it stays on the tenant's machine).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.home import Home, default_home, ed25519_key
from policy.cli import load_private_key
from policy.errors import PolicyInvalid
from policy.release_documents import admin_key_statement, public_pem, sign_release_policy

# (method, broker admin path, body) -> JSON answer, or None for a 4xx the caller handles
BrokerCall = Callable[[str, str, Any], Any]


def default_key_id(tenant: str) -> str:
    return f"{tenant}-admin"


def admin_key(tenant: str, path: Path | None, home: Path | None = None) -> Ed25519PrivateKey:
    """The tenant's policy-admin private key: ``path``, else the local home's (made if missing)."""
    if path is not None:
        try:
            return load_private_key(path)
        except (PolicyInvalid, ValueError) as exc:
            raise typer.BadParameter(f"{path}: {exc}") from exc
    return ed25519_key(Home(home or default_home()).tenant_policy_admin(tenant))


def ensure_registered(call: BrokerCall, tenant: str, key: Ed25519PrivateKey, key_id: str | None) -> str:
    """The key id the broker knows ``key`` by; registers it (self-signed) when the tenant has none."""
    current = call("GET", f"/tenants/{tenant}/policy-admin-key", None)
    if current is None:
        kid = key_id or default_key_id(tenant)
        call("PUT", f"/tenants/{tenant}/policy-admin-key", admin_key_statement(tenant, key.public_key(), kid, 1,
                                                                                 key, kid))
        return kid
    if current.get("public_key_pem") != public_pem(key.public_key()):
        raise typer.BadParameter(f"the key broker holds another policy-admin key for {tenant} "
                                 f"({current.get('key_id')}); sign with that key or rotate to this one")
    return str(current["key_id"])


def signed_release(doc: Any, tenant: str, key: Ed25519PrivateKey, key_id: str) -> dict[str, Any]:
    """``doc`` signed (a file that is already a signed envelope is sent as it is)."""
    if isinstance(doc, dict) and set(doc) == {"payload", "key_id", "alg", "sig"}:
        return doc
    try:
        return sign_release_policy(doc, key, key_id)
    except PolicyInvalid as exc:
        raise typer.BadParameter(f"release policy: {exc}") from exc


def read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except ValueError as exc:
        raise typer.BadParameter(f"{file} is not JSON") from exc
