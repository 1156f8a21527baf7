"""Ending sessions (mounted under /admin/v1): logout, revocation, tenant removal.

- `POST /logout` (any role): the caller's own management token ends, on every replica, at once;
- `POST /revocations` (operator) `{"kind": "jti"|"subject"|"tenant"|"all", "value": ...}`: a token
  or console session by id, every token and session of a subject or tenant issued until now, or
  all of them (what rotating the JWT secret does too, without re-issuing the control loop's key);
- `GET /sessions` (operator, auditor): the live console sessions, to revoke one by its id;
- `DELETE /tenants/{tenant}` (operator): the tenant, its API keys and its traffic go, and with them
  every console session and management token of the tenant.

Checked on every request by api/management/auth.py and api/console/session.py (api/store/revocation.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import Field

from api.gateway.dependencies import get_service
from api.gateway.errors import GatewayError
from api.gateway.service import GatewayService
from api.management.audit import audit_admin
from api.management.auth import ROLES, Principal, require
from api.management.schemas import Strict

OP, AUDITOR = "operator", "auditor"

router = APIRouter()


class RevocationIn(Strict):
    kind: str = Field(pattern="^(jti|subject|tenant|all)$")
    value: str = Field(default="", max_length=256)


@router.post("/logout")
def logout(who: Principal = Depends(require(*ROLES)), service: GatewayService = Depends(get_service)) -> dict:
    service.store.revocations.revoke("jti", who.token_id)
    audit_admin(service.audit, who, who.tenant or "-", "token-logout", token_id=who.token_id)
    return {"revoked": who.token_id}


@router.post("/revocations", status_code=201)
def revoke(body: RevocationIn, who: Principal = Depends(require(OP)),
           service: GatewayService = Depends(get_service)) -> dict:
    try:
        ended = service.store.revocations.revoke(body.kind, body.value)
    except ValueError as exc:
        raise GatewayError(422, str(exc), code="invalid_revocation") from exc
    audit_admin(service.audit, who, body.value if body.kind == "tenant" else "-", "token-revoke", kind=body.kind,
                        value=body.value, sessions_ended=ended)
    return {"kind": body.kind, "value": body.value, "sessions_ended": ended}


@router.get("/sessions")
def sessions(_: Principal = Depends(require(OP, AUDITOR)), service: GatewayService = Depends(get_service)) -> dict:
    return {"data": [{"id": s.jti, "subject": s.subject, "role": s.role, "tenant": s.tenant,
                      "expires_at": s.expires_at.isoformat()} for s in service.store.revocations.live_sessions()]}


@router.delete("/tenants/{tenant}")
def remove_tenant(tenant: str, who: Principal = Depends(require(OP)),
                  service: GatewayService = Depends(get_service)) -> dict:
    service.catalog.forget()
    if not service.store.remove_tenant(tenant):
        raise GatewayError(404, "no such tenant", code="not_found")
    audit_admin(service.audit, who, tenant, "tenant-remove")
    return {"removed": tenant}
