"""Management routes (mounted under /admin/v1 by the gateway's create_app)."""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi import APIRouter, Depends

from api.gateway.dependencies import get_service
from api.gateway.errors import GatewayError
from api.gateway.service import GatewayService
from api.management.audit import audit_admin
from api.management.auth import Principal, require, tenant_scope
from api.management.schemas import (
    KeyIn,
    KillSwitchIn,
    ModelVersionIn,
    PolicyIn,
    RolloutIn,
    TenantIn,
    new_version_ref,
    stored_version_ref,
)
from policy.documents import verify_policy_document
from policy.errors import PolicyError

OP, ADMIN, USER, AUDITOR = "operator", "tenant-admin", "tenant-user", "auditor"


def _version(v: Any) -> dict[str, Any]:
    return {"tenant": v.tenant, "model": v.model, "version": v.version, "traffic_percent": v.traffic_percent,
            "min_warm": v.min_warm, "max_replicas": v.max_replicas, "ttft_slo_ms": v.ttft_slo_ms,
            "retired": v.retired, "status": v.status, "status_reason": v.status_reason}


def check_policy_document(tenant: str, document: dict[str, Any], admin_key_pem: str) -> None:
    """Refuse at once what a worker would refuse at boot: a policy not signed by that key, or not valid."""
    try:
        key = serialization.load_pem_public_key(admin_key_pem.encode())
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("not an Ed25519 key")
        verify_policy_document(document, {tenant: {str(document.get("key_id")): key}})
    except (ValueError, TypeError, PolicyError) as exc:
        raise GatewayError(422, f"policy refused: {exc}", code="invalid_policy") from exc


# Every change below invalidates this replica's caches at once (service.catalog.forget(); other replicas
# refresh within a second) and is in the audit trail with who made it (management/audit.py, never
# a secret).
router = APIRouter()


