"""Stored responses (OpenAI's `store`, `previous_response_id`): what the gateway keeps is ciphertext.

A stored response's state is sealed by a worker (SealState; enclave_worker/response_state.py) under
a key derived from the model version's data key, and kept here by id (api/store/states.py) with
what routing needs in clear: tenant, model, version, the response it continued from, the expiry.
A request that continues one sends the chain of blobs to a worker of that version, which opens them
in the enclave and puts the history before the new input. The gateway never holds the state key.

Retention is the tenant's (policy `response_retention_days`, default 30, 0 = nothing stored): the
gateway drops expired rows (audited), and the worker refuses a state past the expiry it sealed in.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from api.gateway.errors import GatewayError
from api.store.conversations import Conversations, StoredConversation
from api.store.repo import KeyRecord, Store
from api.store.states import ResponseStates, StoredState
from policy.audit import AuditLog
from policy.policyset import DEFAULT_RESPONSE_RETENTION_DAYS
from protocol.openai.items import input_items as input_items
from protocol.openai.responses_request import ResponsesRequest, conversation_id
from protocol.openai.stored_state import state_document
from protocol.rpc import worker_pb2

MAX_CHAIN = 64  # stored responses one request may continue from
MAX_CONVERSATION_ITEMS = 256  # a conversation's items one request may continue from (the worker's MAX_HISTORY)
PURGE_EVERY_S = 60.0


def response_not_found(response_id: str, param: str | None = None) -> GatewayError:
    """The same answer for an unknown id, another tenant's, a deleted or an expired one."""
    what = "Previous response" if param else "Response"
    return GatewayError(404, f"{what} with id '{response_id[:64]}' not found.", param=param,
                        code="previous_response_not_found" if param else "not_found")


@dataclass
class StoredResponses:
    """The gateway's side of stored responses: rows of ciphertext, retention, deletion (audited)."""

    store: Store
    audit: AuditLog
    states: ResponseStates = field(init=False)
    conversations: Conversations = field(init=False)
    _purged_at: float = float("-inf")

    def __post_init__(self) -> None:
        self.states = ResponseStates(self.store.sessions)
        self.conversations = Conversations(self.store.sessions)

    def retention_days(self, policy_document: Any) -> int:
        payload = policy_document.get("payload", policy_document) if isinstance(policy_document, dict) else None
        days = payload.get("response_retention_days") if isinstance(payload, dict) else None
        return days if type(days) is int and days >= 0 else DEFAULT_RESPONSE_RETENTION_DAYS

    def find(self, key: KeyRecord, response_id: str) -> StoredState:
        """The tenant's stored response (404 for any other)."""
        self.purge_expired()
        state = self.states.get(key.tenant, response_id)
        if state is None or (key.models and state.model not in key.models):
            raise response_not_found(response_id)
        return state

    def delete(self, key: KeyRecord, response_id: str) -> None:
        self.find(key, response_id)
        if not self.states.delete(key.tenant, response_id):
            raise response_not_found(response_id)
        self.audit.append(tenant=key.tenant, action="response.delete", decision="allow", reason="caller",
                          metadata={"response_id": response_id, "key_id": key.key_id})

    def purge_expired(self) -> None:
        """Delete expired states, at most once a minute per gateway process; each one audited."""
        now = time.monotonic()
        if now - self._purged_at < PURGE_EVERY_S:
            return
        self._purged_at = now
        for tenant, response_id in self.states.purge_expired():
            self.audit.append(tenant=tenant, action="response.expire", decision="allow", reason="retention",
                              metadata={"response_id": response_id})
        for tenant, conv_id in self.conversations.purge_expired():
            self.audit.append(tenant=tenant, action="conversation.expire", decision="allow", reason="retention",
                              metadata={"conversation_id": conv_id})


