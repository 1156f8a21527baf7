"""Stored responses in sealed mode (`store`, `previous_response_id` on /v1/sealed/responses).

The worker seals the state itself, with the scheme plaintext mode uses (response_state.py: a key
derived from the version's data key, bound to tenant, model, version and response id), marks it as
sealed-mode state, and hands the gateway only the ciphertext, on the answer's final chunk. The gateway
keeps it with routing fields only and never sees it in clear: a sealed-mode state is not opened for a
plaintext answer (GET /v1/responses/{id}, a plaintext continuation), and a document the gateway asks
to seal (SealState) may not carry the mark, so the gateway cannot mint history for a sealed request.

Continuing: the client names `previous_response_id` inside the envelope and, in clear, to the gateway,
which sends the chain of ciphertext it keeps under that id. The worker checks that the chain ends at
the id sealed inside the request, that each state continued the one before it (nothing dropped,
nothing spliced in), and that every state was stored in sealed mode; the answer's sealed head names
the ids it opened, which the client checks against what it asked (sealed_client/stored_state.py).

A turn with `conversation` continues a conversation made in sealed mode instead: the gateway sends its
one blob, the worker checks and opens it (sealed_conversation.py) and, once the answer is whole, seals
it again with the turn's items, one version higher.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from enclave_worker.engine import InvalidRequestError
from enclave_worker.response_state import (
    SEALED_MARK,
    StateUnreadable,
    open_history,
    prepend_history,
    retention_s,
    seal_state,
)
from enclave_worker.sealed_conversation import SealedConversation, open_conversation, seal_conversation
from enclave_worker.state import WorkerState
from protocol.openai.errors import OpenAIError
from protocol.openai.items import input_items
from protocol.openai.responses_request import ResponsesRequest, conversation_id
from protocol.openai.stored_state import state_document
from protocol.rpc import worker_pb2
from protocol.sealed.http import ConversationHead

PARAM = "previous_response_id"


@dataclass
class SealedTurn:
    """One sealed /v1/responses request's stored state: what it continued, and where its answer goes."""

    response_id: str  # the answer's id, and the id its state is sealed under
    store: bool
    history_ids: tuple[str, ...] = ()  # the stored responses it continued, oldest first
    past: list[dict[str, Any]] = field(default_factory=list)  # their turns as chat messages
    stored: worker_pb2.StateBlob | None = None  # the sealed state, once the answer is whole
    conversation: SealedConversation | None = None  # the sealed-mode conversation it continues
    opened: tuple[int, str] = (0, "")  # that conversation's version and digest as opened
    conversation_stored: worker_pb2.StateBlob | None = None  # it, with this turn's items, once whole

    def conversation_head(self) -> ConversationHead | None:
        """The conversation as opened, and the version the answer leaves it at (its digest is not known
        before the answer is whole, and the head goes first: "")."""
        if self.conversation is None:
            return None
        return ConversationHead(self.conversation.id, *self.opened, self.opened[0] + 1, "")

    def continued(self, requests: list[worker_pb2.GenerateRequest]) -> list[worker_pb2.GenerateRequest]:
        """The requests with the history's turns before their new input (no-op without history)."""
        if not self.past:
            return requests
        try:
            return [prepend_history(r, self.past) for r in requests]
        except InvalidRequestError as exc:
            raise OpenAIError(400, str(exc), param="input") from None

    def keep(self, state: WorkerState, tenant: str, req: ResponsesRequest, response: dict[str, Any]) -> None:
        """Seal the whole answer's state (when stored), and its conversation with the turn's items, for
        the gateway to keep."""
        if self.conversation is not None:
            conv = self.conversation
            conv.items = conv.items + input_items(req.input, fresh_ids=True) + input_items(response["output"])
            conv.version = self.opened[0] + 1
            self.conversation_stored = seal_conversation(state, tenant, conv)
        if not self.store:
            return
        document = {**state_document(req, response), SEALED_MARK: True}
        try:
            blob = seal_state(state, tenant, self.response_id, json.dumps(document, ensure_ascii=False),
                              sealed_mode=True)
        except InvalidRequestError as exc:
            raise OpenAIError(400, f"the response could not be stored: {exc}", param="store") from None
        self.stored = worker_pb2.StateBlob(id=self.response_id, blob=blob)


def begin_sealed_turn(state: WorkerState, request: worker_pb2.SealedRequest, req: ResponsesRequest) -> SealedTurn:
    """The request's turn: OpenAIError (sealed to the client) for a history that is not the one it asked for."""
    conv_id = conversation_id(req)  # 400 for another shape, or with previous_response_id
    retention = retention_s(state)
    if req.store and retention <= 0:
        raise OpenAIError(400, "the tenant's policy keeps no responses (response_retention_days is 0): store must "
                               "be false", param="store")
    turn = SealedTurn(response_id=f"resp_{secrets.token_hex(24)}", store=req.store is not False and retention > 0)
    if conv_id is not None:  # the conversation's items before the new input, its new items kept after
        turn.conversation = open_conversation(state, request, conv_id)
        turn.opened = (turn.conversation.version, turn.conversation.digest())
        try:
            turn.past = turn.conversation.messages()
        except OpenAIError as exc:
            raise OpenAIError(400, f"the conversation's items cannot be continued: {exc.message}",
                              param="conversation") from None
        return turn
    history = list(request.history)
    if req.previous_response_id is None:
        if history:
            raise _mismatch("the gateway sent stored history this request did not ask for")
        return turn
    if not history or history[-1].id != req.previous_response_id:
        raise _mismatch("the stored history the gateway sent does not end at previous_response_id")
    try:
        documents = open_history(state, request.tenant, history)
    except StateUnreadable:
        raise OpenAIError(404, f"Previous response with id '{req.previous_response_id[:64]}' can no longer be "
                               "opened: the key of the model version that stored it is not served, or the stored "
                               "state was altered", param=PARAM, code="state_unreadable") from None
    except InvalidRequestError as exc:
        raise OpenAIError(400, str(exc), param=PARAM) from None
    before: str | None = None
    for stored, document in zip(history, documents, strict=True):
        response = document.get("response")
        if document.get(SEALED_MARK) is not True:
            raise OpenAIError(400, f"response {stored.id[:64]!r} was stored in plaintext mode: a sealed request "
                                   "continues only responses stored in sealed mode", param=PARAM)
        if not isinstance(response, dict) or response.get("id") != stored.id \
                or response.get("previous_response_id") != before:
            raise _mismatch("the stored history the gateway sent is not one unbroken chain")
        before = stored.id
        turn.past += document["messages"]
    turn.history_ids = tuple(s.id for s in history)
    return turn


def _mismatch(message: str) -> OpenAIError:
    return OpenAIError(400, f"{message}: refused (the chain is fetched by the gateway, and checked here)",
                       param=PARAM, code="state_mismatch")
