"""The Conversations API (`/v1/conversations` and its items), over worker-sealed state.

Everything a tenant writes into a conversation (its items, its metadata) is sealed by a worker
(SealState) under the key of one model version, bound when the first thing is sealed: the model
of the first response in it, or, on create and item create, the `model` field (this server's
extension) or else the one model the API key can use. Reading opens the blobs in a worker of that
version (OpenState). A `POST /v1/responses` with `conversation` continues from its items and adds
its input and output items to it (api/gateway/responses_routes.py). Another tenant's id, an
unknown, deleted or expired one are the same 404.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import Field

from api.gateway.dependencies import ChargedKey, PlaintextKey, Service
from api.gateway.errors import GatewayError
from api.gateway.responses_routes import add_items, open_state, refuse_include, retention_for, seal
from api.gateway.responses_store import conversation_not_found, item_state_id, sealed_only_conversation
from api.gateway.service import GatewayService
from api.store.conversations import StoredConversation
from api.store.repo import KeyRecord
from protocol.openai.items import input_items, page
from protocol.openai.responses_request import input_messages
from protocol.openai.schemas import Strict

router = APIRouter()
MAX_NEW_ITEMS = 20  # OpenAI's, per create


class Metadata(Strict):
    metadata: dict[str, str] = Field(max_length=16)


class ConversationCreate(Strict):
    items: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_NEW_ITEMS)
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    model: str | None = Field(default=None, min_length=1, max_length=256)  # which model's key seals it


class ItemsCreate(Strict):
    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_NEW_ITEMS)
    model: str | None = Field(default=None, min_length=1, max_length=256)


def _check_metadata(metadata: dict[str, str] | None) -> None:
    for k, v in (metadata or {}).items():
        if len(k) > 64 or len(v) > 512:
            raise GatewayError(400, "metadata keys are at most 64 characters, values at most 512",
                               param="metadata", code="invalid_value")


def _find(service: GatewayService, key: KeyRecord, conv_id: str, sealed_too: bool = False) -> StoredConversation:
    """The caller's conversation; one made in sealed mode is only deleted here (`sealed_too`), never read
    or written in clear (400 sealed_only_state)."""
    service.responses.purge_expired()
    conv = service.responses.conversations.get(key.tenant, conv_id)
    if conv is None or (conv.model is not None and key.models and conv.model not in key.models):
        raise conversation_not_found(conv_id)
    if conv.sealed_state is not None and not sealed_too:
        raise sealed_only_conversation(conv_id)
    return conv


def _sealing_model(service: GatewayService, key: KeyRecord, conv: StoredConversation, model: str | None
                   ) -> tuple[str, dict[str, float]]:
    """The model (and routing split) whose key seals what is written into this conversation."""
    if conv.model is not None and conv.version is not None:
        if model is not None and model != conv.model:
            raise GatewayError(400, "the conversation's items are sealed under another model", param="model",
                               code="invalid_value")
        service.catalog.resolve(key, conv.model)
        return conv.model, {conv.version: 100.0}
    if model is None:
        models = service.catalog.models_for(key)
        if len(models) != 1:
            raise GatewayError(400, "this server seals conversation items under a model's key: name the `model` "
                                    "(one of the key's models)", param="model")
        model = models[0]
    return model, service.catalog.resolve(key, model)


async def _object(service: GatewayService, key: KeyRecord, conv: StoredConversation) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    if conv.metadata_blob is not None and conv.model is not None and conv.version is not None:
        opened = await open_state(service, key, conv.model, conv.version, item_state_id(conv.id, "metadata"),
                                  conv.metadata_blob)
        metadata = opened.get("metadata") or {}
    return {"id": conv.id, "object": "conversation", "created_at": int(conv.created_at.timestamp()),
            "metadata": metadata}


async def _set_metadata(service: GatewayService, key: KeyRecord, conv: StoredConversation, model: str | None,
                        metadata: dict[str, str]) -> StoredConversation:
    chosen, split = _sealing_model(service, key, conv, model)
    reply = await seal(service, key, chosen, split, item_state_id(conv.id, "metadata"),
                       {"metadata": metadata, "messages": []})
    conversations = service.responses.conversations
    if not conversations.bind(key.tenant, conv.id, chosen, reply.version):
        raise GatewayError(409, "the conversation is bound to another model version", code="conflict")
    conversations.set_metadata(key.tenant, conv.id, reply.blob)
    return _find(service, key, conv.id)


async def _add(service: GatewayService, key: KeyRecord, conv: StoredConversation, model: str | None,
               items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:  # a 400 naming an item this server cannot serve, before anything is sealed
        input_messages(items)
    except GatewayError as exc:
        exc.param = "items" + (exc.param or "input")[len("input"):]
        raise
    chosen, split = _sealing_model(service, key, conv, model)
    normalized = input_items(items, fresh_ids=True)
    await add_items(service, key, conv.id, chosen, split, normalized)
    return normalized


def _conversation(conv_id: str, key: ChargedKey, service: Service) -> StoredConversation:
    """The caller's conversation `conv_id` (the route's path), after the key's request is charged."""
    return _find(service, key, conv_id)


