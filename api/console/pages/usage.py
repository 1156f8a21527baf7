"""The usage page: tokens, requests and worker-seconds per tenant over time against their budgets,
and per API key and model."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from api.console.charts import bar_chart
from api.console.pages.render import render, tenants_of
from api.console.session import Viewer, viewer
from api.console.state import Console
from api.console.views import bucket_usage
from api.gateway.dependencies import get_service
from api.gateway.service import GatewayService

router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("/usage", response_class=HTMLResponse)
async def usage_page(request: Request, state: Console, who: Viewer = Depends(viewer), tenant: str | None = None,
                     hours: int = Query(24, ge=1, le=24 * 90),
                     service: GatewayService = Depends(get_service)) -> HTMLResponse:
    until = dt.datetime.now(dt.UTC)
    since = until - dt.timedelta(hours=hours)
    scope = who.tenant or (tenant or None)
    rows = await asyncio.to_thread(service.store.usage_rows, scope, since)
    agg = bucket_usage(rows, since, until)
    charts = []
    budgets = {t.name: t.token_budget for t in service.store.tenants()}
    for name in sorted(agg["tenants"]):
        if not who.sees(name):
            continue
        series = agg["tenants"][name]
        used = service.store.tokens_used(name)
        charts.append({"tenant": name, "used": used, "budget": budgets.get(name), "svgs": [
            bar_chart(list(zip(agg["labels"], series["tokens"], strict=True)), title=f"{name}: tokens",
                      budget=budgets.get(name), cumulative=True),
            bar_chart(list(zip(agg["labels"], series["requests"], strict=True)), title=f"{name}: requests"),
            bar_chart(list(zip(agg["labels"], series["worker_seconds"], strict=True)),
                      title=f"{name}: worker-seconds", unit="s")]})
    keys = {}
    for t in {k[0] for k in agg["by_key"]}:
        keys.update({(t, k.key_id): k for k in service.store.keys(t)})
    def spark(series: list[float], title: str, budget: float | None = None) -> Any:
        return bar_chart(list(zip(agg["labels"], series, strict=True)), title=title, budget=budget,
                         cumulative=budget is not None, width=300, height=90)

    by_key = [(t, k, v, keys.get((t, k)),
               spark(agg["key_series"][(t, k)], f"{k}: tokens",
                     keys[(t, k)].token_budget if (t, k) in keys else None))
              for (t, k), v in sorted(agg["by_key"].items()) if who.sees(t)]
    by_model = [(t, m, v, spark(agg["model_series"][(t, m)], f"{m}: tokens"))
                for (t, m), v in sorted(agg["by_model"].items()) if who.sees(t)]
    return render(state, request, "usage.html", who, charts=charts, by_key=by_key, by_model=by_model, hours=hours,
                  tenant=scope, tenants=tenants_of(service, who), since=since, until=until)
