"""What every console page does: render a template for the person signed in, choose the tenants
they may see, and bring the audit index up to date before reading it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from api.console.auditindex import AuditIndex
from api.console.session import Viewer
from api.console.state import ConsoleState
from api.gateway.service import GatewayService


def render(state: ConsoleState, request: Request, name: str, who: Viewer | None, **ctx: Any) -> HTMLResponse:
    started = getattr(request.state, "console_started", None)
    return state.templates.TemplateResponse(request, name, {
        "who": who, "nav": name.removesuffix(".html"), "started": started, "perf_counter": time.perf_counter,
        **ctx})


def tenants_of(service: GatewayService, who: Viewer) -> list[str]:
    if who.tenant is not None:
        return [who.tenant]
    return [t.name for t in service.store.tenants()]


def pick_tenant(service: GatewayService, who: Viewer, tenant: str | None) -> str | None:
    choices = tenants_of(service, who)
    if who.tenant is not None:
        return who.tenant  # never another tenant's, whatever the query says
    if tenant and tenant in choices:
        return tenant
    return choices[0] if choices else None


async def refreshed_index(state: ConsoleState) -> AuditIndex | None:
    """The audit index with what the logs gained since the last page (read off the event loop)."""
    index = state.index
    if index is not None:
        await asyncio.to_thread(index.refresh)
    return index
