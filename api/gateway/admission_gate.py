"""A key over its own limits is refused before its request body is read.

This ASGI middleware, the outermost, answers a flooder's 429s from the request line and the
Authorization header alone: for a POST to a route that admission charges, with a key this gateway
authenticated within the last second (`Catalog.recent_key`), it peeks at the key's and tenant's
requests-per-minute buckets and the tenant's queue counter (`Admission.early_refusal`): over a
bound, the same 429 the route would answer, counted and audited like it. Otherwise the request goes
on untouched and is charged once, by the usual admission: nothing is charged here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Receive, Scope, Send

from api.gateway.errors import error_response
from api.gateway.priority_loop import mark_urgent

if TYPE_CHECKING:
    from api.gateway.service import GatewayService

# The routes whose requests pass admission (the rate limits and the queue bound).
ADMITTED_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize", "/detokenize",
                             "/v1/sealed/chat/completions", "/v1/sealed/completions", "/v1/sealed/responses"})


def bearer(scope: Scope) -> str:
    """The bearer secret of the Authorization header ('' if none), as `dependencies.bearer_secret` reads it."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            scheme, _, secret = value.decode("latin-1").partition(" ")
            return secret.strip() if scheme.lower() == "bearer" else ""
    return ""


class AdmissionGate:
    def __init__(self, app: ASGIApp, service: GatewayService) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path") in ADMITTED_ROUTES:
            secret = bearer(scope)
            key = self.service.catalog.recent_key(secret) if secret else None
            refusal = self.service.admissions.early_refusal(key) if key is not None else None
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
            # A new connection's requests start urgent (priority_loop.py); reading and parsing the
            # body stays so only for a tenant with little in flight. A key not seen for a while
            # keeps the connection's mark until its lifecycle begins, which settles it.
            tenant = self.service.catalog.tenant_hint(secret) if secret else None
            if tenant is not None:
                mark_urgent(self.service.admission.light(tenant))
        await self.app(scope, receive, send)
