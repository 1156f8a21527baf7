"""The OpenAI layer (`protocol/openai`) over this worker's own request pipeline, for sealed mode.

In plaintext mode the gateway runs the OpenAI layer and sends the worker one `GenerateRequest` per
choice; in sealed mode the worker runs the same layer itself, and each choice goes through the
same pipeline (`enclave_worker/answer.py`) the plaintext RPC uses, so both answer alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

from pydantic import ValidationError

from enclave_worker.answer import Answer
from enclave_worker.embedding import embeddings_document
from enclave_worker.retrieval.service import RetrievalService
from enclave_worker.sealed_conversation import conversation_call
from enclave_worker.sealed_read import read_stored
from enclave_worker.sealed_retrieval import RetrievalAnswer, retrieval_answer
from enclave_worker.sealed_state import SealedTurn, begin_sealed_turn
from enclave_worker.stage_times import StageTimes
from enclave_worker.state import WorkerState
from protocol.openai.chat import chat_body, chat_events, plan_chat
from protocol.openai.completions import completion_body, completion_events, plan_completion
from protocol.openai.embeddings import EmbeddingsRequest
from protocol.openai.errors import OpenAIError
from protocol.openai.responses import responses_body, responses_events
from protocol.openai.responses_request import ResponsesRequest, to_chat
from protocol.openai.runner import ChoiceResult, Streams, collect_choice, merge_streams, prepend
from protocol.openai.schemas import ChatCompletionRequest, CompletionRequest
from protocol.rpc import worker_pb2
from protocol.sampling import DEFAULT_MAX_TOKENS
from protocol.sealed.http import CONVERSATIONS, RETRIEVAL_ENDPOINTS, STORED_READ, ResponseHead

R = TypeVar("R", ChatCompletionRequest, CompletionRequest, ResponsesRequest, EmbeddingsRequest)


class LocalRun:
    """The OpenAI layer's choice runner over this worker's pipeline (the gateway's is
    api/gateway/generation.Run, over workers)."""

    def __init__(self, state: WorkerState, timed: bool = False, retrieval: RetrievalService | None = None) -> None:
        self.state = state
        self.retrieval = retrieval  # an encoder's worker: its files and vector stores (sealed_retrieval.py)
        self.retrieved: RetrievalAnswer | None = None  # a sealed upload's or search's answer
        # Signed decisions not of a choice (a sealed embeddings call's data controls, a search's retrievals).
        self.recorded: list[worker_pb2.UsageRecord] = []
        self.timed = timed  # stamp each choice's stages for traces (stage_times.py)
        self._answers: list[Answer] = []
        self._streams: list[AsyncGenerator[worker_pb2.GenerateChunk, None]] = []
        self.tokens: dict[int, tuple[int, int]] = {}
        self.turn: SealedTurn | None = None  # a sealed /v1/responses request's stored state
        self.conversation_call: worker_pb2.StateBlob | None = None  # a conversation call's new state

    @property
    def decisions(self) -> tuple[worker_pb2.UsageRecord, ...]:
        """What the pipeline signed for every choice that ended (answered or refused)."""
        return (*(d for a in self._answers for d in a.decisions), *self.recorded)

    def decisions_so_far(self) -> tuple[worker_pb2.UsageRecord, ...]:
        """Every choice's signed decisions, also of choices cut short (the client left)."""
        return (*(d for a in self._answers for d in a.decisions_so_far()), *self.recorded)

    def timings(self) -> list[StageTimes]:
        return [a.timing for a in self._answers if a.timing is not None]

    def progress(self) -> tuple[int, int]:
        """(prompt, completion) tokens the engine has run so far for all choices."""
        runs = [a.progress for a in self._answers if a.progress is not None]
        return sum(p for p, _ in runs), sum(c for _, c in runs)

    async def start(self, requests: list[worker_pb2.GenerateRequest]) -> Streams:
        self._answers = [Answer(self.state, r, StageTimes() if self.timed else None) for r in requests]
        self._streams = [a.chunks() for a in self._answers]
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
            await s.aclose()


