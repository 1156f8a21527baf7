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
MAX_STATE_ID = 64  # characters of a stored response id (OpenAI's previous_response_id bound)
SEALED_PREFIX = "/v1/sealed"
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")
REATTEST_CODE = "reattest_required"
MAX_REQUEST_BYTES = 8 << 20


def sealed_path(endpoint: str) -> str:
    """"/v1/chat/completions" -> "/v1/sealed/chat/completions"."""
    return SEALED_PREFIX + endpoint[len("/v1"):]


@dataclass(frozen=True)
class ResponseHead:
    status: int
    content_type: str
    history: tuple[str, ...] = ()  # stored response ids the answer continued from, oldest first
    stored: str = ""  # the id the answer's state is stored under ("": not stored)

    def encode(self) -> bytes:
        doc: dict[str, object] = {"status": self.status, "content_type": self.content_type}
        if self.history:  # absent when empty: an answer without stored state is encoded as before
            doc["history"] = list(self.history)
        if self.stored:
            doc["stored"] = self.stored
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ResponseHead:
        try:
            doc = json.loads(raw)
            history, stored = doc.get("history", []), doc.get("stored", "")
            if not isinstance(history, list) or not all(isinstance(i, str) for i in history) \
                    or not isinstance(stored, str):
                raise TypeError("history is a list of ids, stored an id")
            head = cls(int(doc["status"]), str(doc["content_type"]), tuple(history), stored)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # Recursion: deep nesting
            raise ResponseCorrupted("first response chunk is not a response head") from exc
        if not 100 <= head.status <= 599:
            raise ResponseCorrupted("response head has no valid status")
        return head
