"""OpenAI-compatible routes. Responses from a simulated TEE say so in every body and chunk."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from api.gateway.catalog import not_found
from api.gateway.dependencies import current_key, get_service
from api.gateway.errors import GatewayError
from api.gateway.generation import CleanupStreamingResponse, Run, request_id, unless_disconnected
from api.gateway.responses_routes import remember, start_turn
from api.gateway.service import GatewayService
from api.gateway.spans import request_span
from api.store.repo import KeyRecord
from protocol.openai.chat import chat_body, chat_events, plan_chat
from protocol.openai.completions import completion_body, completion_events, plan_completion
from protocol.openai.responses import responses_body, responses_events
from protocol.openai.responses_request import ResponsesRequest, to_chat
from protocol.openai.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from protocol.rpc import worker_pb2
from protocol.sampling import resolve_max_tokens

router = APIRouter()


def _tee(service: GatewayService, tenant: str, model: str) -> dict[str, Any]:
    workers = service.registry.ready(tenant, model)
    insecure = any(w.insecure for w in workers) or not workers
    tee = workers[0].tee if workers else "unknown"
    return {"tee": tee, "insecure": insecure, "system_fingerprint": f"sealed-{tee}"}


def _reserve(text_len: int, max_tokens: int, n: int) -> int:
    return text_len // 3 + max_tokens * n  # worst-case estimate; the unused part is given back


def _model_card(model: str, key: KeyRecord) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": key.tenant}


@router.get("/v1/models")
def list_models(key: KeyRecord = Depends(current_key), service: GatewayService = Depends(get_service)) -> dict:
    return {"object": "list", "data": [_model_card(m, key) for m in service.models_for(key)]}


@router.get("/v1/models/{model:path}")
def retrieve_model(model: str, key: KeyRecord = Depends(current_key),
                   service: GatewayService = Depends(get_service)) -> dict:
    """One model as /v1/models lists it; a model the key may not see, or that no ready worker holds,
    is OpenAI's 404 (the same answer whether it belongs to another tenant or does not exist)."""
    if model not in service.models_for(key):
        raise not_found(model)
    return _model_card(model, key)


# JSON, or server-sent events with "stream": true.
_STREAMABLE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/json": {}, "text/event-stream": {}}}}


@router.post("/v1/chat/completions", response_model=None, responses=_STREAMABLE)
async def chat_completions(req: ChatCompletionRequest, request: Request, key: KeyRecord = Depends(current_key),
                           service: GatewayService = Depends(get_service)) -> JSONResponse | CleanupStreamingResponse:
    split = service.resolve(key, req.model)
    service.check_plaintext_allowed(key)
    rid = request_id()
    plan = plan_chat(req, rid=rid, tenant=key.tenant, key_id=key.key_id, agent_killed=key.tools_killed,
                     default_max_tokens=service.settings.default_max_tokens)
    max_tokens = plan.requests[0].params.max_tokens
    ticket = service.ticket(key, _reserve(plan.reserve_chars, max_tokens, req.n), req.priority, streams=req.n)
    run = Run(service, key, req.model, ticket, request_span(service.tracing, request.headers, request_id=rid,
                                                            tenant=key.tenant, model=req.model, sealed=False,
                                                            choices=req.n, stream=bool(req.stream)))
    streams = await unless_disconnected(request.receive, run.start(split, plan.requests, affinity=plan.affinity))
    base = {"id": f"chatcmpl-{rid}", "created": int(time.time()), "model": req.model,
            **_tee(service, key.tenant, req.model)}
    if not req.stream:
        return JSONResponse(await unless_disconnected(request.receive, chat_body(req, plan, run, streams, base)))
    return CleanupStreamingResponse(chat_events(req, plan, run, streams, base), run.close,
                                    media_type="text/event-stream", headers={"Cache-Control": "no-store"})


@router.post("/v1/responses", response_model=None, responses=_STREAMABLE)
async def responses(req: ResponsesRequest, request: Request, key: KeyRecord = Depends(current_key),
                    service: GatewayService = Depends(get_service)) -> JSONResponse | CleanupStreamingResponse:
    """OpenAI's Responses API over the chat pipeline (protocol/openai/responses*.py); stored
    responses and previous_response_id: api/gateway/responses_routes.py."""
    chat = to_chat(req)
    split = service.resolve(key, req.model)
    service.check_plaintext_allowed(key)
    turn = start_turn(service, key, req)
    split = turn.pinned_split(split)
    rid = request_id()
    plan = plan_chat(chat, rid=rid, tenant=key.tenant, key_id=key.key_id, agent_killed=key.tools_killed,
                     default_max_tokens=service.settings.default_max_tokens)
    turn.attach(plan.requests)
    ticket = service.ticket(key, _reserve(plan.reserve_chars, plan.requests[0].params.max_tokens, 1), chat.priority)
    run = Run(service, key, req.model, ticket)
    streams = await unless_disconnected(request.receive, run.start(split, plan.requests, affinity=plan.affinity))
    base = {"id": f"chatcmpl-{rid}", "created": int(time.time()), "model": req.model, "store": turn.store,
            "conversation": turn.conversation.id if turn.conversation else None,
            **_tee(service, key.tenant, req.model)}
    if not req.stream:
        body = await unless_disconnected(request.receive, chat_body(chat, plan, run, streams, base))
        doc = responses_body(req, body, base)
        await remember(service, turn, split, doc)
        return JSONResponse(doc)
    events = responses_events(req, chat_events(chat, plan, run, streams, base), base,
                              finished=lambda doc: remember(service, turn, split, doc))
    return CleanupStreamingResponse(events, run.close, media_type="text/event-stream",
                                    headers={"Cache-Control": "no-store"})


