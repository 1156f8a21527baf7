"""OpenAI-compatible routes. Responses from a simulated TEE say so in every body and chunk."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from api.gateway.catalog import not_found
from api.gateway.dependencies import ApiKey, PlaintextKey, Service
from api.gateway.errors import GatewayError
from api.gateway.file_search import search
from api.gateway.files_routes import get_retrieval
from api.gateway.generation import CleanupStreamingResponse, request_id, unless_disconnected
from api.gateway.lifecycle import RequestLifecycle
from api.gateway.responses_routes import remember, start_turn
from api.gateway.service import GatewayService
from api.gateway.vector_stores import GatewayRetrieval
from api.store.repo import KeyRecord
from protocol.openai.chat import chat_body, chat_events, plan_chat
from protocol.openai.completions import completion_body, completion_events, plan_completion
from protocol.openai.file_search import file_search_tool, search_query
from protocol.openai.responses import responses_body, responses_events
from protocol.openai.responses_request import ResponsesRequest, to_chat
from protocol.openai.runner import Streams
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
def list_models(key: ApiKey, service: Service) -> dict:
    return {"object": "list", "data": [_model_card(m, key) for m in service.catalog.models_for(key)]}


@router.get("/v1/models/{model:path}")
def retrieve_model(model: str, key: ApiKey, service: Service) -> dict:
    """One model as /v1/models lists it; a model the key may not see, or that no ready worker holds,
    is OpenAI's 404 (the same answer whether it belongs to another tenant or does not exist)."""
    if model not in service.catalog.models_for(key):
        raise not_found(model)
    return _model_card(model, key)


# JSON, or server-sent events with "stream": true.
_STREAMABLE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/json": {}, "text/event-stream": {}}}}
Render = Callable[[Streams, dict[str, Any]], Awaitable[dict[str, Any]]]
RenderEvents = Callable[[Streams, dict[str, Any]], AsyncIterator[bytes]]


def _plaintext(service: GatewayService, key: KeyRecord, model: str) -> dict[str, float]:
    """The model's rollout split, for a caller allowed to send plaintext to it."""
    split = service.catalog.resolve(key, model)
    service.check_plaintext_allowed(key)
    return split


async def _answer(request: Request, service: GatewayService, life: RequestLifecycle, split: dict[str, float],
                  requests: list[worker_pb2.GenerateRequest], affinity: str, base: dict[str, Any], stream: bool,
                  body: Render, events: RenderEvents) -> JSONResponse | CleanupStreamingResponse:
    """Every plaintext surface's one shape: its lifecycle opens the choices, then a JSON body or events."""
    streams = await unless_disconnected(request.receive, life.start(
        [service.stream(life.key, life.model, split, r, affinity, life.span) for r in requests]))
    base = {"id": base["id"], "created": int(time.time()), "model": life.model, **base,
            **_tee(service, life.key.tenant, life.model)}
    if not stream:
        return JSONResponse(await unless_disconnected(request.receive, body(streams, base)))
    return CleanupStreamingResponse(events(streams, base), life.settle, media_type="text/event-stream",
                                    headers={"Cache-Control": "no-store"})


@router.post("/v1/chat/completions", response_model=None, responses=_STREAMABLE)
async def chat_completions(req: ChatCompletionRequest, request: Request, key: ApiKey,
                           service: Service) -> JSONResponse | CleanupStreamingResponse:
    split, rid = _plaintext(service, key, req.model), request_id()
    plan = plan_chat(req, rid=rid, tenant=key.tenant, key_id=key.key_id, agent_killed=key.tools_killed,
                     default_max_tokens=service.settings.default_max_tokens)
    reserved = _reserve(plan.reserve_chars, plan.requests[0].params.max_tokens, req.n)
    life = RequestLifecycle.begin(service, request.headers, key, req.model, request_id=rid, reserved_tokens=reserved,
                                  priority=req.priority, streams=req.n, stream=bool(req.stream))
    return await _answer(request, service, life, split, plan.requests, plan.affinity, {"id": f"chatcmpl-{rid}"},
                         bool(req.stream), lambda s, base: chat_body(req, plan, life, s, base),
                         lambda s, base: chat_events(req, plan, life, s, base))