async def inner_answer(state: WorkerState, request: worker_pb2.SealedRequest, body: bytes,
                       run: LocalRun) -> tuple[ResponseHead, AsyncIterator[bytes]]:
    """The inner HTTP answer to an opened sealed request, exactly as the gateway gives it in
    plaintext mode. A request the OpenAI layer refuses raises OpenAIError."""
    s, rid = state.settings, request.request_id
    chat = request.endpoint == "/v1/chat/completions"
    tee = {"tee": s.tee, "insecure": s.insecure, "system_fingerprint": f"sealed-{s.tee}"}
    if request.endpoint == "/v1/responses":
        return await _responses(state, request, body, run, tee)
    if request.endpoint == STORED_READ:  # a stored response read back, opened here only
        head, read = read_stored(state, request, body)
        return head, single(read)
    if request.endpoint == CONVERSATIONS:  # a sealed-mode conversation, opened and sealed here only
        head, answer, run.conversation_call = conversation_call(state, request, body)
        return head, single(answer)
    if request.endpoint == "/v1/embeddings":  # an encoder's worker (enclave_worker/embedding.py)
        document, prompt_tokens = await embeddings_document(state, request, _parse(EmbeddingsRequest, body,
                                                                                   request.model), run.recorded)
        run.tokens[0] = (prompt_tokens, 0)  # what the receipt and the usage record count
        return _whole(document)
    if request.endpoint in RETRIEVAL_ENDPOINTS:  # an encoder's worker (sealed_retrieval.py)
        run.retrieved = await retrieval_answer(state, request, body, run.retrieval, _parse)
        run.recorded += run.retrieved.decisions
        return _whole(run.retrieved.document)
    if chat:
        req = _parse(ChatCompletionRequest, body, request.model)
        plan = plan_chat(req, rid=rid, tenant=request.tenant, key_id=request.key_id,
                         agent_killed=request.agent_killed, default_max_tokens=DEFAULT_MAX_TOKENS)
        base = {"id": f"chatcmpl-{rid}", "created": int(state.clock.now()), "model": req.model, **tee}
        streams = await run.start(plan.requests)
        if req.stream:
            return ResponseHead(200, "text/event-stream"), chat_events(req, plan, run, streams, base)
        # Not streamed: the whole answer first, so a failure is its status, as in plaintext mode.
        return _whole(await chat_body(req, plan, run, streams, base))
    creq = _parse(CompletionRequest, body, request.model)
    cplan = plan_completion(creq, rid=rid, tenant=request.tenant, key_id=request.key_id)
    base = {"id": f"cmpl-{rid}", "created": int(state.clock.now()), "model": creq.model,
            "object": "text_completion", **tee}
    streams = await run.start(cplan.requests)
    if creq.stream:
        return ResponseHead(200, "text/event-stream"), completion_events(creq, cplan, run, streams, base)
    return _whole(await completion_body(creq, cplan, run, streams, base))


async def _responses(state: WorkerState, request: worker_pb2.SealedRequest, body: bytes, run: LocalRun,
                     tee: dict[str, Any]) -> tuple[ResponseHead, AsyncIterator[bytes]]:
    """The Responses API over the chat pipeline, as the gateway serves it in plaintext mode; stored
    state is sealed and opened here (sealed_state.py), and the head names what was continued and kept."""
    req = _parse(ResponsesRequest, body, request.model)
    chat = to_chat(req)
    turn = begin_sealed_turn(state, request, req)
    plan = plan_chat(chat, rid=request.request_id, tenant=request.tenant, key_id=request.key_id,
                     agent_killed=request.agent_killed, default_max_tokens=DEFAULT_MAX_TOKENS)
    base = {"id": f"chatcmpl-{request.request_id}", "created": int(state.clock.now()), "model": req.model,
            "response_id": turn.response_id, "store": turn.store, **tee}
    if turn.conversation is not None:
        base["conversation"] = turn.conversation.id
    streams = await run.start(turn.continued(plan.requests))
    run.turn = turn

    async def finished(doc: dict[str, Any]) -> None:
        turn.keep(state, request.tenant, req, doc)

    head = ResponseHead(200, "application/json", turn.history_ids, turn.response_id if turn.store else "",
                        turn.conversation_head())
    if req.stream:
        head = dataclasses.replace(head, content_type="text/event-stream")
        return head, responses_events(req, chat_events(chat, plan, run, streams, base), base, finished=finished)
    doc = responses_body(req, await chat_body(chat, plan, run, streams, base), base)
    await finished(doc)  # kept before the client hears it is done, as in plaintext mode
    return head, single(json.dumps(doc).encode())


def _parse(schema: type[R], body: bytes, model: str) -> R:
    try:
        req = schema.model_validate_json(body)
    except ValidationError as exc:
        raise _validation_error(exc) from exc
    if req.model != model:
        raise OpenAIError(400, "the body names another model than the sealed request", param="model")
    return req


def _validation_error(exc: ValidationError) -> OpenAIError:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return OpenAIError(400, "request body is not valid JSON", code="invalid_json")
    if not errors:
        return OpenAIError(400, "invalid request", code="invalid_value")
    param = ".".join(str(p) for p in errors[0].get("loc", ())) or None
    message = f"invalid request: {param}: {errors[0].get('msg', 'invalid value')}" if param else "invalid request"
    return OpenAIError(400, message, code="invalid_value", param=param)


def _whole(document: dict[str, Any]) -> tuple[ResponseHead, AsyncIterator[bytes]]:
    return ResponseHead(200, "application/json"), single(json.dumps(document).encode())


async def single(data: bytes) -> AsyncIterator[bytes]:
    yield data
