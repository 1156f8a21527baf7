"""The tenant's side of release policies in the CLI: sign them with the tenant's policy-admin key,
and register that key at the key broker first if it has none yet.

The key broker takes a release policy only when the tenant's registered policy-admin key signed it
(policy/release_documents.py); it binds a first key only as the answer to its invitation
(api/cli/tenant_broker.py), and the CLI checks the attested answer of which key governs the tenant
before it sends anything.
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
from policy.release_documents import public_pem, sign_release_policy

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


def ensure_registered(call: BrokerCall, tenant: str, key: Ed25519PrivateKey, key_id: str | None = None) -> str:
    """The key id the broker knows ``key`` by. A first key is bound only by answering the broker's
    invitation (`sealed keys admin-key --invitation`; issue #46): none registered is an error here."""
    current = call("GET", f"/tenants/{tenant}/policy-admin-key", None)
    if current is None:
        raise typer.BadParameter(f"{tenant} has no policy-admin key at the key broker: answer its invitation first "
                                 "(`sealed keys admin-key --tenant T --invitation FILE --broker-policy POLICY`)")
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
