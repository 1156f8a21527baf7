"""Admin API: the operator (admin token) and tenant admins (tenant-admin tokens) manage tenant
keys, data keys, release policies, reference values and read release receipts.

What releases a tenant's keys is the tenant's alone: a release policy takes effect only when the
tenant's policy-admin key signed it (whoever carries it); the policy-admin key is registered and
rotated only with the tenant's own token (and a rotation only with the current key's signature);
data keys are imported only with the tenant's own token. The operator's token can do none of these."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, HTTPException, Request

from key_broker.admin_schemas import (
    DataKeyUpload,
    ReceiptsResponse,
    ReferenceValuesResponse,
    RotationResponse,
    TenantTokenResponse,
)
from key_broker.auth import Principal
from key_broker.dependencies import get_admin, operator, tenant_manager, tenant_self
from key_broker.names import broker_ref
from key_broker.tenants import TenantAdmin

router = APIRouter(prefix="/v1/admin")
T = "/tenants/{tenant}"


@router.post(T + "/key", status_code=201)
def create_tenant_key(tenant: str, who: Principal = Depends(tenant_manager),
                      admin: TenantAdmin = Depends(get_admin)) -> dict[str, Any]:
    """The tenant's key, and the invitation (signed by this broker instance) the tenant answers with
    its policy-admin key: it goes to the tenant out of band (issue #46)."""
    admin.create_tenant_key(who, tenant)
    return {**admin.status(tenant), "invitation": admin.invite(who, tenant)}


@router.post(T + "/invitations", status_code=201)
def invite(tenant: str, who: Principal = Depends(tenant_manager),
           admin: TenantAdmin = Depends(get_admin)) -> dict[str, Any]:
    """A new invitation for the tenant's first policy-admin key (an earlier one expired or was lost)."""
    return admin.invite(who, tenant)


@router.get(T)
def tenant_status(tenant: str, _: Principal = Depends(tenant_manager),
                  admin: TenantAdmin = Depends(get_admin)) -> dict[str, Any]:
    return admin.status(tenant)


@router.post(T + "/key/rotate", response_model=RotationResponse)
def rotate_tenant_key(tenant: str, who: Principal = Depends(tenant_manager),
                      admin: TenantAdmin = Depends(get_admin)) -> RotationResponse:
    result = admin.rotate(who, tenant)
    return RotationResponse(kek_version=result.kek_version, rewrapped=result.rewrapped)


@router.post(T + "/key/revoke")
def revoke_tenant_key(tenant: str, request: Request, who: Principal = Depends(tenant_manager),
                      admin: TenantAdmin = Depends(get_admin)) -> dict[str, Any]:
    admin.revoke(who, tenant)
    request.app.state.leases.changes.notify()  # held lease polls answer "revoked" now
    return admin.status(tenant)


@router.put(T + "/models/{model}/versions/{version}/data-key", status_code=201)
def put_data_key(tenant: str, model: str, version: str, body: DataKeyUpload,
                 who: Principal = Depends(tenant_self), admin: TenantAdmin = Depends(get_admin)) -> dict[str, Any]:
    record = admin.put_sealed_data_key(who, broker_ref(tenant, model, version), body)
    return {"tenant": tenant, "model": model, "version": version, "key_id": record.key_id,
            "signer": record.signer, "model_digest": record.model_digest}


@router.put(T + "/policies")
def put_policy(tenant: str, request: Request, body: dict[str, Any] = Body(...),
               who: Principal = Depends(tenant_manager), admin: TenantAdmin = Depends(get_admin)) -> dict[str, Any]:
    """A release policy envelope signed by the tenant's policy-admin key (policy/release_documents.py)."""
    stored = admin.put_policy(who, tenant, body)
    request.app.state.leases.changes.notify()  # held lease polls appraise their worker again now
    return stored.to_dict()


@router.put(T + "/policy-admin-key")
def put_policy_admin_key(tenant: str, body: dict[str, Any] = Body(...), who: Principal = Depends(tenant_self),
                         admin: TenantAdmin = Depends(get_admin)) -> dict[str, Any]:
    """Register (self-signed, version 1) or rotate (signed by the current key) the tenant's policy-admin key."""
    return admin.put_admin_key(who, tenant, body).public()


@router.get(T + "/policy-admin-key")
def get_policy_admin_key(tenant: str, _: Principal = Depends(tenant_manager),
                         admin: TenantAdmin = Depends(get_admin)) -> dict[str, Any]:
    """The registered key (the tenant checks it is its own before trusting the broker with data keys)."""
    record = admin.policies.admin_keys.get(tenant)
    if record is None:
        raise HTTPException(404, {"type": "not_found", "message": "no policy-admin key registered"})
    return record.public()


@router.get(T + "/policies")
def list_policies(tenant: str, _: Principal = Depends(tenant_manager),
                  admin: TenantAdmin = Depends(get_admin)) -> list[dict[str, Any]]:
    return [p.to_dict() for p in admin.policies.list(tenant)]


@router.put(T + "/reference-value-keys/{key_id}", status_code=201)
def add_refval_key(tenant: str, key_id: str, body: dict[str, Any] = Body(...), who: Principal = Depends(tenant_manager),
                   admin: TenantAdmin = Depends(get_admin)) -> dict[str, Any]:
    """Pin a signer of the tenant's reference values: a statement signed by the tenant's policy-admin
    key (policy/release_documents.py::refval_key_statement), whoever carries it."""
    admin.add_refval_key(who, tenant, key_id, body)
    return {"tenant": tenant, "key_id": key_id}


@router.put(T + "/reference-values", response_model=ReferenceValuesResponse)
def put_reference_values(tenant: str, request: Request, body: dict[str, Any] = Body(...),
                         who: Principal = Depends(tenant_manager),
                         admin: TenantAdmin = Depends(get_admin)) -> ReferenceValuesResponse:
    values = admin.put_reference_values(who, tenant, body)
    request.app.state.leases.changes.notify()  # held lease polls appraise their worker again now
    return ReferenceValuesResponse(id=values.id, version=values.version,
                                   measurements=sorted(values.measurements), digest=values.digest)


@router.get(T + "/receipts", response_model=ReceiptsResponse)
def receipts(tenant: str, _: Principal = Depends(tenant_manager),
             admin: TenantAdmin = Depends(get_admin)) -> ReceiptsResponse:
    """Every release of this tenant's keys, each signed by the broker (verify offline)."""
    return ReceiptsResponse(tenant=tenant, broker_public_key_pem=admin.receipts.public_key_pem,
                            receipts=admin.receipts.list(tenant))


@router.post(T + "/admin-tokens", response_model=TenantTokenResponse, status_code=201)
def issue_tenant_token(tenant: str, who: Principal = Depends(operator),
                       admin: TenantAdmin = Depends(get_admin)) -> TenantTokenResponse:
    # operator() runs before the path is validated; tenant names are checked in the store.
    token_id, secret = admin.issue_tenant_token(who, tenant)
    return TenantTokenResponse(token_id=token_id, token=secret)
