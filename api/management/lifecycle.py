"""Management routes for model-version lifecycle and the control loop (mounted under /admin/v1).

- `POST /tokens` (operator): a management token for a role (e.g. a tenant admin's, for uploads);
- `POST /tenants/{t}/models/{m}/versions/{v}/retire`: no more traffic; its workers drain and stop;
- `GET /deployments` (operator, auditor): what the control loop reconciles: every version with its
  bounds, package, serving state and load;
- `PUT /deployments/{t}/{m}/{v}/status` (operator): the control loop reports what it sees
  (e.g. "failing: key release refused, retry in 40 s"); `/readyz` shows it.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from pydantic import Field

from api.gateway.dependencies import get_service
from api.gateway.errors import GatewayError
from api.gateway.internal import version_state, version_workers
from api.gateway.service import GatewayService
from api.management.auth import ROLES, Principal, issue_token, require, tenant_scope
from api.management.oidc import OidcVerifier, get_oidc_verifier
from api.management.schemas import Strict, stored_version_ref

OP, ADMIN, AUDITOR = "operator", "tenant-admin", "auditor"
MAX_TOKEN_TTL_S = 7 * 24 * 3600

router = APIRouter()


class TokenIn(Strict):
    role: str = Field(pattern="^(" + "|".join(ROLES) + ")$")
    tenant: str | None = Field(default=None, max_length=64)
    subject: str = Field(min_length=1, max_length=128)
    ttl_s: int = Field(default=12 * 3600, ge=60, le=MAX_TOKEN_TTL_S)


class StatusIn(Strict):
    status: str = Field(max_length=32, pattern=r"^(|ready|starting|waiting|failing|cold|draining)$")
    reason: str = Field(default="", max_length=256)


def package_address(service: GatewayService, tenant: str, model: str, version: str) -> str | None:
    """The uploaded package's content address, when a tenant admin uploaded one for this version."""
    ref = service.settings.data_dir / "package-store" / "refs" / tenant / model / f"{version}.json"
    try:
        return str(json.loads(ref.read_text())["address"])
    except (OSError, ValueError, KeyError):
        return None


def package_store(service: GatewayService) -> Path:
    return service.settings.data_dir / "package-store"


@router.get("/whoami")
def whoami(who: Principal = Depends(require(*ROLES))) -> dict:
    return {"subject": who.subject, "role": who.role, "tenant": who.tenant}


@router.post("/tokens", status_code=201)
def mint_token(request: Request, body: TokenIn, _: Principal = Depends(require(OP)),
               service: GatewayService = Depends(get_service),
               oidc: OidcVerifier | None = Depends(get_oidc_verifier)) -> dict:
    """Shown once; tokens are not stored (they are signed, and expire). Local tokens only: with single
    sign-on, tokens come from the IdP, unless the local ones are accepted too (accept_local_tokens)."""
    if oidc is not None and not oidc.settings.accept_local_tokens:
        raise GatewayError(409, "single sign-on is on: management tokens come from the identity provider",
                           code="sso_tokens_only")
    if body.role.startswith("tenant-") and not body.tenant:
        raise GatewayError(400, "tenant roles need a tenant", param="tenant", code="invalid_value")
    if body.tenant and service.store.tenant(body.tenant) is None:
        raise GatewayError(404, "no such tenant", code="not_found", param="tenant")
    token = issue_token(service.settings.jwt_secret, body.subject, body.role,
                        body.tenant if body.role.startswith("tenant-") else None, ttl_s=body.ttl_s)
    return {"role": body.role, "tenant": body.tenant, "subject": body.subject, "ttl_s": body.ttl_s, "token": token}


@router.post("/tenants/{tenant}/models/{model}/versions/{version}/retire")
def retire(tenant: str, model: str, version: str, _: Principal = Depends(tenant_scope(OP, ADMIN)),
           service: GatewayService = Depends(get_service)) -> dict:
    try:
        rows = service.store.retire(stored_version_ref(tenant, model, version))
    except KeyError as exc:
        raise GatewayError(404, "no such model version", code="not_found") from exc
    service.catalog.forget()
    return {"data": [{"version": r.version, "traffic_percent": r.traffic_percent, "retired": r.retired}
                     for r in rows]}


@router.get("/deployments")
def deployments(_: Principal = Depends(require(OP, AUDITOR)),
                service: GatewayService = Depends(get_service)) -> dict:
    service.demand.refresh()
    registry, out = service.registry, []
    for v in service.store.model_versions():
        workers = version_workers(registry, v)
        ttft = service.demand.ttft_mean(v.tenant, v.model)
        out.append({
            "tenant": v.tenant, "model": v.model, "version": v.version, "retired": v.retired,
            "traffic_percent": v.traffic_percent, "min_warm": v.min_warm, "max_replicas": v.max_replicas,
            "ttft_slo_ms": v.ttft_slo_ms, "package": package_address(service, v.tenant, v.model, v.version),
            "state": version_state(service, v),
            "load": {"queue_depth": sum(w.load() for w in workers),
                     "unserved_recent": service.demand.recent_unserved(v.tenant, v.model),
                     "ttft_ms": round(ttft * 1000, 1) if ttft is not None else None},
            "workers": [{"worker_id": w.worker_id, "status": w.status, "reason": w.reason, "pid": w.pid,
                         "attested": w.attested, "load": w.load()} for w in workers],
        })
    return {"data": out, "at": dt.datetime.now(dt.UTC).isoformat()}


@router.put("/deployments/{tenant}/{model}/{version}/status")
def report_status(tenant: str, model: str, version: str, body: StatusIn, _: Principal = Depends(require(OP)),
                  service: GatewayService = Depends(get_service)) -> dict:
    if not service.store.set_version_status(stored_version_ref(tenant, model, version), body.status, body.reason):
        raise GatewayError(404, "no such model version", code="not_found")
    return {"tenant": tenant, "model": model, "version": version, "status": body.status}