Conversation = Annotated[StoredConversation, Depends(_conversation)]


@router.post("/v1/conversations")
async def create_conversation(body: ConversationCreate, key: PlaintextKey, service: Service) -> dict[str, Any]:
    _check_metadata(body.metadata)
    retention = retention_for(service, key)
    if retention.days == 0:
        raise GatewayError(400, "this tenant's policy keeps no conversations (response_retention_days is 0)",
                           code="invalid_value")
    conv = service.responses.conversations.create(f"conv_{secrets.token_hex(24)}", key.tenant, retention)
    try:
        if body.metadata:
            conv = await _set_metadata(service, key, conv, body.model, body.metadata)
        if body.items:
            await _add(service, key, conv, body.model, body.items)
    except BaseException:
        service.responses.conversations.delete(key.tenant, conv.id)  # nothing half made stays
        raise
    return await _object(service, key, _find(service, key, conv.id))


@router.get("/v1/conversations/{conv_id}")
async def retrieve_conversation(key: ChargedKey, conv: Conversation, service: Service) -> dict[str, Any]:
    return await _object(service, key, conv)


@router.post("/v1/conversations/{conv_id}")
async def update_conversation(body: Metadata, key: PlaintextKey, conv: Conversation,
                              service: Service) -> dict[str, Any]:
    _check_metadata(body.metadata)
    return await _object(service, key, await _set_metadata(service, key, conv, None, body.metadata))


@router.delete("/v1/conversations/{conv_id}")
def delete_conversation(conv_id: str, key: ChargedKey, service: Service) -> dict[str, Any]:
    conv = _find(service, key, conv_id, sealed_too=True)  # deleting needs nothing of its content
    if not service.responses.conversations.delete(key.tenant, conv.id):
        raise conversation_not_found(conv.id)
    service.audit.append(tenant=key.tenant, action="conversation.delete", decision="allow", reason="caller",
                         metadata={"conversation_id": conv.id, "key_id": key.key_id})
    return {"id": conv.id, "object": "conversation.deleted", "deleted": True}


@router.get("/v1/conversations/{conv_id}/items", dependencies=[Depends(refuse_include)])
async def list_items(key: ChargedKey, conv: Conversation, service: Service, after: str | None = None,
                     limit: int = Query(default=20, ge=1, le=100), order: Literal["asc", "desc"] = "desc"
                     ) -> dict[str, Any]:
    stored = service.responses.conversations.items(key.tenant, conv.id)
    listed = page([{"id": i.id, "blob": i.blob} for i in stored], order=order, after=after, limit=limit)
    listed["data"] = [await _open_item(service, key, conv, i["id"], i["blob"]) for i in listed["data"]]
    return listed


@router.post("/v1/conversations/{conv_id}/items")
async def create_items(body: ItemsCreate, key: PlaintextKey, conv: Conversation, service: Service) -> dict[str, Any]:
    items = await _add(service, key, conv, body.model, body.items)
    return {"object": "list", "data": items, "first_id": items[0]["id"], "last_id": items[-1]["id"],
            "has_more": False}


@router.get("/v1/conversations/{conv_id}/items/{item_id}")
async def retrieve_item(item_id: str, key: ChargedKey, conv: Conversation, service: Service) -> dict[str, Any]:
    for item in service.responses.conversations.items(key.tenant, conv.id):
        if item.id == item_id:
            return await _open_item(service, key, conv, item.id, item.blob)
    raise GatewayError(404, f"Item with id '{item_id[:64]}' not found.", code="not_found")


@router.delete("/v1/conversations/{conv_id}/items/{item_id}")
async def delete_item(item_id: str, key: ChargedKey, conv: Conversation, service: Service) -> dict[str, Any]:
    if not service.responses.conversations.delete_item(key.tenant, conv.id, item_id):
        raise GatewayError(404, f"Item with id '{item_id[:64]}' not found.", code="not_found")
    service.audit.append(tenant=key.tenant, action="conversation.item.delete", decision="allow", reason="caller",
                         metadata={"conversation_id": conv.id, "item_id": item_id[:64], "key_id": key.key_id})
    return await _object(service, key, conv)


async def _open_item(service: GatewayService, key: KeyRecord, conv: StoredConversation, item_id: str,
                     blob: bytes) -> dict[str, Any]:
    if conv.model is None or conv.version is None:
        raise conversation_not_found(conv.id)  # items are sealed only once the conversation is bound
    document = await open_state(service, key, conv.model, conv.version, item_state_id(conv.id, item_id), blob)
    item: dict[str, Any] = document["item"]
    return item
