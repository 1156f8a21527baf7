"""GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items, and the sealing of a
stored response after POST /v1/responses (api/gateway/responses_store.py).

Reading a stored response is a worker's job: the gateway sends the ciphertext to a worker of the
version that sealed it (OpenState), which opens it in the enclave and answers in clear, as any
plaintext answer. A tenant that requires sealed mode gets no clear answer (403), here or there.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Response

from api.gateway.dependencies import ChargedKey, Service
from api.gateway.errors import GatewayError
from api.gateway.responses_store import (
    Turn,
    begin,
    conversation_not_found,
    item_state_id,
    sealed_state_request,
)
from api.gateway.service import GatewayService
from api.store.repo import KeyRecord
from api.store.states import StoredState
from protocol.openai.items import input_items, page
from protocol.openai.responses_request import ResponsesRequest, input_messages
from protocol.openai.stored_state import SEALED_ONLY
from protocol.rpc import worker_pb2

router = APIRouter()


def start_turn(service: GatewayService, key: KeyRecord, req: ResponsesRequest) -> Turn:
    """The request's stored-state turn (the history it continues, whether it is stored)."""
    return begin(service.responses, key, req, service.catalog.policy_document(key.tenant))


def retention_for(service: GatewayService, key: KeyRecord) -> dt.timedelta:
    """How long the tenant's policy keeps stored state (response_retention_days)."""
    return dt.timedelta(days=service.responses.retention_days(service.catalog.policy_document(key.tenant)))


async def seal(service: GatewayService, key: KeyRecord, model: str, split: dict[str, float], state_id: str,
               document: dict[str, Any]) -> worker_pb2.SealStateReply:
    """A worker of `split` seals `document` under `state_id` (the reply names its version)."""
    reply: worker_pb2.SealStateReply = await service.call(key, model, split, "SealState",
                                                          sealed_state_request(key, state_id, document))
    return reply


async def open_state(service: GatewayService, key: KeyRecord, model: str, version: str, state_id: str,
                     blob: bytes) -> dict[str, Any]:
    """A worker of `version` opens a stored state; 404 `state_unreadable` when it does not open."""
    service.check_plaintext_allowed(key)
    service.catalog.resolve(key, model)
    try:
        reply = await service.call(key, model, {version: 100.0}, "OpenState", worker_pb2.OpenStateRequest(
            tenant=key.tenant, key_id=key.key_id, state=worker_pb2.StateBlob(id=state_id, blob=blob)))
    except GatewayError as exc:
        if exc.status != 400:
            raise
        if SEALED_ONLY in exc.message:  # stored by a sealed-mode answer: never given in clear
            raise GatewayError(400, exc.message[:300], code="sealed_only_state") from None
        raise GatewayError(404, f"'{state_id[:130]}' can no longer be opened: the key of the model version that "
                                "stored it is not served, or the stored state was altered",
                           code="state_unreadable") from None
    document: dict[str, Any] = json.loads(reply.document_json)
    return document


async def remember(service: GatewayService, turn: Turn, split: dict[str, float], response: dict[str, Any]) -> None:
    """After an answer: seal and keep the response (when stored), and add the turn's input and
    output items to its conversation (when it has one)."""
    key, req = turn.key, turn.req
    if turn.store:
        reply = await seal(service, key, req.model, turn.pinned_split(split), response["id"], turn.document(response))
        service.responses.states.put(state_id=response["id"], tenant=key.tenant, model=req.model,
                                     version=reply.version, previous_id=req.previous_response_id, blob=reply.blob,
                                     retention=turn.retention)
    if turn.conversation is not None:
        items = input_items(req.input, fresh_ids=True) + input_items(response["output"])
        await add_items(service, key, turn.conversation.id, req.model, turn.pinned_split(split), items)


async def add_items(service: GatewayService, key: KeyRecord, conv_id: str, model: str, split: dict[str, float],
                    items: list[dict[str, Any]]) -> None:
    """Seal each item (with its ids) and append them; the conversation is bound to the version that
    sealed them (409 if it was bound to another one meanwhile)."""
    sealed: list[tuple[str, bytes]] = []
    for item in items:
        reply = await seal(service, key, model, split, item_state_id(conv_id, item["id"]),
                           {"item": item, "messages": input_messages([item])})
        if not service.responses.conversations.bind(key.tenant, conv_id, model, reply.version):
            raise GatewayError(409, "the conversation is bound to another model version", param="conversation",
                               code="conflict")
        split = {reply.version: 100.0}
        sealed.append((item["id"], reply.blob))
    if not service.responses.conversations.add_items(key.tenant, conv_id, sealed):
        raise conversation_not_found(conv_id)


async def _open(service: GatewayService, key: KeyRecord, state: StoredState) -> dict[str, Any]:
    return await open_state(service, key, state.model, state.version, state.id, state.blob)


def refuse_include(_: ChargedKey, include: list[str] | None = Query(default=None, alias="include[]")) -> None:
    """`include[]` asks for extra fields this server does not keep: refused, whatever it names (after
    the key is checked and its request charged, as before any other refusal of these routes)."""
    if include:
        raise GatewayError(400, f"include value {include[0][:64]!r} is not supported by this server",
                           param="include")


@router.get("/v1/responses/{response_id}", dependencies=[Depends(refuse_include)])
async def retrieve_response(response_id: str, key: ChargedKey, service: Service,
                            stream: bool | None = None) -> dict[str, Any]:
    if stream:
        raise GatewayError(400, "streaming a stored response is not supported by this server", param="stream")
    document = await _open(service, key, service.responses.find(key, response_id))
    response: dict[str, Any] = document["response"]
    return response


@router.delete("/v1/responses/{response_id}")
def delete_response(response_id: str, key: ChargedKey, service: Service) -> Response:
    service.responses.delete(key, response_id)
    return Response(content=json.dumps({"id": response_id, "object": "response.deleted", "deleted": True}),
                    media_type="application/json")


@router.get("/v1/responses/{response_id}/input_items", dependencies=[Depends(refuse_include)])
async def list_input_items(response_id: str, key: ChargedKey, service: Service, after: str | None = None,
                           limit: int = Query(default=20, ge=1, le=100),
                           order: Literal["asc", "desc"] = "desc") -> dict[str, Any]:
    document = await _open(service, key, service.responses.find(key, response_id))
    return page(document["input_items"], order=order, after=after, limit=limit)
