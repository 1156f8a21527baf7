"""Sealed mode in the worker: open the sealed request, answer it as the gateway would, seal the answer.

The OpenAI layer (protocol/openai) runs here instead of in the gateway, over this worker's own
engine, so the gateway relays only ciphertext. Every answer ends with a receipt signed by the
worker's attested usage key. Errors before the request opens are gRPC errors the gateway can map
(the gateway learns nothing it did not already have); errors after it are sealed inner responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from pydantic import ValidationError

from enclave_worker.server import WorkerState, serving
from protocol.openai.chat import chat_body, chat_events, plan_chat
from protocol.openai.completions import completion_body, completion_events, plan_completion
from protocol.openai.errors import OpenAIError, error_body
from protocol.openai.runner import ChoiceResult, Streams, collect_choice, merge_streams, prepend
from protocol.openai.schemas import ChatCompletionRequest, CompletionRequest
from protocol.rpc import worker_pb2
from protocol.sampling import DEFAULT_MAX_TOKENS
from protocol.sealed import (
    OpenedRequest,
    Receipt,
    RequestContext,
    RequestReplayed,
    SealedError,
    WrongWorkerKey,
    open_request,
    sign_receipt,
)
from protocol.sealed.http import ENDPOINTS, ResponseHead

Generate = Callable[[worker_pb2.GenerateRequest], AsyncIterator[worker_pb2.GenerateChunk]]


class SealedRefusal(Exception):
    def __init__(self, grpc_code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.grpc_code, self.message = grpc_code, message


def open_sealed_request(state: WorkerState, request: worker_pb2.SealedRequest) -> OpenedRequest:
    s = state.settings
    if not serving(state):
        raise SealedRefusal(grpc.StatusCode.UNAVAILABLE, "model unavailable")
    if request.endpoint not in ENDPOINTS:
        raise SealedRefusal(grpc.StatusCode.INVALID_ARGUMENT, "sealed request for an unknown endpoint")
    if (request.tenant, request.model) != (s.tenant, s.model):
        raise SealedRefusal(grpc.StatusCode.INVALID_ARGUMENT, "sealed request for another tenant or model")
    ctx = RequestContext(tenant=request.tenant, model=request.model, endpoint=request.endpoint,
                         key_id=request.worker_key_id)
    try:
        return open_request(state.serving_key, ctx, request.body, time.time(), state.replay)
    except WrongWorkerKey as exc:
        # The client pinned a key this worker does not hold: it must verify the deployment again.
        raise SealedRefusal(grpc.StatusCode.FAILED_PRECONDITION, "sealed to another worker key; re-attest") from exc
    except RequestReplayed as exc:
        raise SealedRefusal(grpc.StatusCode.ALREADY_EXISTS, str(exc)) from exc
    except SealedError as exc:
        raise SealedRefusal(grpc.StatusCode.INVALID_ARGUMENT,
                            f"sealed request rejected ({type(exc).__name__})") from exc


class LocalRun:
    """The OpenAI layer's choice runner over this worker's engine (the gateway's is api/gateway/generation.Run)."""

    def __init__(self, generate: Generate) -> None:
        self._generate = generate
        self._streams: list[AsyncIterator[worker_pb2.GenerateChunk]] = []
        self.tokens: dict[int, tuple[int, int]] = {}

    async def start(self, requests: list[worker_pb2.GenerateRequest]) -> Streams:
        self._streams = [self._generate(r) for r in requests]
        try:
            firsts = await asyncio.gather(*(anext(s) for s in self._streams))
        except BaseException:
            await self.close()
            raise
        return [prepend(f, s) for f, s in zip(firsts, self._streams, strict=True)]

    def _account(self, i: int, chunk: worker_pb2.GenerateChunk) -> None:
        if chunk.finish_reason:
            self.tokens[i] = (chunk.prompt_tokens, chunk.completion_tokens)

    async def collect(self, streams: Streams) -> list[ChoiceResult]:
        try:
            return list(await asyncio.gather(*(self._collect_one(i, s) for i, s in enumerate(streams))))
        finally:
            await self.close()

    async def _collect_one(self, i: int, stream: AsyncIterator[worker_pb2.GenerateChunk]) -> ChoiceResult:
        return await collect_choice(stream, lambda chunk: self._account(i, chunk))

    async def merged(self, streams: Streams) -> AsyncIterator[tuple[int, worker_pb2.GenerateChunk]]:
        async with contextlib.aclosing(merge_streams(streams)) as merged:
            async for i, chunk in merged:
                self._account(i, chunk)
                yield i, chunk

    async def close(self) -> None:
        for s in self._streams:
            await s.aclose()  # type: ignore[attr-defined]


def _validation_message(exc: ValidationError) -> OpenAIError:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return OpenAIError(400, "request body is not valid JSON", code="invalid_json")
    first = errors[0] if errors else {}
    param = ".".join(str(p) for p in first.get("loc", ())) or None
    message = f"invalid request: {param}: {first.get('msg', 'invalid value')}" if param else "invalid request"
    return OpenAIError(400, message, code="invalid_value", param=param)


async def _inner_answer(state: WorkerState, generate: Generate, request: worker_pb2.SealedRequest, body: bytes,
                        run: LocalRun) -> tuple[ResponseHead, AsyncIterator[bytes]]:
    """The inner HTTP answer, exactly as the gateway gives it in plaintext mode."""
    s, rid = state.settings, request.request_id
    chat = request.endpoint == "/v1/chat/completions"
    try:
        req: Any = (ChatCompletionRequest if chat else CompletionRequest).model_validate_json(body)
    except ValidationError as exc:
        raise _validation_message(exc) from exc
    if req.model != request.model:
        raise OpenAIError(400, "the body names another model than the sealed request", param="model")
    tee = {"tee": s.tee, "insecure": s.insecure, "system_fingerprint": f"sealed-{s.tee}"}
    if chat:
        plan: Any = plan_chat(req, rid=rid, tenant=request.tenant, key_id=request.key_id,
                              agent_killed=request.agent_killed, default_max_tokens=DEFAULT_MAX_TOKENS)
        base = {"id": f"chatcmpl-{rid}", "created": int(time.time()), "model": req.model, **tee}
        body_fn, events_fn = chat_body, chat_events
    else:
        plan = plan_completion(req, rid=rid, tenant=request.tenant, key_id=request.key_id)
        base = {"id": f"cmpl-{rid}", "created": int(time.time()), "model": req.model, "object": "text_completion",
                **tee}
        body_fn, events_fn = completion_body, completion_events
    streams = await run.start(plan.requests)
    if req.stream:
        return ResponseHead(200, "text/event-stream"), events_fn(req, plan, run, streams, base)

    # Not streamed: the whole answer first, so a failure is its status, as in plaintext mode.
    return ResponseHead(200, "application/json"), _single(json.dumps(await body_fn(req, plan, run, streams,
                                                                                   base)).encode())


async def answer_sealed(state: WorkerState, generate: Generate, request: worker_pb2.SealedRequest,
                        opened: OpenedRequest) -> AsyncIterator[worker_pb2.SealedChunk]:
    s, sealer, started = state.settings, opened.sealer, time.monotonic()
    run = LocalRun(generate)
    try:
        try:
            head, parts = await _inner_answer(state, generate, request, opened.body, run)
        except OpenAIError as exc:
            head, parts = ResponseHead(exc.status, "application/json"), _single(
                json.dumps(error_body(exc.message, exc.type, exc.code, exc.param)).encode())
        # The head travels with the first body part (the first token's event, or the whole answer): one
        # gRPC message and one HTTP write fewer before the client sees its first token.
        rest = aiter(parts)
        first = await anext(rest, None)
        opening = sealer.header() + sealer.seal(head.encode())
        yield worker_pb2.SealedChunk(data=opening if first is None else opening + sealer.seal(first))
        async for part in rest:
            yield worker_pb2.SealedChunk(data=sealer.seal(part))
    finally:
        await run.close()
    prompt = sum(p for p, _ in run.tokens.values())
    completion = sum(c for _, c in run.tokens.values())
    booted, guard = state.booted, state.guard
    receipt = Receipt(
        request_sha256=opened.request_sha256, response_sha256=sealer.hash.hexdigest(),
        worker_key_id=state.serving_key.key_id, tenant=s.tenant, model=s.model, model_version=s.version,
        model_digest=booted.model_digest if booted else "", policy_version=(
            guard.policy_set.version if guard and guard.policy_set else 0),
        prompt_tokens=prompt, completion_tokens=completion, tee=s.tee, insecure=s.insecure,
        issued_at=time.time())
    final = worker_pb2.SealedChunk(data=sealer.seal(sign_receipt(receipt, state.usage_key), final=True))
    final.usage.CopyFrom(state.sign_usage({
        "request_id": request.request_id, "tenant": request.tenant, "key_id": request.key_id,
        "model": s.model, "version": s.version, "prompt_tokens": prompt, "completion_tokens": completion,
        "worker_seconds": round(time.monotonic() - started, 6), "at": time.time()}))
    yield final


async def _single(data: bytes) -> AsyncIterator[bytes]:
    yield data
