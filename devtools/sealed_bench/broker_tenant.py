"""A benchmark tenant at a real key broker, as the tenant itself: its own tenant-admin token (issued
by the operator) and its registered policy-admin key, which signs its release policies."""

from __future__ import annotations

from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy.release_documents import invitation_acceptance, sign_release_policy

KEY_ID = "bench-admin"


def tenant_client(url: str, admin_token: str, tenant: str) -> tuple[httpx.Client, Ed25519PrivateKey]:
    """A client of `/v1/admin/tenants/<tenant>` with the tenant's own token, and its policy-admin key
    (registered self-signed, answering the invitation the broker returns when the operator creates the
    tenant's key: docs/key-broker.md, "Invitations")."""
    base = f"{url}/v1/admin/tenants/{tenant}"
    operator = {"Authorization": f"Bearer {admin_token}"}
    created = httpx.post(f"{base}/key", headers=operator, timeout=30)
    created.raise_for_status()
    invitation = created.json()["invitation"]["payload"]
    minted = httpx.post(f"{base}/admin-tokens", headers=operator, timeout=30)
    minted.raise_for_status()
    own = {"Authorization": f"Bearer {minted.json()['token']}"}
    key = Ed25519PrivateKey.generate()
    httpx.put(f"{base}/policy-admin-key", headers=own, timeout=30,
              json=invitation_acceptance(tenant, key, KEY_ID, invitation)).raise_for_status()
    return httpx.Client(base_url=base, headers=own, timeout=30), key  # not opened yet: use it in `with`


def put_policy(client: httpx.Client, key: Ed25519PrivateKey, doc: dict[str, Any]) -> None:
    client.put("/policies", json=sign_release_policy(doc, key, KEY_ID)).raise_for_status()