@router.post("/tenants", status_code=201)
def create_tenant(body: TenantIn, who: Principal = Depends(require(OP)),
                  service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    service.catalog.forget()
    t = store.ensure_tenant(body.name, **body.model_dump(exclude={"name"}))
    audit_admin(service.audit, who, t.name, "tenant-upsert", weight=t.weight, rpm=t.rpm, tpm=t.tpm,
                        token_budget=t.token_budget)
    return {"name": t.name, "weight": t.weight, "rpm": t.rpm, "tpm": t.tpm, "token_budget": t.token_budget}


@router.get("/tenants")
def list_tenants(_: Principal = Depends(require(OP, AUDITOR)),
                 service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    return {"data": [{"name": t.name, "weight": t.weight, "rpm": t.rpm, "tpm": t.tpm,
                      "token_budget": t.token_budget} for t in store.tenants()]}


@router.post("/tenants/{tenant}/keys", status_code=201)
def create_key(tenant: str, body: KeyIn, who: Principal = Depends(tenant_scope(OP, ADMIN)),
               service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    secret, rec = store.create_key(tenant, body.name, tuple(body.models), body.expires_at, body.rpm, body.tpm,
                                   body.priority, token_budget=body.token_budget)
    audit_admin(service.audit, who, tenant, "api-key-create", key_id=rec.key_id, models=",".join(rec.models)[:256])
    # The secret is shown once; only its hash is stored.
    return {"key_id": rec.key_id, "secret": secret, "tenant": tenant, "models": list(rec.models),
            "expires_at": body.expires_at.isoformat() if body.expires_at else None}


@router.get("/tenants/{tenant}/keys")
def list_keys(tenant: str, _: Principal = Depends(tenant_scope(OP, ADMIN, AUDITOR)),
              service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    return {"data": [{"key_id": k.key_id, "name": k.name, "models": list(k.models), "rpm": k.rpm, "tpm": k.tpm,
                      "priority": k.priority, "expires_at": k.expires_at.isoformat() if k.expires_at else None}
                     for k in store.keys(tenant)]}


@router.delete("/tenants/{tenant}/keys/{key_id}")
def revoke_key(tenant: str, key_id: str, who: Principal = Depends(tenant_scope(OP, ADMIN)),
               service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    service.catalog.forget()
    if not store.revoke_key(tenant, key_id):
        raise GatewayError(404, "no such key", code="not_found")
    service.catalog.forget()  # again after the write: a look-up in between must not keep the key cached
    audit_admin(service.audit, who, tenant, "api-key-revoke", key_id=key_id)
    return {"revoked": key_id}


@router.put("/tenants/{tenant}/keys/{key_id}/kill-switch")
def kill_switch(tenant: str, key_id: str, body: KillSwitchIn,
                who: Principal = Depends(tenant_scope(OP, ADMIN)),
                service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    # This replica forgets its cached key rows (before and after the write), so its next request
    # carries the flag; gateways on a shared database do not cache keys, so it holds for the
    # next request on every replica. The worker refuses the key's tool calls while it is set.
    service.catalog.forget()
    if not store.set_tools_killed(tenant, key_id, body.killed):
        raise GatewayError(404, "no such key", code="not_found")
    service.catalog.forget()
    audit_admin(service.audit, who, tenant, "kill-switch", key_id=key_id, killed=body.killed)
    return {"key_id": key_id, "tools_killed": body.killed}


@router.get("/tenants/{tenant}/models")
def list_versions(tenant: str, _: Principal = Depends(tenant_scope(OP, ADMIN, USER, AUDITOR)),
                  service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    return {"data": [_version(v) for v in store.model_versions(tenant)]}


@router.post("/tenants/{tenant}/models", status_code=201)
def add_version(tenant: str, body: ModelVersionIn, who: Principal = Depends(tenant_scope(OP, ADMIN)),
                service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    service.catalog.forget()
    row = _version(store.upsert_version(new_version_ref(tenant, body.model, body.version), min_warm=body.min_warm,
                                        max_replicas=body.max_replicas or max(1, body.min_warm),
                                        ttft_slo_ms=body.ttft_slo_ms))
    audit_admin(service.audit, who, tenant, "model-version-upsert", model=body.model, version=body.version,
                        min_warm=body.min_warm)
    return row


@router.post("/tenants/{tenant}/models/{model}/rollout")
def rollout(tenant: str, model: str, body: RolloutIn, who: Principal = Depends(tenant_scope(OP, ADMIN)),
            service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    try:
        service.catalog.forget()
        if any(v.retired and v.version == body.version for v in store.model_versions(tenant) if v.model == model):
            raise GatewayError(409, "this version is retired; register it again first", code="retired")
        rows = store.set_rollout(stored_version_ref(tenant, model, body.version), body.percent)
    except KeyError as exc:
        raise GatewayError(404, "no such model version", code="not_found") from exc
    audit_admin(service.audit, who, tenant, "model-rollout", model=model, version=body.version, percent=body.percent)
    return {"data": [_version(v) for v in rows]}


@router.post("/tenants/{tenant}/models/{model}/rollback")
def rollback(tenant: str, model: str, who: Principal = Depends(tenant_scope(OP, ADMIN)),
             service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    service.catalog.forget()
    rows = [_version(v) for v in store.rollback(tenant, model)]
    audit_admin(service.audit, who, tenant, "model-rollback", model=model)
    return {"data": rows}


@router.get("/usage")
def usage(tenant: str | None = None, who: Principal = Depends(require(OP, ADMIN, USER, AUDITOR)),
          service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    if who.role.startswith("tenant-"):
        tenant = who.tenant
    ledger = store.usage_ledger(tenant)
    return {"data": ledger.summary, "flagged": ledger.flagged}


@router.get("/usage/ledger")
def usage_ledger(tenant: str, who: Principal = Depends(require(OP, ADMIN, USER, AUDITOR)),
                 service: GatewayService = Depends(get_service)) -> dict:
    """The tenant's signed ledger, for `sealed usage --export` / `--verify` on the tenant's machine."""
    if who.role.startswith("tenant-"):
        tenant = who.tenant or ""
    return service.store.usage_export(tenant)


@router.put("/tenants/{tenant}/policy")
def put_policy(tenant: str, body: PolicyIn, who: Principal = Depends(tenant_scope(OP, ADMIN)),
               service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    service.catalog.forget()
    if body.admin_key_pem is not None:
        check_policy_document(tenant, body.document, body.admin_key_pem)
    version = store.put_policy(tenant, body.document, body.admin_key_pem)
    audit_admin(service.audit, who, tenant, "policy-put", policy_version=version)
    return {"tenant": tenant, "version": version}


@router.get("/tenants/{tenant}/policy")
def get_policy(tenant: str, _: Principal = Depends(tenant_scope(OP, ADMIN, AUDITOR)),
               service: GatewayService = Depends(get_service)) -> dict:
    store = service.store
    row = store.policy(tenant)
    if row is None:
        raise GatewayError(404, "no policy", code="not_found")
    return {"tenant": tenant, "version": row.version, "document": row.document,
            "admin_key_pem": row.admin_key_pem}


@router.get("/readiness")
def readiness_detail(_: Principal = Depends(require(OP, AUDITOR)),
                     service: GatewayService = Depends(get_service)) -> dict:
    """What /readyz says, with the names a public probe does not get."""
    from api.gateway.internal import readiness

    return readiness(service)[1]


@router.get("/workers")
def workers(_: Principal = Depends(require(OP, AUDITOR)),
            service: GatewayService = Depends(get_service)) -> dict:
    reg = service.registry
    return {"data": [{"worker_id": w.worker_id, "tenant": w.tenant, "model": w.model, "version": w.version,
                      "status": w.status if reg.alive(w) else "unreachable", "inflight": w.inflight,
                      "tee": w.tee, "insecure": w.insecure, "pid": w.pid, "grpc_address": w.grpc_address,
                      "mtls": bool(w.tls_cert), "tls_cert": w.tls_cert} for w in reg.workers.values()]}
