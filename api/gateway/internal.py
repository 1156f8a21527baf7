"""Worker heartbeats (registration), health, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from api.gateway.dependencies import Service, bearer_secret
from api.gateway.errors import GatewayError
from api.gateway.registry import WorkerInfo, WorkerRegistry
from api.gateway.service import GatewayService
from protocol.model_ref import InvalidModelRef, ModelRef
from protocol.worker_status import Heartbeat

router = APIRouter()


def worker_token(service: Service, secret: str = Depends(bearer_secret)) -> None:
    expected = service.settings.register_token
    if not expected or not hmac.compare_digest(secret.encode(), expected.encode()):
        raise GatewayError(401, "bad worker registration token", code="invalid_api_key")


@router.post("/internal/workers/heartbeat", dependencies=[Depends(worker_token)])
async def heartbeat(body: Heartbeat, request: Request, service: Service) -> dict:
    # Stamped on arrival (on the loop-lag-adjusted clock) and checked on the registry's own thread,
    # never behind usage writes or key look-ups: a busy gateway never ages a live worker's heartbeat.
    seen_at = service.registry.clock.now()
    # The signature covers the body exactly as the worker sent it (the schema has already bounded it).
    signed = json.loads(await request.body())
    await asyncio.get_running_loop().run_in_executor(service.registry.executor, service.enrolment.heartbeat,
                                                     body.model_dump(), signed, seen_at)
    if body.settle is None:
        return {"ok": True}
    # What the worker's calls that ended early owe (usage, the tenant's sealed records), signed with the
    # beat: stored before the answer says so, so the worker forgets only what is stored.
    return {"ok": True, "settled": await service.settle_owed(body.worker_id, body.settle)}


@router.get("/healthz")
def healthz() -> dict:
    return {"status": "ok"}


def version_workers(registry: WorkerRegistry, v: Any) -> list[WorkerInfo]:
    """The live workers of a catalog row's model version."""
    try:
        return registry.for_version(ModelRef(v.tenant, v.model, v.version))
    except InvalidModelRef:  # a row from before the management API refused such names: no worker serves it
        return []


def version_state(service: GatewayService, v: Any) -> dict[str, Any]:
    """One model version's serving state and, when it is not serving, why."""
    registry = service.registry
    mine = version_workers(registry, v)
    warm = sum(1 for w in mine if registry.routable(w))
    doc: dict[str, Any] = {"warm": warm, "min_warm": v.min_warm, "max_replicas": v.max_replicas}
    if warm:
        state, reason = "ready", ""
    elif any(w.status == "starting" for w in mine):
        state, reason = "starting", "a worker is attesting and loading the model"
    elif any(w.status == "ready" for w in mine):
        state, reason = "starting", "the worker's attestation is being checked"
    elif mine and all(w.status == "standby" for w in mine):  # enclave_worker/standby.py
        state, reason = "cold", "standby workers are attested and wait for an assignment; a request starts one"
    elif mine:
        state = "failing"
        reason = "; ".join(sorted({w.reason or "worker failed" for w in mine}))
    elif v.status:
        state, reason = v.status, v.status_reason  # as the control loop last reported it
    elif v.min_warm == 0:
        state, reason = "cold", "scaled to zero; a request starts a worker"
    else:
        state, reason = "waiting", "no worker registered"
    if v.status == "failing" and state != "ready":
        state, reason = "failing", v.status_reason or reason  # the control loop knows more (e.g. backoff)
    doc.update(state=state, reason=reason)
    return doc


@router.get("/readyz", response_model=None)
def readyz(service: Service) -> JSONResponse:
    """Ready when the gateway can serve: some version has a warm worker, or no version needs one
    (all scaled to zero). One failing version never makes it unready for the others.

    Public (load balancers probe it), so it says only ready or not: which versions are failing and
    why is for operators (`GET /admin/v1/readiness`, `GET /admin/v1/workers`).
    """
    ready, _ = readiness(service)
    return JSONResponse(status_code=200 if ready else 503, content={"ready": ready})


def readiness(service: GatewayService) -> tuple[bool, dict[str, Any]]:
    """Per version: state and reason (and the overall answer of /readyz)."""
    registry, models = service.registry, {}
    for v in service.store.model_versions():
        if v.retired or (v.traffic_percent <= 0 and v.min_warm == 0):
            continue
        models[f"{v.tenant}/{v.model}/{v.version}"] = version_state(service, v)
    workers = [w.status if registry.alive(w) else "unreachable" for w in registry.workers.values()]
    needs_warm = [m for m in models.values() if m["min_warm"] > 0]
    ready = bool(models) and (any(m["warm"] for m in models.values()) or not needs_warm)
    failing = {k: m["reason"] for k, m in models.items() if m["state"] == "failing"}
    return ready, {"ready": ready, "workers": workers, "models": models, "failing": failing}