@dataclass
class Turn:
    """One /v1/responses request's state: the stored history it continues (a chain of responses,
    or a conversation's items), the version whose key sealed it, and whether its answer is stored."""

    req: ResponsesRequest
    key: KeyRecord
    store: bool
    retention: dt.timedelta
    history: list[worker_pb2.StateBlob] = field(default_factory=list)
    version: str | None = None  # of the history's key: the request runs there
    conversation: StoredConversation | None = None

    def pinned_split(self, split: dict[str, float]) -> dict[str, float]:
        """A continuation runs on the version that sealed its history (only its key opens it)."""
        return {self.version: 100.0} if self.version else split

    def attach(self, requests: Iterable[worker_pb2.GenerateRequest]) -> None:
        for request in requests:
            request.history.extend(self.history)

    def document(self, response: dict[str, Any]) -> dict[str, Any]:
        """The state to seal (protocol/openai/stored_state.py)."""
        return state_document(self.req, response)


def begin(stored: StoredResponses, key: KeyRecord, req: ResponsesRequest, policy_document: Any) -> Turn:
    """The request's Turn; 404 for a previous response or conversation it cannot see, 400 for one of
    another model (or of several versions)."""
    days = stored.retention_days(policy_document)
    if req.store and days == 0:
        raise GatewayError(400, "this tenant's policy keeps no responses (response_retention_days is 0): "
                                "store must be false", param="store")
    turn = Turn(req, key, store=req.store is not False and days > 0, retention=dt.timedelta(days=days))
    conv_id = conversation_id(req)
    if conv_id is not None:
        _continue_conversation(stored, turn, conv_id)
    elif req.previous_response_id is not None:
        stored.purge_expired()
        found = stored.states.chain(key.tenant, req.previous_response_id, MAX_CHAIN - 1)
        if found is None or (key.models and found[-1].model not in key.models):
            raise response_not_found(req.previous_response_id, param="previous_response_id")
        _same_model(found[-1].model, req.model, "previous_response_id")
        if len({s.version for s in found}) != 1:
            raise GatewayError(400, "the conversation spans model versions; its history cannot be opened",
                               param="previous_response_id", code="invalid_value")
        turn.history = [worker_pb2.StateBlob(id=s.id, blob=s.blob) for s in found]
        turn.version = found[-1].version
    return turn


def _continue_conversation(stored: StoredResponses, turn: Turn, conv_id: str) -> None:
    key = turn.key
    conv = stored.conversations.get(key.tenant, conv_id)
    if conv is None or (conv.model is not None and key.models and conv.model not in key.models):
        raise conversation_not_found(conv_id, param="conversation")
    if conv.sealed_state is not None:
        raise sealed_only_conversation(conv_id, param="conversation")
    if conv.model is not None:
        _same_model(conv.model, turn.req.model, "conversation")
    items = stored.conversations.items(key.tenant, conv_id)
    if len(items) > MAX_CONVERSATION_ITEMS:
        raise GatewayError(400, f"this conversation has more than {MAX_CONVERSATION_ITEMS} items, more than one "
                                "request may continue from", param="conversation", code="invalid_value")
    turn.conversation, turn.version = conv, conv.version
    turn.history = [worker_pb2.StateBlob(id=item_state_id(conv_id, i.id), blob=i.blob) for i in items]


def _same_model(stored_model: str, model: str, param: str) -> None:
    if stored_model != model:
        raise GatewayError(400, f"the {param.replace('_', ' ')} was made with another model", param=param,
                           code="invalid_value")


def conversation_not_found(conv_id: str, param: str | None = None) -> GatewayError:
    return GatewayError(404, f"Conversation with id '{conv_id[:64]}' not found.", param=param,
                        code="conversation_not_found")


def sealed_only_conversation(conv_id: str, param: str | None = None) -> GatewayError:
    """A conversation made in sealed mode, asked for in clear: its content is the client's, never given in
    clear (the worker would refuse to open it too: it carries the sealed-mode mark)."""
    return GatewayError(400, f"conversation '{conv_id[:64]}' was made in sealed mode: it is served only sealed "
                             "(through SealedOpenAI: /v1/sealed/conversations)", param=param, code="sealed_only_state")


def item_state_id(conv_id: str, item_id: str) -> str:
    """The id a conversation item is sealed under: its conversation's too, so it cannot be moved."""
    return f"{conv_id}:{item_id}"


def sealed_state_request(key: KeyRecord, response_id: str, document: dict[str, Any]) -> worker_pb2.SealStateRequest:
    return worker_pb2.SealStateRequest(tenant=key.tenant, key_id=key.key_id, id=response_id,
                                       document_json=json.dumps(document, ensure_ascii=False))