@router.post("/v1/completions", response_model=None, responses=_STREAMABLE)
async def completions(req: CompletionRequest, request: Request, key: KeyRecord = Depends(current_key),
                      service: GatewayService = Depends(get_service)) -> JSONResponse | CleanupStreamingResponse:
    split = service.resolve(key, req.model)
    service.check_plaintext_allowed(key)
    prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
    if not prompts or any(not p for p in prompts):
        raise GatewayError(400, "prompt must not be empty", param="prompt")
    limit, choices = service.settings.max_choices, len(prompts) * req.n
    if choices > limit:
        # Each prompt x choice is a stream on a worker: bounded per request, refused before anything is built.
        raise GatewayError(400, f"too many choices: {len(prompts)} prompts x n={req.n} exceeds {limit} per request",
                           param="n", code="invalid_value")
    # The whole worst case is charged (and refused if it can never fit) before any stream is built.
    max_tokens = resolve_max_tokens(req.max_tokens, "completions")
    ticket = service.ticket(key, _reserve(sum(map(len, prompts)), max_tokens, choices), req.priority,
                            streams=choices)
    rid = request_id()
    plan = plan_completion(req, rid=rid, tenant=key.tenant, key_id=key.key_id)
    run = Run(service, key, req.model, ticket, request_span(service.tracing, request.headers, request_id=rid,
                                                            tenant=key.tenant, model=req.model, sealed=False,
                                                            choices=choices, stream=bool(req.stream)))
    streams = await unless_disconnected(request.receive, run.start(split, plan.requests, affinity=plan.affinity))
    base = {"id": f"cmpl-{rid}", "created": int(time.time()), "model": req.model, "object": "text_completion",
            **_tee(service, key.tenant, req.model)}
    if not req.stream:
        return JSONResponse(await unless_disconnected(request.receive,
                                                      completion_body(req, plan, run, streams, base)))
    return CleanupStreamingResponse(completion_events(req, plan, run, streams, base), run.close,
                                    media_type="text/event-stream", headers={"Cache-Control": "no-store"})


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, key: KeyRecord = Depends(current_key),
                   service: GatewayService = Depends(get_service)) -> dict:
    """vLLM's /tokenize: the ids the model would see (tokenized in the worker, which holds the tokenizer)."""
    split = service.resolve(key, req.model)
    service.check_plaintext_allowed(key)
    service.ticket(key, 0)  # requests-per-minute limits apply; no tokens are generated
    if req.messages is not None:
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        call = worker_pb2.TokenizeRequest(
            tenant=key.tenant, key_id=key.key_id, kind="chat", add_generation_prompt=req.add_generation_prompt,
            messages_json=json.dumps([m.model_dump(exclude_none=True) for m in req.messages], ensure_ascii=False),
            tools_json=json.dumps(tools, ensure_ascii=False) if tools else "", return_token_strs=req.return_token_strs)
    else:
        call = worker_pb2.TokenizeRequest(tenant=key.tenant, key_id=key.key_id, kind="completion",
                                          prompt=req.prompt, return_token_strs=req.return_token_strs)
    reply = await service.call(key, req.model, split, "Tokenize", call)
    return {"count": len(reply.tokens), "max_model_len": reply.max_model_len, "tokens": list(reply.tokens),
            "token_strs": list(reply.token_strs) if req.return_token_strs else None}


@router.post("/detokenize")
async def detokenize(req: DetokenizeRequest, key: KeyRecord = Depends(current_key),
                     service: GatewayService = Depends(get_service)) -> dict:
    """vLLM's /detokenize: the text of token ids (out-of-vocabulary ids are a 400)."""
    split = service.resolve(key, req.model)
    service.check_plaintext_allowed(key)
    service.ticket(key, 0)
    reply = await service.call(key, req.model, split, "Detokenize", worker_pb2.DetokenizeRequest(
        tenant=key.tenant, key_id=key.key_id, tokens=req.tokens))
    return {"prompt": reply.prompt}


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
async def well_known_attestation(key: KeyRecord = Depends(current_key),
                                 service: GatewayService = Depends(get_service)) -> dict:
    """The evidence of the workers serving the caller's models: an API key is needed, so that an
    anonymous caller cannot list which tenants and models this deployment serves."""
    return {"workers": await service.attestation(key)}
