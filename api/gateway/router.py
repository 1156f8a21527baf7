"""OpenAI-compatible routes. Responses from a simulated TEE say so in every body and chunk."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from api.gateway.dependencies import current_key, get_service
from api.gateway.errors import GatewayError
from api.gateway.generation import CleanupStreamingResponse, Run, request_id
from api.gateway.service import GatewayService
from api.store.repo import KeyRecord
from protocol.openai.chat import chat_body, chat_events, plan_chat
from protocol.openai.completions import completion_body, completion_events, plan_completion
from protocol.openai.schemas import ChatCompletionRequest, CompletionRequest

router = APIRouter()


def _tee(service: GatewayService, tenant: str, model: str) -> dict[str, Any]:
    workers = service.registry.ready(tenant, model)
    insecure = any(w.insecure for w in workers) or not workers
    tee = workers[0].tee if workers else "unknown"
    return {"tee": tee, "insecure": insecure, "system_fingerprint": f"sealed-{tee}"}


def _reserve(text_len: int, max_tokens: int, n: int) -> int:
    return text_len // 3 + max_tokens * n  # worst-case estimate; the unused part is given back


@router.get("/v1/models")
def list_models(key: KeyRecord = Depends(current_key), service: GatewayService = Depends(get_service)) -> dict:
    return {"object": "list", "data": [
        {"id": m, "object": "model", "created": 0, "owned_by": key.tenant} for m in service.models_for(key)]}


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(req: ChatCompletionRequest, key: KeyRecord = Depends(current_key),
                           service: GatewayService = Depends(get_service)):  # type: ignore[no-untyped-def]
    split = service.resolve(key, req.model)
    service.check_plaintext_allowed(key)
    rid = request_id()
    plan = plan_chat(req, rid=rid, tenant=key.tenant, key_id=key.key_id, agent_killed=key.tools_killed,
                     default_max_tokens=service.settings.default_max_tokens)
    max_tokens = plan.requests[0].params.max_tokens
    ticket = service.ticket(key, _reserve(plan.reserve_chars, max_tokens, req.n), req.priority)
    run = Run(service, key, req.model, ticket)
    streams = await run.start(split, plan.requests, affinity=plan.affinity)
    base = {"id": f"chatcmpl-{rid}", "created": int(time.time()), "model": req.model,
            **_tee(service, key.tenant, req.model)}
    if not req.stream:
        return JSONResponse(await chat_body(req, plan, run, streams, base))
    return CleanupStreamingResponse(chat_events(req, plan, run, streams, base), run.close,
                                    media_type="text/event-stream", headers={"Cache-Control": "no-store"})


@router.post("/v1/completions", response_model=None)
async def completions(req: CompletionRequest, key: KeyRecord = Depends(current_key),
                      service: GatewayService = Depends(get_service)):  # type: ignore[no-untyped-def]
    split = service.resolve(key, req.model)
    service.check_plaintext_allowed(key)
    rid = request_id()
    plan = plan_completion(req, rid=rid, tenant=key.tenant, key_id=key.key_id)
    ticket = service.ticket(key, _reserve(plan.reserve_chars, req.max_tokens or 16, len(plan.requests)),
                            req.priority)
    run = Run(service, key, req.model, ticket)
    streams = await run.start(split, plan.requests, affinity=plan.affinity)
    base = {"id": f"cmpl-{rid}", "created": int(time.time()), "model": req.model, "object": "text_completion",
            **_tee(service, key.tenant, req.model)}
    if not req.stream:
        return JSONResponse(await completion_body(req, plan, run, streams, base))
    return CleanupStreamingResponse(completion_events(req, plan, run, streams, base), run.close,
                                    media_type="text/event-stream", headers={"Cache-Control": "no-store"})


@router.get("/v1/usage")
def usage(key: KeyRecord = Depends(current_key), service: GatewayService = Depends(get_service)) -> dict:
    rows = service.store.usage_summary(key.tenant)
    totals = {f: sum(r[f] for r in rows) for f in ("requests", "prompt_tokens", "completion_tokens",
                                                   "worker_seconds")}
    return {"object": "usage", "tenant": key.tenant, "totals": totals, "by_key": rows}


@router.get("/.well-known/jwks.json")
def broker_jwks(service: GatewayService = Depends(get_service)) -> JSONResponse:
    """The key broker's token keys, so a client can check `/.well-known/attestation` from the gateway
    alone. Serving them adds no trust: a client pins the broker's issuer and reference values."""
    path = service.settings.broker_jwks
    if path is None or not path.exists():
        raise GatewayError(404, "this gateway has no key broker JWKS configured", code="not_found")
    return JSONResponse(json.loads(path.read_text()), headers={"Cache-Control": "max-age=60"})


@router.get("/.well-known/reference-values")
def reference_values(service: GatewayService = Depends(get_service)) -> JSONResponse:
    """The operator's signed in-toto statement of the measurements a worker may have (served as is;
    a client checks it against the publisher key it pins)."""
    path = service.settings.reference_values
    if path is None or not path.exists():
        raise GatewayError(404, "this gateway publishes no reference values", code="not_found")
    return JSONResponse(json.loads(path.read_text()), headers={"Cache-Control": "max-age=60"})


@router.get("/.well-known/attestation")
async def well_known_attestation(service: GatewayService = Depends(get_service)) -> dict:
    return {"workers": await service.attestation()}
