"""`GET /metrics`: the gateway's Prometheus metrics, for operators and auditors.

Metrics name tenants and models, so reading them takes a management token (Prometheus:
`authorization: {credentials_file: ...}`), not an anonymous request. The route is management's
(it checks management roles); the composition root (api/app.py) mounts it at the top level.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.gateway.dependencies import get_service
from api.gateway.errors import GatewayError
from api.gateway.service import GatewayService
from api.management.auth import Principal, principal

router = APIRouter()


def metrics_reader(who: Principal = Depends(principal)) -> None:
    if who.role not in ("operator", "auditor"):
        raise GatewayError(403, f"role {who.role} may not read metrics", type_="permission_error", code="forbidden")


@router.get("/metrics", dependencies=[Depends(metrics_reader)])
def metrics(service: GatewayService = Depends(get_service)) -> Response:
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
