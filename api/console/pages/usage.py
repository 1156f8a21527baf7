"""The usage page: tokens, requests and worker-seconds per tenant over time against their budgets,
and per API key and model."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import defaultdict
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from api.console.charts import bar_chart
from api.console.pages.render import render, tenants_of
from api.console.session import Viewer, viewer
from api.console.state import Console
from api.gateway.dependencies import get_service
from api.gateway.service import GatewayService

router = APIRouter(prefix="/console", include_in_schema=False)


def bucket_usage(rows: list[Any], since: dt.datetime, until: dt.datetime, buckets: int = 24
                 ) -> dict[str, Any]:
    span = max(1.0, (until - since).total_seconds() / buckets)
    labels = [(since + dt.timedelta(seconds=span * i)).strftime("%m-%d %H:%M") for i in range(buckets)]

    def zero() -> list[float]:
        return [0.0] * buckets

    tenants: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"tokens": zero(), "requests": zero(),
                                                                      "worker_seconds": zero()})
    by_key: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0.0])
    by_model: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0.0])
    key_series: dict[tuple[str, str], list[float]] = defaultdict(zero)  # tokens per bucket
    model_series: dict[tuple[str, str], list[float]] = defaultdict(zero)
    for r in rows:
        at = r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=dt.UTC)
        i = min(buckets - 1, max(0, int((at - since).total_seconds() // span)))
        tokens = r.prompt_tokens + r.completion_tokens
        t = tenants[r.tenant]
        t["tokens"][i] += tokens
        t["requests"][i] += 1
        t["worker_seconds"][i] += r.worker_seconds
        for agg in (by_key[(r.tenant, r.key_id)], by_model[(r.tenant, f"{r.model}/{r.version}")]):
            agg[0] += 1
            agg[1] += tokens
            agg[2] += r.worker_seconds
        key_series[(r.tenant, r.key_id)][i] += tokens
        model_series[(r.tenant, f"{r.model}/{r.version}")][i] += tokens
    return {"labels": labels, "tenants": dict(tenants), "by_key": dict(by_key), "by_model": dict(by_model),
            "key_series": dict(key_series), "model_series": dict(model_series)}


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
