"""Files and vector stores through SealedOpenAI (docs/retrieval.md "Sealed mode").

The SDK's requests whose bodies carry the tenant's data are sealed to the attested encoder's worker
(the client's `retrieval_model`): `files.create` (the multipart form becomes a sealed JSON form) and
`vector_stores.search` (the query, and the store id from the URL, sealed; the passages come back
sealed, and the receipt names the files they came from, checked against the answer). The others
carry ids, names, metadata, attributes and status, which the gateway keeps in clear anyway, and pass
through unchanged; reading a file's content or a store file's parsed content is refused (it would
come back in clear)."""

from __future__ import annotations

import base64
import email.parser
import email.policy
import json
import re
from dataclasses import dataclass
from typing import Any

import httpx2

from protocol.sealed import Receipt, ReceiptInvalid
from protocol.sealed.http import FILES_ENDPOINT, SEALED_PREFIX, SEARCH_ENDPOINT
from sealed_client.errors import UnsealedRequest

_FILES = re.compile(r"^(.*)/v1/files$")
_SEARCH = re.compile(r"^(.*)/v1/vector_stores/([^/]+)/search$")
# Content-free: ids, names, metadata, attributes, status (the gateway's rows hold them in clear).
_CLEAR = re.compile(r"/v1/files(/[^/]+)?$"
                    r"|/v1/vector_stores(/[^/]+(/(files|file_batches)(/[^/]+(/(files|cancel))?)?)?)?$")


@dataclass(frozen=True)
class SealedCall:
    """A retrieval request as the client seals it: the endpoint bound, the body, the model pinned, the URL path."""

    endpoint: str
    body: bytes
    model: str
    path: str


def retrieval_route(request: httpx2.Request) -> str | None:
    """The sealed endpoint of an SDK retrieval request to seal, "" for one to pass through in clear,
    None for a path that is not retrieval's."""
    path = request.url.path.rstrip("/")
    if request.method == "POST" and _SEARCH.match(path):
        return SEARCH_ENDPOINT
    if request.method == "POST" and _FILES.match(path):
        return FILES_ENDPOINT
    if _CLEAR.search(path) and not path.endswith("/search"):
        return ""
    return None


def sealed_call(request: httpx2.Request, body: bytes, endpoint: str, model: str | None) -> SealedCall:
    """The sealed form of a retrieval request (`model`: the encoder the client was told to use)."""
    if not model:
        raise UnsealedRequest(f"{request.method} {request.url.path}: files and vector stores are sealed to an "
                              "embedding model's worker: give SealedOpenAI(retrieval_model=...); refused before "
                              "sending")
    path = request.url.path.rstrip("/")
    if endpoint == SEARCH_ENDPOINT:
        found = _SEARCH.match(path)
        assert found is not None
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise UnsealedRequest("a vector store search's body is JSON") from exc
        if not isinstance(doc, dict):
            raise UnsealedRequest("a vector store search's body is a JSON object")
        store_id = found.group(2)
        sealed = {**doc, "model": model, "vector_store_id": store_id}
        return SealedCall(endpoint, json.dumps(sealed).encode(), model,
                          f"{found.group(1)}{SEALED_PREFIX}/vector_stores/{store_id}/search")
    found = _FILES.match(path)
    assert found is not None
    filename, content, purpose = _multipart(request.headers.get("content-type", ""), body)
    sealed = {"model": model, "filename": filename, "purpose": purpose,
              "content": base64.b64encode(content).decode()}
    return SealedCall(endpoint, json.dumps(sealed).encode(), model, f"{found.group(1)}{SEALED_PREFIX}/files")


def _multipart(content_type: str, body: bytes) -> tuple[str, bytes, str]:
    """(filename, content, purpose) of the SDK's multipart upload, parsed here, in memory."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise UnsealedRequest("files.create sends multipart/form-data")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    filename, content, purpose = "file", None, None
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if name == "file" and isinstance(payload, bytes):
            filename, content = part.get_filename() or "file", payload
        elif name == "purpose" and isinstance(payload, bytes):
            purpose = payload.decode()
    if content is None or purpose is None:
        raise UnsealedRequest("files.create's form has a 'file' and a 'purpose'")
    return filename, content, purpose


def check_retrieved(receipt: Receipt, status: int, body: bytes) -> None:
    """A sealed search's receipt names exactly the files its passages came from (ReceiptInvalid
    otherwise): what a kept receipt says was retrieved is what the caller was given."""
    try:
        data: Any = json.loads(body).get("data", []) if status == 200 else []
        given = sorted({str(r["file_id"]) for r in data})
    except (ValueError, AttributeError, KeyError, TypeError) as exc:
        raise ReceiptInvalid("the search answer is not a results page") from exc
    if list(receipt.file_ids) != given:
        raise ReceiptInvalid("the receipt's file ids are not the files the search answer's passages came from")
