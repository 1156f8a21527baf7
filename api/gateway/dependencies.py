"""Authorization as chained dependencies: bearer key -> API key record (-> tenant).

They are `async` so that FastAPI runs them on the loop, not with a thread hop per request each.
"""

from __future__ import annotations

import asyncio

from fastapi import Depends, Request

from api.gateway.errors import GatewayError
from api.gateway.service import GatewayService
from api.store.repo import KeyRecord


def gateway_of(request: Request) -> GatewayService:
    """The gateway's parts as `create_app` bound them to its app: the one place that knows where they
    are kept. Routes take them as a dependency (`get_service`); request helpers of the management API
    and the console that are not dependencies call this."""
    service: GatewayService = request.app.state.service
    return service


async def get_service(request: Request) -> GatewayService:
    return gateway_of(request)


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
