"""Authorization as chained dependencies: bearer key -> API key record (-> tenant) -> its
requests-per-minute charge; and the gateway's parts, bound by the composition root (api/parts.py).

They are `async` so that FastAPI runs them on the loop, not with a thread hop per request each.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, Request

from api.gateway.errors import GatewayError
from api.gateway.service import GatewayService
from api.store.repo import KeyRecord


async def get_service() -> GatewayService:
    """The gateway's parts: `create_app` binds the ones it built in this one's place in every route
    (api/parts.py), so routes get them as a typed dependency, never from a service locator on the app."""
    raise RuntimeError("no gateway bound: build the app with api.app.create_app(settings)")


async def bearer_secret(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise GatewayError(401, "Missing API key: send 'Authorization: Bearer <key>'.",
                           code="invalid_api_key")
    return secret.strip()


async def current_key(request: Request, secret: str = Depends(bearer_secret),
                      service: GatewayService = Depends(get_service)) -> KeyRecord:
    # A key seen within the last second is served from memory: under a flood the threads are busy.
    key = service.catalog.cached_key(secret)
    if key is None:
        key = await asyncio.to_thread(service.catalog.authenticate, secret)
    request.scope.setdefault("state", {})["audit_tenant"] = key.tenant  # a later refusal's audit entry names it
    return key


async def charged_key(key: KeyRecord = Depends(current_key),
                      service: GatewayService = Depends(get_service)) -> KeyRecord:
    """The key, charged one request against its and its tenant's requests-per-minute limits (routes
    that generate nothing: stored state, tokenizing)."""
    service.admissions.ticket(key, 0)
    return key


async def plaintext_key(key: KeyRecord = Depends(charged_key),
                        service: GatewayService = Depends(get_service)) -> KeyRecord:
    """The charged key, of a caller that may send and read plaintext (the tenant's caller policy,
    `require_sealed`)."""
    service.check_plaintext_allowed(key)
    return key


# The parameters routes declare (FastAPI's Annotated dependencies).
Service = Annotated[GatewayService, Depends(get_service)]
ApiKey = Annotated[KeyRecord, Depends(current_key)]
ChargedKey = Annotated[KeyRecord, Depends(charged_key)]
PlaintextKey = Annotated[KeyRecord, Depends(plaintext_key)]
