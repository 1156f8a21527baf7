"""Sealed-mode routes (docs/sealed-mode.md): the gateway authenticates, admits, routes to the pinned
worker and meters, but the body it relays is ciphertext both ways. It never parses, logs or stores it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Request

from api.gateway.dependencies import ApiKey, ChargedKey, Service
from api.gateway.errors import GatewayError
from api.gateway.generation import CleanupStreamingResponse, request_id
from api.gateway.lifecycle import RequestLifecycle
from api.gateway.registry import WorkerInfo
from api.gateway.sealed_conversations import (
    conversation_history,
    conversation_route,
    keep_conversation,
    named_conversation,
)
from api.gateway.sealed_state import keep_sealed_state, previous_response, sealed_history, stored_route
from api.gateway.service import GatewayService
from api.store.repo import KeyRecord
from protocol.rpc import worker_pb2
from protocol.sealed.http import (
    CONVERSATIONS,
    HEADER_KEY_ID,
    HEADER_MODEL,
    MAX_REQUEST_BYTES,
    REQUEST_CONTENT_TYPE,
    RESPONSE_CONTENT_TYPE,
    STORED_READ,
)

router = APIRouter()


async def sealed_relay(endpoint: str, request: Request, key: KeyRecord, service: GatewayService, *,
                       routed: Callable[[worker_pb2.SealedRequest], None] | None = None,
                       final: Callable[[worker_pb2.SealedChunk], None] | None = None,
                       reserved_tokens: int | None = None,
                       missing: Callable[[WorkerInfo], Awaitable[None]] | None = None) -> CleanupStreamingResponse:
    """Relay one sealed request to its pinned worker. `routed` adds what the gateway routes by besides
    the envelope (a retrieval's ids and snapshot name: sealed_retrieval_routes.py); `final` keeps what
    the worker's final chunk leaves for the gateway, before the client hears the answer is done;
    `reserved_tokens`: what admission charges up front (default: a generation's worst case);
    `missing`: sends the worker the store snapshot a sealed search names when it lacks it."""
    if request.headers.get("content-type", "").split(";")[0].strip() != REQUEST_CONTENT_TYPE:
        raise GatewayError(415, f"sealed requests are {REQUEST_CONTENT_TYPE}", code="invalid_value")
    model, worker_key_id = request.headers.get(HEADER_MODEL, ""), request.headers.get(HEADER_KEY_ID, "")
    if not model or len(worker_key_id) != 64:
        raise GatewayError(400, f"sealed requests name the model ({HEADER_MODEL}) and the pinned worker key "
                           f"({HEADER_KEY_ID})", code="invalid_value")
    service.catalog.resolve(key, model)
    previous = previous_response(endpoint, request.headers)  # stored state: ids in clear, ciphertext only
    conversation = named_conversation(endpoint, request.headers)
    if previous is not None and conversation is not None:
        raise GatewayError(400, "previous_response_id and conversation cannot be used together",
                           param="conversation", code="invalid_value")
    body = await request.body()
    if len(body) > MAX_REQUEST_BYTES:
        raise GatewayError(413, "request body too large", code="invalid_value")
    rid = request_id()
    history = sealed_history(service, key, model, previous, endpoint) + conversation_history(service, key, model,
                                                                                            conversation)
    sealed = worker_pb2.SealedRequest(request_id=rid, tenant=key.tenant, key_id=key.key_id, model=model,
                                      endpoint=endpoint, worker_key_id=worker_key_id, body=body,
                                      agent_killed=key.tools_killed,
                                      history=history)
    if routed is not None:
        routed(sealed)
    # The gateway cannot read max_tokens: reserve the default and settle with the signed usage. Its span
    # has only what the gateway sees of a sealed request: ids, the ciphertext's size, the signed usage.
    life = RequestLifecycle.begin(service, request.headers, key, model, request_id=rid, sealed=True,
                                  reserved_tokens=(len(body) // 3 + service.settings.default_max_tokens
                                                   if reserved_tokens is None else reserved_tokens),
                                  body_bytes=len(body))
    [stream] = await life.start([service.sealed_stream(key, model, sealed, life.span, missing)])

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in stream:
                if chunk.HasField("usage"):
                    life.count(*_signed_counts(chunk.usage.payload))
                    keep_sealed_state(service, key, model, previous, chunk)  # before the client hears it is done
                    keep_conversation(service, key, model, endpoint, conversation, history, chunk)
                    if final is not None:
                        final(chunk)
                yield chunk.data
        except GatewayError:
            return  # the client sees a truncated sealed stream and reports it as such
        finally:
            await life.settle()

    return CleanupStreamingResponse(relay(), life.settle, media_type=RESPONSE_CONTENT_TYPE,
                                    headers={"Cache-Control": "no-store"})


def _signed_counts(payload: bytes) -> tuple[int, int]:
    """The prompt and completion tokens of the worker's usage record (already verified by the relay)."""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        doc = json.loads(payload)
        return int(doc["prompt_tokens"]), int(doc["completion_tokens"])
    return 0, 0


def _sealed_route(endpoint: str) -> Callable[..., Awaitable[CleanupStreamingResponse]]:
    async def sealed(request: Request, key: ApiKey, service: Service) -> CleanupStreamingResponse:
        return await sealed_relay(endpoint, request, key, service)

    return sealed


# Each OpenAI surface's sealed form: the same relay, to the endpoint the worker serves it on.
router.post("/v1/sealed/chat/completions", response_model=None)(_sealed_route("/v1/chat/completions"))
router.post("/v1/sealed/completions", response_model=None)(_sealed_route("/v1/completions"))
router.post("/v1/sealed/responses", response_model=None)(_sealed_route("/v1/responses"))
router.post("/v1/sealed/embeddings", response_model=None)(_sealed_route("/v1/embeddings"))  # an encoder's worker
router.post("/v1/sealed/responses/read", response_model=None)(_sealed_route(STORED_READ))  # a stored response
router.post("/v1/sealed/conversations/call", response_model=None)(_sealed_route(CONVERSATIONS))


@router.get("/v1/sealed/responses/{response_id}/route")
def sealed_stored_route(response_id: str, key: ChargedKey, service: Service) -> dict[str, str]:
    """Which model's worker a client pins to read a stored response back sealed (ids and routing only)."""
    return stored_route(service, key, response_id)


@router.get("/v1/sealed/conversations/{conv_id}/route")
def sealed_conversation_route(conv_id: str, key: ChargedKey, service: Service) -> dict[str, str]:
    """Which model's worker a client pins to call a conversation made in sealed mode (ids and routing only)."""
    return conversation_route(service, key, conv_id)
