"""How sealed messages travel over HTTP between client, gateway and worker.

Request:  POST {base}/v1/sealed/chat/completions (or /v1/sealed/completions, /v1/sealed/responses,
          /v1/sealed/embeddings)
          Authorization: Bearer <API key>; Sealed-Model: <model>; Sealed-Key-Id: <worker key id>
          Content-Type: application/sealed-request; body: hpke.seal_request(...).wire
Response: 200, Content-Type: application/sealed-response; body: response nonce, then frames.
          The first chunk is the inner response's head (JSON: status, content_type); the chunks
          after it are the inner body (one JSON document, or one SSE event per chunk); the final
          chunk is the signed receipt.
Stored state (/v1/sealed/responses only): a request continuing a stored response names its id in
          Sealed-Previous-Response-Id, in clear, as routing data (the gateway fetches the chain of
          ciphertext by it); the worker checks it against the `previous_response_id` sealed inside.
          The head states the stored response ids the worker opened (`history`, oldest first) and
          the id it stored this answer under (`stored`), so the client checks what its answer
          continued from; both are covered by the receipt's response hash.
Reading a stored response back (GET /v1/responses/{id}, …/input_items through SealedOpenAI): the
          client seals `{"model", "response_id", "part", ...}` to STORED_READ, POSTed to
          /v1/sealed/responses/read with the id in Sealed-Previous-Response-Id; the gateway sends the
          one blob it keeps under it and the worker answers with the opened response, sealed. The model
          to pin is routing data the gateway already holds: GET /v1/sealed/responses/{id}/route.
Conversations (every /v1/conversations call but DELETE of one, through SealedOpenAI): the client seals
          `{"model", "op", "conversation_id", ...}` to CONVERSATIONS, POSTed to /v1/sealed/conversations
          with the conversation's id in Sealed-Conversation-Id (also on a /v1/sealed/responses request
          with `conversation`); the gateway sends the one blob it keeps under it (the whole conversation,
          sealed by a worker) and keeps the one the worker returns. The head states the conversation's
          id and the version and digest it opened and the ones it left (`conversation`), covered by the
          receipt, so a client that saw a newer state refuses one rolled back or changed.
Retrieval (docs/retrieval.md "Sealed mode"): POST {base}/v1/sealed/files and
          {base}/v1/sealed/vector_stores/{id}/search, the same envelope and answer; the ids in the
          URL are routing data, and the receipt of a search names the files its passages came from.
Errors the gateway answers itself (authentication, admission, unknown model, worker gone) are
plain OpenAI-shaped JSON with their status; they carry no content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from protocol.sealed.errors import ResponseCorrupted

REQUEST_CONTENT_TYPE = "application/sealed-request"
RESPONSE_CONTENT_TYPE = "application/sealed-response"
HEADER_MODEL = "Sealed-Model"
HEADER_KEY_ID = "Sealed-Key-Id"
HEADER_PREVIOUS_RESPONSE = "Sealed-Previous-Response-Id"
HEADER_CONVERSATION = "Sealed-Conversation-Id"
MAX_STATE_ID = 64  # characters of a stored response id (OpenAI's previous_response_id bound)
SEALED_PREFIX = "/v1/sealed"
STORED_READ = "/v1/responses/read"  # a stored response (or its input items), opened by the worker
CONVERSATIONS = "/v1/conversations/call"  # a Conversations API call on a sealed-mode conversation
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", STORED_READ,
             CONVERSATIONS)
# Retrieval's sealed forms (docs/retrieval.md "Sealed mode"), served by an encoder's worker. Their bodies
# are not the SDK's as sent: the client seals a JSON form that names the model and the ids the URL
# carries (`vector_store_id`), so the worker checks them against what the gateway routed by.
#   POST {base}/v1/sealed/files                      endpoint "/v1/files"
#   POST {base}/v1/sealed/vector_stores/{id}/search  endpoint "/v1/vector_stores/search"
FILES_ENDPOINT = "/v1/files"
SEARCH_ENDPOINT = "/v1/vector_stores/search"
RETRIEVAL_ENDPOINTS = (FILES_ENDPOINT, SEARCH_ENDPOINT)
REATTEST_CODE = "reattest_required"
MAX_REQUEST_BYTES = 8 << 20


def sealed_path(endpoint: str) -> str:
    """"/v1/chat/completions" -> "/v1/sealed/chat/completions"."""
    return SEALED_PREFIX + endpoint[len("/v1"):]


@dataclass(frozen=True)
class ConversationHead:
    """A sealed-mode conversation as an answer saw it: the state it opened (version 0: it made the
    conversation) and the one it left; a digest is SHA-256 over the state's metadata and items."""

    id: str
    opened_version: int
    opened_digest: str
    version: int
    digest: str

    def encode(self) -> list[object]:
        return [self.id, self.opened_version, self.opened_digest, self.version, self.digest]

    @classmethod
    def decode(cls, raw: object) -> ConversationHead:
        if not isinstance(raw, list) or len(raw) != 5 or not all(isinstance(raw[i], str) for i in (0, 2, 4)) \
                or not all(type(raw[i]) is int and raw[i] >= 0 for i in (1, 3)):
            raise TypeError("conversation is [id, opened version, opened digest, version, digest]")
        return cls(*raw)


@dataclass(frozen=True)
class ResponseHead:
    status: int
    content_type: str
    history: tuple[str, ...] = ()  # stored response ids the answer continued from, oldest first
    stored: str = ""  # the id the answer's state is stored under ("": not stored)
    conversation: ConversationHead | None = None  # the sealed-mode conversation it opened or made

    def encode(self) -> bytes:
        doc: dict[str, object] = {"status": self.status, "content_type": self.content_type}
        if self.history:  # absent when empty: an answer without stored state is encoded as before
            doc["history"] = list(self.history)
        if self.stored:
            doc["stored"] = self.stored
        if self.conversation is not None:
            doc["conversation"] = self.conversation.encode()
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ResponseHead:
        try:
            doc = json.loads(raw)
            history, stored = doc.get("history", []), doc.get("stored", "")
            if not isinstance(history, list) or not all(isinstance(i, str) for i in history) \
                    or not isinstance(stored, str):
                raise TypeError("history is a list of ids, stored an id")
            conversation = ConversationHead.decode(doc["conversation"]) if "conversation" in doc else None
            head = cls(int(doc["status"]), str(doc["content_type"]), tuple(history), stored, conversation)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # Recursion: deep nesting
            raise ResponseCorrupted("first response chunk is not a response head") from exc
        if not 100 <= head.status <= 599:
            raise ResponseCorrupted("response head has no valid status")
        return head
