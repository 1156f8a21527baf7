"""OpenAI-compatible routes. Responses from a simulated TEE say so in every body and chunk."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, StreamingResponse

from api.gateway.dependencies import current_key, get_service
from api.gateway.errors import GatewayError, error_body
from api.gateway.keys import ApiKey
from api.gateway.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from api.gateway.service import GatewayService

router = APIRouter()
DEFAULT_MAX_TOKENS = 256


def _params(req: SamplingFields, max_tokens: int | None) -> dict[str, Any]:
    return {
        "max_tokens": max_tokens or DEFAULT_MAX_TOKENS,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "seed": req.seed,
        "stop": req.stop_list(),
    }


def _tee_fields(status: dict[str, Any]) -> dict[str, Any]:
    return {"tee": status.get("tee", "unknown"), "insecure": bool(status.get("insecure", True))}


def _usage(last: dict[str, Any]) -> dict[str, int]:
    p, c = int(last.get("prompt_tokens", 0)), int(last.get("completion_tokens", 0))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


@router.get("/v1/models")
def list_models(key: ApiKey = Depends(current_key), service: GatewayService = Depends(get_service)) -> dict:
    return {"object": "list", "data": [
        {"id": r.model, "object": "model", "created": 0, "owned_by": r.tenant} for r in service.models_for(key)
    ]}


async def _run(service: GatewayService, key: ApiKey, model: str, body: dict[str, Any]
               ) -> tuple[AsyncIterator[dict[str, Any]], dict[str, Any]]:
    route, status = await service.pick_worker(service.resolve(key, model))
    body = {"request_id": secrets.token_hex(12), "tenant": key.tenant, **body}
    return await service.generate(route, body), status


def _sse(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n".encode()
        except GatewayError as exc:
            yield f"data: {json.dumps(error_body(exc.message, exc.type, exc.code))}\n\n".encode()
            return
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(req: ChatCompletionRequest, key: ApiKey = Depends(current_key),
                           service: GatewayService = Depends(get_service)) -> JSONResponse | StreamingResponse:
    params = _params(req, req.max_completion_tokens or req.max_tokens)
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    stream, status = await _run(service, key, req.model,
                                {"kind": "chat", "messages": messages, "tools": req.tools, "params": params})
    cid, created, tee = f"chatcmpl-{secrets.token_hex(12)}", int(time.time()), _tee_fields(status)
    base = {"id": cid, "created": created, "model": req.model, "system_fingerprint": f"sealed-{tee['tee']}", **tee}
    if not req.stream:
        text, last = [], {}
        async for out in stream:
            text.append(out["text"])
            last = out
        return JSONResponse({**base, "object": "chat.completion", "usage": _usage(last), "choices": [{
            "index": 0, "message": {"role": "assistant", "content": "".join(text)},
            "finish_reason": last.get("finish_reason"), "logprobs": None}]})
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        first, last = True, {}
        async for out in stream:
            delta: dict[str, Any] = {"content": out["text"]}
            if first:
                delta["role"], first = "assistant", False
            last = out
            yield {**base, "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": delta, "finish_reason": out.get("finish_reason"), "logprobs": None}]}
        if include_usage:
            yield {**base, "object": "chat.completion.chunk", "choices": [], "usage": _usage(last)}

    return _sse(chunks())


@router.post("/v1/completions", response_model=None)
async def completions(req: CompletionRequest, key: ApiKey = Depends(current_key),
                      service: GatewayService = Depends(get_service)) -> JSONResponse | StreamingResponse:
    params = _params(req, req.max_tokens or 16)
    stream, status = await _run(service, key, req.model, {"kind": "completion", "prompt": req.prompt,
                                                            "params": params})
    tee = _tee_fields(status)
    base = {"id": f"cmpl-{secrets.token_hex(12)}", "created": int(time.time()), "model": req.model,
            "object": "text_completion", "system_fingerprint": f"sealed-{tee['tee']}", **tee}
    if not req.stream:
        text, last = [], {}
        async for out in stream:
            text.append(out["text"])
            last = out
        return JSONResponse({**base, "usage": _usage(last), "choices": [{
            "index": 0, "text": "".join(text), "finish_reason": last.get("finish_reason"), "logprobs": None}]})
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        last: dict[str, Any] = {}
        async for out in stream:
            last = out
            yield {**base, "choices": [{"index": 0, "text": out["text"], "finish_reason": out.get("finish_reason"),
                                        "logprobs": None}]}
        if include_usage:
            yield {**base, "choices": [], "usage": _usage(last)}

    return _sse(chunks())


@router.get("/.well-known/attestation")
async def well_known_attestation(service: GatewayService = Depends(get_service)) -> dict:
    return {"workers": await service.attestation()}


@router.get("/healthz")
def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz", response_model=None)
async def readyz(service: GatewayService = Depends(get_service)) -> JSONResponse:
    states = [(await service.worker_status(r)).get("status") for r in service.settings.workers]
    ready = bool(states) and any(s == "ready" for s in states)
    return JSONResponse(status_code=200 if ready else 503, content={"ready": ready, "workers": states})
