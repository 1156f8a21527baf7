"""GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items, and the sealing of a
stored response after POST /v1/responses (api/gateway/responses_store.py).

Reading a stored response is a worker's job: the gateway sends the ciphertext to a worker of the
version that sealed it (OpenState), which opens it in the enclave and answers in clear, as any
plaintext answer. A tenant that requires sealed mode gets no clear answer (403), here or there.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Response

from api.gateway.dependencies import current_key, get_service
from api.gateway.errors import GatewayError
from api.gateway.responses_store import Turn, begin, page, sealed_state_request
from api.gateway.service import GatewayService
from api.store.repo import KeyRecord
from api.store.states import StoredState
from protocol.openai.responses_request import ResponsesRequest
from protocol.rpc import worker_pb2

router = APIRouter()


def start_turn(service: GatewayService, key: KeyRecord, req: ResponsesRequest) -> Turn:
    """The request's stored-state turn (the chain it continues, whether it is stored)."""
    row = service.catalog.cached(("policy", key.tenant), lambda: service.store.policy(key.tenant))
    return begin(service.responses, key, req, row.document if row is not None else None)


async def remember(service: GatewayService, turn: Turn, split: dict[str, float], response: dict[str, Any]) -> None:
    """Seal the finished response in a worker and keep the ciphertext (when the turn is stored)."""
    if not turn.store:
        return
    key, req = turn.key, turn.req
    reply = await service.call(key, req.model, turn.pinned_split(split), "SealState",
                               sealed_state_request(key, response["id"], turn.document(response)))
    service.responses.states.put(state_id=response["id"], tenant=key.tenant, model=req.model, version=reply.version,
                                 previous_id=req.previous_response_id, blob=reply.blob, retention=turn.retention)


async def _open(service: GatewayService, key: KeyRecord, state: StoredState) -> dict[str, Any]:
    service.check_plaintext_allowed(key)
    service.resolve(key, state.model)
    try:
        reply = await service.call(key, state.model, {state.version: 100.0}, "OpenState", worker_pb2.OpenStateRequest(
            tenant=key.tenant, key_id=key.key_id, state=worker_pb2.StateBlob(id=state.id, blob=state.blob)))
    except GatewayError as exc:
        if exc.status != 400:
            raise
        raise GatewayError(404, f"Response with id '{state.id}' can no longer be opened: the key of the model "
                                "version that stored it is not served, or the stored state was altered",
                           code="state_unreadable") from None
    document: dict[str, Any] = json.loads(reply.document_json)
    return document


def _no_stream(stream: bool | None, include: list[str] | None) -> None:
    if stream:
        raise GatewayError(400, "streaming a stored response is not supported by this server", param="stream")
    if include:
        raise GatewayError(400, f"include value {include[0][:64]!r} is not supported by this server",
                           param="include")


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, stream: bool | None = None,
                            include: list[str] | None = Query(default=None, alias="include[]"),
                            key: KeyRecord = Depends(current_key),
                            service: GatewayService = Depends(get_service)) -> dict[str, Any]:
    _no_stream(stream, include)
    document = await _open(service, key, service.responses.find(key, response_id))
    response: dict[str, Any] = document["response"]
    return response


@router.delete("/v1/responses/{response_id}")
def delete_response(response_id: str, key: KeyRecord = Depends(current_key),
                    service: GatewayService = Depends(get_service)) -> Response:
    service.responses.delete(key, response_id)
    return Response(content=json.dumps({"id": response_id, "object": "response.deleted", "deleted": True}),
                    media_type="application/json")


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(response_id: str, after: str | None = None, limit: int = Query(default=20, ge=1, le=100),
                           order: Literal["asc", "desc"] = "desc",
                           include: list[str] | None = Query(default=None, alias="include[]"),
                           key: KeyRecord = Depends(current_key),
                           service: GatewayService = Depends(get_service)) -> dict[str, Any]:
    _no_stream(None, include)
    document = await _open(service, key, service.responses.find(key, response_id))
    return page(document["input_items"], order=order, after=after, limit=limit)
