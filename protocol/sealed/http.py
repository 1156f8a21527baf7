"""How sealed messages travel over HTTP between client, gateway and worker.

Request:  POST {base}/v1/sealed/chat/completions (or /v1/sealed/completions, /v1/sealed/responses,
          /v1/sealed/embeddings)
          Authorization: Bearer <API key>; Sealed-Model: <model>; Sealed-Key-Id: <worker key id>
          Content-Type: application/sealed-request; body: hpke.seal_request(...).wire
Response: 200, Content-Type: application/sealed-response; body: response nonce, then frames.
          The first chunk is the inner response's head (JSON: status, content_type); the chunks
          after it are the inner body (one JSON document, or one SSE event per chunk); the final
          chunk is the signed receipt.
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

    def encode(self) -> bytes:
        return json.dumps({"status": self.status, "content_type": self.content_type},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ResponseHead:
        try:
            doc = json.loads(raw)
            head = cls(int(doc["status"]), str(doc["content_type"]))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: deep nesting
            raise ResponseCorrupted("first response chunk is not a response head") from exc
        if not 100 <= head.status <= 599:
            raise ResponseCorrupted("response head has no valid status")
        return head