@router.post("/v1/responses", response_model=None, responses=_STREAMABLE)
async def responses(req: ResponsesRequest, request: Request, key: ApiKey, service: Service,
                    retrieval: GatewayRetrieval = Depends(get_retrieval)) -> JSONResponse | CleanupStreamingResponse:
    """OpenAI's Responses API over the chat pipeline (protocol/openai/responses*.py); stored
    responses and previous_response_id: api/gateway/responses_routes.py; the file_search tool:
    api/gateway/file_search.py (the passages join the chat request before the worker sees it)."""
    tool = file_search_tool(req.tools)
    chat = to_chat(req, file_search=tool is not None)
    split, rid = _plaintext(service, key, req.model), request_id()
    turn = start_turn(service, key, req)  # the stored history it continues, and whether it is stored
    split = turn.pinned_split(split)
    grounding = None
    if tool is not None:
        grounding = await search(retrieval, key, tool, search_query(chat.messages), req.include)
        chat = grounding.ground(chat, after_instructions=bool(req.instructions))
    plan = plan_chat(chat, rid=rid, tenant=key.tenant, key_id=key.key_id, agent_killed=key.tools_killed,
                     default_max_tokens=service.settings.default_max_tokens)
    turn.attach(plan.requests)
    life = RequestLifecycle.begin(
        service, request.headers, key, req.model, request_id=rid, priority=chat.priority, stream=bool(req.stream),
        reserved_tokens=_reserve(plan.reserve_chars, plan.requests[0].params.max_tokens, 1))

    async def body(streams: Streams, base: dict[str, Any]) -> dict[str, Any]:
        doc = responses_body(req, await chat_body(chat, plan, life, streams, base), base, grounding)
        await remember(service, turn, split, doc)
        return doc

    base = {"id": f"chatcmpl-{rid}", "store": turn.store,
            "conversation": turn.conversation.id if turn.conversation else None}
    return await _answer(request, service, life, split, plan.requests, plan.affinity, base, bool(req.stream), body,
                         lambda s, b: responses_events(req, chat_events(chat, plan, life, s, b), b,
                                                       finished=lambda doc: remember(service, turn, split, doc),
                                                       grounding=grounding))


@router.post("/v1/completions", response_model=None, responses=_STREAMABLE)
async def completions(req: CompletionRequest, request: Request, key: ApiKey,
                      service: Service) -> JSONResponse | CleanupStreamingResponse:
    split = _plaintext(service, key, req.model)
    prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
    if not prompts or any(not p for p in prompts):
        raise GatewayError(400, "prompt must not be empty", param="prompt")
    limit, choices = service.settings.max_choices, len(prompts) * req.n
    if choices > limit:
        # Each prompt x choice is a stream on a worker: bounded per request, refused before anything is built.
        raise GatewayError(400, f"too many choices: {len(prompts)} prompts x n={req.n} exceeds {limit} per request",
                           param="n", code="invalid_value")
    rid = request_id()
    plan = plan_completion(req, rid=rid, tenant=key.tenant, key_id=key.key_id)
    reserved = _reserve(sum(map(len, prompts)), resolve_max_tokens(req.max_tokens, "completions"), choices)
    life = RequestLifecycle.begin(service, request.headers, key, req.model, request_id=rid, reserved_tokens=reserved,
                                  priority=req.priority, streams=choices, stream=bool(req.stream))
    return await _answer(request, service, life, split, plan.requests, plan.affinity,
                         {"id": f"cmpl-{rid}", "object": "text_completion"}, bool(req.stream),
                         lambda s, base: completion_body(req, plan, life, s, base),
                         lambda s, base: completion_events(req, plan, life, s, base))


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, key: PlaintextKey, service: Service) -> dict:
    """vLLM's /tokenize: the ids the model would see (tokenized in the worker, which holds the tokenizer)."""
    split = service.catalog.resolve(key, req.model)
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
async def detokenize(req: DetokenizeRequest, key: PlaintextKey, service: Service) -> dict:
    """vLLM's /detokenize: the text of token ids (out-of-vocabulary ids are a 400)."""
    split = service.catalog.resolve(key, req.model)
    reply = await service.call(key, req.model, split, "Detokenize", worker_pb2.DetokenizeRequest(
        tenant=key.tenant, key_id=key.key_id, tokens=req.tokens))
    return {"prompt": reply.prompt}


@router.get("/v1/usage")
def usage(key: ApiKey, service: Service) -> dict:
    rows = service.store.usage_summary(key.tenant)
    totals = {f: sum(r[f] for r in rows) for f in ("requests", "prompt_tokens", "completion_tokens",
                                                   "worker_seconds")}
    return {"object": "usage", "tenant": key.tenant, "totals": totals, "by_key": rows}


def _published(path: Path | None, missing: str) -> JSONResponse:
    if path is None or not path.exists():
        raise GatewayError(404, missing, code="not_found")
    return JSONResponse(json.loads(path.read_text()), headers={"Cache-Control": "max-age=60"})


@router.get("/.well-known/jwks.json")
def broker_jwks(service: Service) -> JSONResponse:
    """The key broker's token keys, so a client can check `/.well-known/attestation` from the gateway
    alone. Serving them adds no trust: a client pins the broker's issuer and reference values."""
    return _published(service.settings.broker_jwks, "this gateway has no key broker JWKS configured")


@router.get("/.well-known/reference-values")
def reference_values(service: Service) -> JSONResponse:
    """The operator's signed in-toto statement of the measurements a worker may have (served as is;
    a client checks it against the publisher key it pins)."""
    return _published(service.settings.reference_values, "this gateway publishes no reference values")


@router.get("/.well-known/attestation")
async def well_known_attestation(key: ApiKey, service: Service) -> dict:
    """The evidence of the workers serving the caller's models: an API key is needed, so that an
    anonymous caller cannot list which tenants and models this deployment serves."""
    return {"workers": await service.enrolment.attestation(key)}
