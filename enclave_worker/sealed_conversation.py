"""Conversations in sealed mode (`/v1/conversations` through SealedOpenAI, and `conversation` on
/v1/sealed/responses): the conversation is one document, sealed here (response_state.py's key,
bound to tenant, model, version and the conversation's id) and marked as sealed-mode state; the
gateway keeps the ciphertext by id and sends it back with the next call on the conversation.

A call opens the one blob the gateway sent, checks it is the conversation the client sealed in its
request and a sealed-mode state (the gateway can have any document sealed in clear, SealState, but
not with the mark), and answers as the plaintext routes do. A call that changes the conversation
seals the whole new state (the version one higher) for the gateway to keep in place of the old.
Items cannot be spliced in, dropped or reordered (one AEAD over all of them); a state rolled back
to an older version, or another state of the same version, is what the client catches: the answer's
head names the version and digest it opened and left (sealed_client/conversation_state.py).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from enclave_worker.engine import InvalidRequestError
from enclave_worker.response_state import (
    MAX_DOCUMENT,
    SEALED_MARK,
    StateUnreadable,
    open_history,
    retention_s,
    state_cipher,
)
from enclave_worker.state import WorkerState
from protocol.openai.conversation_call import (
    WRITES,
    ConversationCall,
    CreateBody,
    ItemsBody,
    ListQuery,
    UpdateBody,
    check_metadata,
)
from protocol.openai.errors import OpenAIError
from protocol.openai.items import input_items, page
from protocol.openai.responses_request import input_messages
from protocol.rpc import worker_pb2
from protocol.sealed.http import ConversationHead, ResponseHead

KIND = "conversation"
M = TypeVar("M", bound=BaseModel)


@dataclass
class SealedConversation:
    id: str
    created_at: int
    version: int
    metadata: dict[str, str] = field(default_factory=dict)
    items: list[dict[str, Any]] = field(default_factory=list)

    def digest(self) -> str:
        """What the client compares two states of one version by (the id and version are bound too)."""
        canonical = json.dumps([self.id, self.version, self.metadata, self.items], sort_keys=True,
                               separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def object(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": self.metadata}

    def messages(self) -> list[dict[str, Any]]:
        """The items as the chat messages a turn in the conversation continues from."""
        return input_messages(self.items)


def open_conversation(state: WorkerState, request: worker_pb2.SealedRequest, conv_id: str,
                      param: str = "conversation") -> SealedConversation:
    """The conversation the gateway sent, if it is the one named inside the request; OpenAIError otherwise."""
    history = list(request.history)
    if len(history) != 1 or history[0].id != conv_id:
        raise _mismatch("the gateway sent another stored state than the conversation this request names", param)
    try:
        [document] = open_history(state, request.tenant, history)
    except StateUnreadable:
        raise OpenAIError(404, f"Conversation with id '{conv_id[:64]}' can no longer be opened: the key of the "
                               "model version that stored it is not served, or the stored state was altered",
                          param=param, code="state_unreadable") from None
    except InvalidRequestError as exc:
        raise OpenAIError(400, str(exc), param=param) from None
    if document.get(SEALED_MARK) is not True or document.get("kind") != KIND or document.get("id") != conv_id:
        raise _mismatch(f"{conv_id[:64]!r} is not a conversation made in sealed mode", param)
    created, version, metadata, items = (document.get(k) for k in ("created_at", "version", "metadata", "items"))
    if type(created) is not int or type(version) is not int or not isinstance(metadata, dict) \
            or not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise _mismatch("the stored conversation is malformed", param)
    return SealedConversation(conv_id, created, version, metadata, items)


def seal_conversation(state: WorkerState, tenant: str, conv: SealedConversation) -> worker_pb2.StateBlob:
    """The whole conversation, sealed under its id for the gateway to keep (expiring by the tenant's
    retention from its creation, as the gateway's row does)."""
    retention = retention_s(state)
    if retention <= 0:
        raise OpenAIError(400, "the tenant's policy keeps no conversations (response_retention_days is 0)",
                          code="invalid_value")
    document = {"kind": KIND, SEALED_MARK: True, "id": conv.id, "created_at": conv.created_at,
                "version": conv.version, "metadata": conv.metadata, "items": conv.items, "messages": []}
    if len(json.dumps(document, ensure_ascii=False).encode()) > MAX_DOCUMENT:
        raise OpenAIError(400, "the conversation would be larger than this server keeps", param="items",
                          code="invalid_value")
    try:
        blob = state_cipher(state, tenant).seal(conv.id, document, conv.created_at + retention)
    except StateUnreadable:
        raise OpenAIError(404, "the key of this model version is no longer served", code="state_unreadable") from None
    return worker_pb2.StateBlob(id=conv.id, blob=blob)


def conversation_call(state: WorkerState, request: worker_pb2.SealedRequest, body: bytes
                      ) -> tuple[ResponseHead, bytes, worker_pb2.StateBlob | None]:
    """The head, JSON body and (for a call that changes it) the newly sealed conversation."""
    call = _parse(ConversationCall, body)
    if call.model != request.model:
        raise OpenAIError(400, "the body names another model than the sealed request", param="model")
    if call.op == "create":
        if call.conversation_id is not None or request.history:
            raise _mismatch("a new conversation continues no stored state", "conversation_id")
        create = _parse(CreateBody, json.dumps(call.body or {}).encode())
        _metadata(create.metadata)
        conv = SealedConversation(f"conv_{secrets.token_hex(24)}", int(state.clock.now()), 0,
                                  dict(create.metadata or {}), _new_items(create.items or []))
        opened = (0, "")
    else:
        if call.conversation_id is None:
            raise OpenAIError(400, "the call names no conversation", param="conversation_id")
        conv = open_conversation(state, request, call.conversation_id, "conversation_id")
        opened = (conv.version, conv.digest())
    answer = _apply(conv, call)
    stored = None
    if call.op in WRITES:
        conv.version += 1
        stored = seal_conversation(state, request.tenant, conv)
    head = ResponseHead(200, "application/json",
                        conversation=ConversationHead(conv.id, *opened, conv.version, conv.digest()))
    return head, json.dumps(answer, ensure_ascii=False).encode(), stored


def _apply(conv: SealedConversation, call: ConversationCall) -> dict[str, Any]:
    """The call's answer, as the plaintext route gives it; `conv` changed in place for a write."""
    if call.op in ("create", "retrieve"):
        return conv.object()
    if call.op == "update":
        update = _parse(UpdateBody, json.dumps(call.body or {}).encode())
        _metadata(update.metadata)
        conv.metadata = dict(update.metadata)
        return conv.object()
    if call.op == "list_items":
        query = _parse(ListQuery, json.dumps(call.query).encode())
        if query.include:
            raise OpenAIError(400, f"include value {query.include[0][:64]!r} is not supported by this server",
                              param="include")
        return page(conv.items, order=query.order, after=query.after, limit=query.limit)
    if call.op == "create_items":
        new = _new_items(_parse(ItemsBody, json.dumps(call.body or {}).encode()).items)
        conv.items += new
        return {"object": "list", "data": new, "first_id": new[0]["id"], "last_id": new[-1]["id"], "has_more": False}
    found = [i for i in conv.items if i.get("id") == call.item_id]
    if not found:
        raise OpenAIError(404, f"Item with id '{(call.item_id or '')[:64]}' not found.", code="not_found")
    if call.op == "retrieve_item":
        return found[0]
    conv.items = [i for i in conv.items if i.get("id") != call.item_id]  # delete_item
    return conv.object()


def _new_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items with this server's ids; 400 naming one it cannot serve, before anything is sealed."""
    try:
        input_messages(items)
    except OpenAIError as exc:
        exc.param = "items" + (exc.param or "input")[len("input"):]
        raise
    return input_items(items, fresh_ids=True)


def _metadata(metadata: dict[str, str] | None) -> None:
    try:
        check_metadata(metadata)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="metadata", code="invalid_value") from None


def _parse(schema: type[M], body: bytes) -> M:
    try:
        return schema.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors()
        param = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else ""
        raise OpenAIError(400, f"invalid conversation call: {param or 'body'}: "
                               f"{errors[0].get('msg', 'invalid value') if errors else 'invalid'}",
                          param=param or None, code="invalid_value") from None


def _mismatch(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, f"{message}: refused (the conversation is fetched by the gateway, and checked here)",
                       param=param, code="state_mismatch")
