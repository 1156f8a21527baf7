"""The console's view of the key broker, through its admin API, with the signed-in person's own
broker token (api/console/broker_token.py): the console holds no broker credential of its own.

The console decides who may see or do what (session role and tenant) before it calls here; the
broker then decides with the caller's token (a tenant-admin token reaches only its tenant).
"""

from __future__ import annotations

from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from api.errors import SealedApiError
from protocol.broker.receipts import ReceiptInvalid, verify_receipt


class BrokerUnavailable(SealedApiError):
    """No broker configured, no broker token given, or the broker refused or did not answer; the
    page says so instead of failing."""


class BrokerView:
    def __init__(self, url: str | None, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/") if url else None
        self._timeout = timeout_s
        self._http: httpx.Client | None = None  # one pooled client: no TLS context or connection per page

    @property
    def configured(self) -> bool:
        return bool(self.url)

    def _call(self, method: str, path: str, token: str | None) -> Any:
        if not self.configured:
            raise BrokerUnavailable("no key broker configured for the console")
        if not token:
            raise BrokerUnavailable("connect the key broker with your own tenant-admin token")
        if self._http is None:
            self._http = httpx.Client(base_url=self.url or "", timeout=self._timeout)
        try:
            response = self._http.request(method, path, headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError as exc:
            raise BrokerUnavailable(f"key broker unreachable ({type(exc).__name__})") from exc
        if response.status_code == 404:
            return None
        if response.status_code in (401, 403):
            raise BrokerUnavailable(f"the key broker refused your token ({response.status_code})")
        if response.status_code >= 400:
            raise BrokerUnavailable(f"key broker answered {response.status_code}")
        return response.json()

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def tenant_status(self, tenant: str, token: str | None) -> dict[str, Any] | None:
        status: dict[str, Any] | None = self._call("GET", f"/v1/admin/tenants/{tenant}", token)  # None: no tenant
        return status

    def release_policies(self, tenant: str, token: str | None) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/admin/tenants/{tenant}/policies", token) or []

    def revoke(self, tenant: str, token: str | None) -> dict[str, Any]:
        return self._call("POST", f"/v1/admin/tenants/{tenant}/key/revoke", token) or {}

    def receipts(self, tenant: str, token: str | None, pinned: Ed25519PublicKey | None = None
                 ) -> list[dict[str, Any]]:
        """The tenant's release receipts, each checked against the broker's receipt key.

        ``pinned`` is the key the console already trusts (the broker's audit key, which signs
        receipts too); without it the key served next to the receipts is used. Each row carries
        ``verified`` (bool) and the receipt body; one that does not verify is shown, flagged.
        """
        doc = self._call("GET", f"/v1/admin/tenants/{tenant}/receipts", token)
        if not doc:
            return []
        key = pinned or _ed25519(doc.get("broker_public_key_pem", ""))
        out = []
        for line in doc.get("receipts", []):
            body = line.get("receipt") if isinstance(line, dict) else None
            try:
                if key is None:
                    raise ReceiptInvalid("no broker receipt key")
                body = verify_receipt(line, key)
                verified = True
            except ReceiptInvalid:
                verified = False
            out.append({"verified": verified, **(body if isinstance(body, dict) else {})})
        return out


def _ed25519(pem: str) -> Ed25519PublicKey | None:
    try:
        key = serialization.load_pem_public_key(pem.encode())
    except ValueError:
        return None
    return key if isinstance(key, Ed25519PublicKey) else None
