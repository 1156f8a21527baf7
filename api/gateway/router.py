"""OpenAI-compatible routes. Responses from a simulated TEE say so in every body and chunk."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from api.gateway import openai_format as fmt
from api.gateway.dependencies import current_key, get_service
from api.gateway.errors import GatewayError, error_body
from api.gateway.generation import CleanupStreamingResponse, Run, request_id, unless_disconnected
from api.gateway.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    SamplingFields,
    TokenizeRequest,
)
from api.gateway.service import GatewayService
from api.proto import worker_pb2
from api.store.repo import KeyRecord

router = APIRouter()


def _params(req: SamplingFields, max_tokens: int, logprobs: int | None, extra_stop: list[str], index: int
            ) -> worker_pb2.SamplingParams:
    p = worker_pb2.SamplingParams(max_tokens=max_tokens, temperature=1.0 if req.temperature is None else
                                  req.temperature, top_p=1.0 if req.top_p is None else req.top_p,
                                  stop=req.stop_list() + extra_stop, ignore_eos=req.ignore_eos)
    if req.seed is not None:
        # n > 1 with a seed: distinct yet reproducible choices (wrapping within int64, the wire type).
        p.seed = (req.seed + index + (1 << 63)) % (1 << 64) - (1 << 63)
    if logprobs is not None:
        p.logprobs = logprobs
    return p


def _tee(service: GatewayService, tenant: str, model: str) -> dict[str, Any]:
    workers = service.registry.ready(tenant, model)
    insecure = any(w.insecure for w in workers) or not workers
    tee = workers[0].tee if workers else "unknown"
    return {"tee": tee, "insecure": insecure, "system_fingerprint": f"sealed-{tee}"}


def _usage(results: list[Any]) -> dict[str, int]:
    p = max((r.prompt_tokens for r in results), default=0)
    c = sum(r.completion_tokens for r in results)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _reserve(text_len: int, max_tokens: int, n: int) -> int:
    return text_len // 3 + max_tokens * n  # worst-case estimate; the unused part is given back


def _sse_bytes(doc: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(doc)}\n\n".encode()


@router.get("/v1/models")
def list_models(key: KeyRecord = Depends(current_key), service: GatewayService = Depends(get_service)) -> dict:
    return {"object": "list", "data": [
        {"id": m, "object": "model", "created": 0, "owned_by": key.tenant} for m in service.models_for(key)]}


# JSON, or server-sent events with "stream": true.
_STREAMABLE = {200: {"content": {"application/json": {}, "text/event-stream": {}}}}


@router.post("/v1/chat/completions", response_model=None, responses=_STREAMABLE)
async def chat_completions(req: ChatCompletionRequest, request: Request, key: KeyRecord = Depends(current_key),
                           service: GatewayService = Depends(get_service)):  # type: ignore[no-untyped-def]
    split = service.resolve(key, req.model)
    max_tokens = req.max_completion_tokens or req.max_tokens or service.settings.default_max_tokens
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else req.tool_choice
    use_tools = bool(tools) and choice != "none"
    prefix, extra_stop = (fmt.tool_prefix(choice) if use_tools else ""), []
    if isinstance(choice, dict) and use_tools:
        tools = [t for t in tools if t["function"]["name"] == choice["function"].get("name")]
        if not tools:
            raise GatewayError(400, "tool_choice names a function that is not in tools", param="tool_choice")
        extra_stop = ["</tool_call>"]
    json_mode = req.response_format is not None and req.response_format.type != "text" and not use_tools
    if json_mode:
        hint = fmt.JSON_SYSTEM
        if req.response_format and req.response_format.json_schema:
            hint += " It must follow this JSON schema: " + json.dumps(req.response_format.json_schema.get("schema"))
        messages = [{"role": "system", "content": hint}, *messages]
        prefix = "{"
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    rid = request_id()
    requests = [worker_pb2.GenerateRequest(
        request_id=f"{rid}-{i}", tenant=key.tenant, key_id=key.key_id, kind="chat", agent_killed=key.tools_killed,
        messages_json=json.dumps(messages, ensure_ascii=False),
        tools_json=json.dumps(tools, ensure_ascii=False) if use_tools else "",
        assistant_prefix=prefix, params=_params(req, max_tokens, logprobs, extra_stop, i)) for i in range(req.n)]
    ticket = service.ticket(key, _reserve(len(requests[0].messages_json), max_tokens, req.n), req.priority,
                            streams=req.n)
    run = Run(service, key, req.model, ticket)
    streams = await unless_disconnected(request.receive,
                                        run.start(split, requests, affinity=json.dumps(messages[:2])[:4096]))
    base = {"id": f"chatcmpl-{rid}", "created": int(time.time()), "model": req.model,
            **_tee(service, key.tenant, req.model)}
    names = {t["function"]["name"] for t in tools}

    def finish(text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        if use_tools:
            content, calls = fmt.parse_tool_calls(prefix + text, names)
            if calls:
                return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
            return {"role": "assistant", "content": text}, reason
        if json_mode:
            return {"role": "assistant", "content": fmt.coerce_json(prefix + text)}, reason
        return {"role": "assistant", "content": text}, reason

    if not req.stream:
        results = await unless_disconnected(request.receive, run.collect(streams))
        choices = []
        for i, r in enumerate(results):
            message, reason = finish(r.text, r.finish_reason)
            choices.append({"index": i, "message": {**message, "refusal": None}, "finish_reason": reason,
                            "logprobs": fmt.chat_logprobs(r.logprobs) if req.logprobs else None})
        return JSONResponse({**base, "object": "chat.completion", "choices": choices, "usage": _usage(results)})

    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    # Forced tool calls and JSON mode: the answer's shape is only known at its end. Tools on `auto`:
    # text streams until a <tool_call> marker could be starting, then the rest waits for the end.
    buffered = bool(prefix)

    async def events() -> AsyncIterator[bytes]:
        chunk_base = {**base, "object": "chat.completion.chunk"}
        texts, sent, results = [""] * req.n, [0] * req.n, [worker_pb2.GenerateChunk()] * req.n
        for i in range(req.n):
            yield _sse_bytes({**chunk_base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                         "finish_reason": None, "logprobs": None}]})
        try:
            async for i, out in run.merged(streams):
                results[i] = out
                texts[i] += out.text
                lp = fmt.chat_logprobs(list(out.logprobs)) if req.logprobs else None
                if not buffered and not out.finish_reason:
                    upto = fmt.streamable_len(texts[i]) if use_tools else len(texts[i])
                    if upto > sent[i] or lp:
                        yield _sse_bytes({**chunk_base, "choices": [{"index": i, "delta": {
                            "content": texts[i][sent[i]:upto]}, "finish_reason": None, "logprobs": lp}]})
                        sent[i] = max(sent[i], upto)
                elif out.finish_reason:
                    message, reason = finish(texts[i], out.finish_reason)
                    message.pop("role")
                    if "tool_calls" in message:
                        message["tool_calls"] = [{"index": j, **c} for j, c in enumerate(message["tool_calls"])]
                        message.pop("content", None)
                    elif not buffered:
                        message["content"] = texts[i][sent[i]:]
                    yield _sse_bytes({**chunk_base, "choices": [{"index": i, "delta": message,
                                                                 "finish_reason": reason, "logprobs": lp}]})
        except GatewayError as exc:
            yield _sse_bytes(error_body(exc.message, exc.type, exc.code))
            return
        finally:
            await run.close()
        if include_usage:
            yield _sse_bytes({**chunk_base, "choices": [], "usage": _usage(results)})
        yield b"data: [DONE]\n\n"

    return CleanupStreamingResponse(events(), run.close, media_type="text/event-stream",
                                    headers={"Cache-Control": "no-store"})


@router.post("/v1/completions", response_model=None, responses=_STREAMABLE)
async def completions(req: CompletionRequest, request: Request, key: KeyRecord = Depends(current_key),
                      service: GatewayService = Depends(get_service)):  # type: ignore[no-untyped-def]
    split = service.resolve(key, req.model)
    prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
    if not prompts or any(not p for p in prompts):
        raise GatewayError(400, "prompt must not be empty", param="prompt")
    limit = service.settings.max_choices
    if len(prompts) * req.n > limit:
        # Each prompt x choice is a stream on a worker: bounded per request, refused before anything is built.
        raise GatewayError(400, f"too many choices: {len(prompts)} prompts x n={req.n} exceeds {limit} per request",
                           param="n", code="invalid_value")
    max_tokens = req.max_tokens or 16
    # The whole worst case is charged (and refused if it can never fit) before any stream is built.
    ticket = service.ticket(key, _reserve(sum(map(len, prompts)), max_tokens, len(prompts) * req.n), req.priority,
                            streams=len(prompts) * req.n)
    rid = request_id()
    requests = [worker_pb2.GenerateRequest(
        request_id=f"{rid}-{pi}-{j}", tenant=key.tenant, key_id=key.key_id, kind="completion", prompt=prompt,
        params=_params(req, max_tokens, req.logprobs, [], j)) for pi, prompt in enumerate(prompts)
        for j in range(req.n)]
    run = Run(service, key, req.model, ticket)
    streams = await unless_disconnected(request.receive, run.start(split, requests, affinity=prompts[0][:4096]))
    base = {"id": f"cmpl-{rid}", "created": int(time.time()), "model": req.model, "object": "text_completion",
            **_tee(service, key.tenant, req.model)}

    def echo(i: int) -> str:
        return prompts[i // req.n] if req.echo else ""

    if not req.stream:
        results = await unless_disconnected(request.receive, run.collect(streams))
        choices = [{"index": i, "text": echo(i) + r.text, "finish_reason": r.finish_reason,
                    "logprobs": fmt.completion_logprobs(r.logprobs, len(echo(i))) if req.logprobs is not None
                    else None} for i, r in enumerate(results)]
        usage = _usage(results)
        usage["prompt_tokens"] = sum({i // req.n: r.prompt_tokens for i, r in enumerate(results)}.values())
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return JSONResponse({**base, "choices": choices, "usage": usage})

    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def events() -> AsyncIterator[bytes]:
        results, started = [worker_pb2.GenerateChunk()] * len(requests), set()
        try:
            async for i, out in run.merged(streams):
                results[i] = out
                text = out.text if i in started else echo(i) + out.text
                started.add(i)
                lp = fmt.completion_logprobs(list(out.logprobs)) if req.logprobs is not None else None
                yield _sse_bytes({**base, "choices": [{"index": i, "text": text, "logprobs": lp,
                                                       "finish_reason": out.finish_reason or None}]})
        except GatewayError as exc:
            yield _sse_bytes(error_body(exc.message, exc.type, exc.code))
            return
        finally:
            await run.close()
        if include_usage:
            yield _sse_bytes({**base, "choices": [], "usage": _usage(results)})
        yield b"data: [DONE]\n\n"

    return CleanupStreamingResponse(events(), run.close, media_type="text/event-stream",
                                    headers={"Cache-Control": "no-store"})


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, key: KeyRecord = Depends(current_key),
                   service: GatewayService = Depends(get_service)) -> dict:
    """vLLM's /tokenize: the ids the model would see (tokenized in the worker, which holds the tokenizer)."""
    split = service.resolve(key, req.model)
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


@router.get("/.well-known/attestation")
async def well_known_attestation(key: KeyRecord = Depends(current_key),
                                 service: GatewayService = Depends(get_service)) -> dict:
    """The evidence of the workers serving the caller's models: an API key is needed, so that an
    anonymous caller cannot list which tenants and models this deployment serves."""
    return {"workers": await service.attestation(key)}
