"""The workers page: each worker's attestation as its signed heartbeats reported it, beside the
measurements the key broker's release policies allow (with the person's own broker token)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from api.console.broker import BrokerUnavailable, BrokerView
from api.console.broker_token import broker_token
from api.console.pages.render import render
from api.console.session import Viewer, viewer
from api.console.state import Console
from api.console.views import worker_rows
from api.gateway.dependencies import get_service
from api.gateway.service import GatewayService

router = APIRouter(prefix="/console", include_in_schema=False)


async def _reference_values(broker: BrokerView, request: Request, tenants: set[str]
                            ) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    if not broker.configured:
        return out
    token = broker_token(request)
    if token is None:
        return out
    for tenant in tenants:
        try:
            policies = await asyncio.to_thread(broker.release_policies, tenant, token)
        except BrokerUnavailable:
            continue
        for p in policies:
            out.setdefault((tenant, str(p.get("model"))), set()).update(p.get("allowed_measurements") or ())
    return out


@router.get("/workers", response_class=HTMLResponse)
async def workers_page(request: Request, state: Console, who: Viewer = Depends(viewer),
                       service: GatewayService = Depends(get_service)) -> HTMLResponse:
    reg = service.registry
    # What each worker submitted in its signed heartbeats (nothing is fetched from a worker's address).
    attestations = [a for a in await service.enrolment.attestation_all() if who.sees(str(a.get("tenant")))]
    tenants = {w.tenant for w in reg.workers.values() if who.sees(w.tenant)}
    reference = await _reference_values(state.broker, request, tenants)
    rows = worker_rows(service, attestations, reference, who, time.time())
    return render(state, request, "workers.html", who, rows=rows, now=dt.datetime.now(dt.UTC),
                  broker=state.broker.configured)
