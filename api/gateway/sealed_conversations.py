"""Conversations in sealed mode: what the gateway does is fetch and keep one blob by id.

A sealed call on a conversation (`/v1/sealed/conversations/call`, or `/v1/sealed/responses` with
`conversation`) names the conversation's id in clear (`Sealed-Conversation-Id`, routing data): the
gateway sends the blob it keeps under it, and the worker checks it is the conversation sealed inside
the request (enclave_worker/sealed_conversation.py). A call that changed the conversation, or made
one, returns the whole new state sealed on its final chunk; the gateway keeps it in place of the one
it sent, and only of that one (a concurrent change is not overwritten: the later answer is cut, 409).
"""

from __future__ import annotations

from starlette.datastructures import Headers

from api.gateway.errors import GatewayError
from api.gateway.responses_routes import retention_for
from api.gateway.responses_store import conversation_not_found
from api.gateway.service import GatewayService
from api.store.conversations import StoredConversation
from api.store.repo import KeyRecord
from protocol.rpc import worker_pb2
from protocol.sealed.http import CONVERSATIONS, HEADER_CONVERSATION, MAX_STATE_ID

RESPONSES = "/v1/responses"
PREFIX = "conv_"


def named_conversation(endpoint: str, headers: Headers) -> str | None:
    """The sealed-mode conversation a sealed request works on, as its client named it in clear."""
    conv_id = headers.get(HEADER_CONVERSATION)
    if conv_id is None:
        return None
    if endpoint not in (RESPONSES, CONVERSATIONS):
        raise GatewayError(400, f"{HEADER_CONVERSATION} is for /v1/sealed/responses and /v1/sealed/conversations",
                           param="conversation", code="invalid_value")
    if not 0 < len(conv_id) <= MAX_STATE_ID or not conv_id.isascii() or not conv_id.isprintable():
        raise GatewayError(400, f"{HEADER_CONVERSATION} is not a conversation id", param="conversation",
                           code="invalid_value")
    return conv_id


def find_sealed(service: GatewayService, key: KeyRecord, conv_id: str) -> StoredConversation:
    """The caller's conversation made in sealed mode (404 as any unknown id; 400 for a plaintext one)."""
    service.responses.purge_expired()
    conv = service.responses.conversations.get(key.tenant, conv_id)
    if conv is None or conv.model is None or (key.models and conv.model not in key.models):
        raise conversation_not_found(conv_id, param="conversation")
    if conv.sealed_state is None:
        raise GatewayError(400, f"conversation '{conv_id[:64]}' was made in plaintext mode: a sealed request "
                                "continues only conversations made in sealed mode", param="conversation",
                           code="invalid_value")
    return conv


def conversation_history(service: GatewayService, key: KeyRecord, model: str, conv_id: str | None
                         ) -> list[worker_pb2.StateBlob]:
    """The one blob of the named conversation (nothing when none is named)."""
    if conv_id is None:
        return []
    conv = find_sealed(service, key, conv_id)
    if conv.model != model:
        raise GatewayError(400, "the conversation was made with another model", param="conversation",
                           code="invalid_value")
    assert conv.sealed_state is not None
    return [worker_pb2.StateBlob(id=conv.id, blob=conv.sealed_state)]


def conversation_route(service: GatewayService, key: KeyRecord, conv_id: str) -> dict[str, str]:
    """The model a sealed-mode conversation is kept under (routing data), for a client to pin a worker of."""
    conv = find_sealed(service, key, conv_id)
    assert conv.model is not None
    return {"id": conv.id, "object": "sealed.route", "model": conv.model}


def keep_conversation(service: GatewayService, key: KeyRecord, model: str, endpoint: str, conv_id: str | None,
                      sent: list[worker_pb2.StateBlob], chunk: worker_pb2.SealedChunk) -> None:
    """Keep the conversation the worker sealed on its final chunk: a new one (a create), or the named
    one in place of the state sent with the request."""
    if not chunk.HasField("conversation_state"):
        return
    state = chunk.conversation_state
    if not 0 < len(state.id) <= MAX_STATE_ID or not state.id.startswith(PREFIX) or not state.blob \
            or not chunk.state_version:
        raise GatewayError(502, "the worker returned a malformed conversation state", type_="server_error")
    conversations = service.responses.conversations
    if conv_id is None:
        if endpoint != CONVERSATIONS:
            raise GatewayError(502, "the worker made a conversation the request did not ask for", type_="server_error")
        conversations.create_sealed(state.id, key.tenant, model, chunk.state_version, state.blob,
                                    retention_for(service, key))
        return
    opened = [s.blob for s in sent if s.id == conv_id]
    if state.id != conv_id or len(opened) != 1:
        raise GatewayError(502, "the worker returned another conversation than the one it was sent",
                           type_="server_error")
    if not conversations.replace_sealed(key.tenant, conv_id, opened[0], state.blob):
        raise GatewayError(409, "the conversation changed (or was deleted) while this call ran: call again",
                           param="conversation", code="conflict")
