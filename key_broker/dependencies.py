"""FastAPI dependencies of the key broker. Admin authorization is a chain: bearer token ->
principal -> (operator | manager of the tenant in the path | the tenant itself).

`tenant_self` admits only a tenant-admin token of the path's tenant, never the operator's: the
tenant's data-key imports and its policy-admin key are the tenant's alone."""

from __future__ import annotations

from fastapi import Depends, HTTPException, Request

from key_broker.auth import Principal
from key_broker.errors import AuthError, Forbidden
from key_broker.names import check_name
from key_broker.service import KeyBrokerService
from key_broker.tenants import TenantAdmin

_UNAUTHORIZED = {"type": "unauthorized", "message": "missing or invalid admin token"}
_FORBIDDEN = {"type": "forbidden", "message": "not allowed"}


def get_service(request: Request) -> KeyBrokerService:
    service: KeyBrokerService = request.app.state.service
    return service


def get_admin(request: Request) -> TenantAdmin:
    admin: TenantAdmin = request.app.state.admin
    return admin


def client_address(request: Request) -> str:
    return request.client.host if request.client else "-"


def bearer_token(request: Request) -> str:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise HTTPException(401, _UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    return value.strip()


def principal(token: str = Depends(bearer_token), admin: TenantAdmin = Depends(get_admin)) -> Principal:
    try:
        return admin.tokens.authenticate(token)
    except AuthError as exc:
        raise HTTPException(401, _UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"}) from exc


def operator(who: Principal = Depends(principal)) -> Principal:
    if who.role != "admin":
        raise HTTPException(403, _FORBIDDEN)
    return who


def tenant_manager(tenant: str, who: Principal = Depends(principal)) -> Principal:
    """The operator, or a tenant-admin of exactly this tenant (the path's {tenant})."""
    check_name(tenant, "tenant")
    if not who.may_manage(tenant):
        raise HTTPException(403, _FORBIDDEN)
    return who


def tenant_self(tenant: str, request: Request, who: Principal = Depends(principal)) -> Principal:
    """A tenant-admin token of exactly this tenant; the operator's token is refused (audited)."""
    check_name(tenant, "tenant")
    if who.role != "tenant-admin" or who.tenant != tenant:
        get_admin(request).refused(who, tenant, "admin-auth", Forbidden(
            f"{request.method} {request.url.path[:120]} needs the tenant's own token, not {who.role}'s"))
        raise HTTPException(403, _FORBIDDEN)
    return who
