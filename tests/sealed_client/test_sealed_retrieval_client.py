"""SealedOpenAI's side of sealed retrieval (sealed_client/retrieval.py): which files and vector store
requests are sealed, passed through or refused; the SDK's multipart upload as the sealed JSON form; a
search receipt's file ids signed (a tampered list does not verify) and checked against the answer."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx2
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol.sealed import Receipt, ReceiptInvalid, sign_receipt
from protocol.sealed.http import FILES_ENDPOINT, SEARCH_ENDPOINT
from protocol.sealed.receipt import read_signed_receipt
from sealed_client.errors import UnsealedRequest
from sealed_client.retrieval import check_retrieved, sealed_call
from sealed_client.routing import route_of

BASE = "http://gw/v1"


def _request(method: str, path: str, **kwargs: Any) -> httpx2.Request:
    return httpx2.Request(method, f"http://gw{path}", **kwargs)


@pytest.mark.parametrize(("method", "path", "want"), [
    ("POST", "/v1/files", ("", FILES_ENDPOINT)),
    ("POST", "/v1/vector_stores/vs-1/search", ("", SEARCH_ENDPOINT)),
    ("GET", "/v1/files", None), ("GET", "/v1/files/file-1", None), ("DELETE", "/v1/files/file-1", None),
    ("POST", "/v1/vector_stores", None), ("GET", "/v1/vector_stores/vs-1", None),
    ("POST", "/v1/vector_stores/vs-1/files", None), ("GET", "/v1/vector_stores/vs-1/files/file-1", None),
    ("POST", "/v1/vector_stores/vs-1/file_batches", None),
    ("GET", "/v1/vector_stores/vs-1/file_batches/b-1/files", None),
])
def test_what_is_sealed_and_what_passes_through(method: str, path: str, want: tuple[str, str] | None) -> None:
    assert route_of(_request(method, path), unsafe_allow_plaintext=False) == want


@pytest.mark.parametrize("path", ["/v1/files/file-1/content", "/v1/vector_stores/vs-1/files/file-1/content",
                                  "/v1/vector_stores/vs-1/search/x"])
def test_content_that_would_come_back_in_clear_is_refused(path: str) -> None:
    with pytest.raises(UnsealedRequest):
        route_of(_request("GET", path), unsafe_allow_plaintext=False)


def test_the_sdks_upload_and_search_become_the_sealed_forms() -> None:
    seen: list[httpx2.Request] = []

    def keep(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(500)

    sdk = openai.OpenAI(base_url=BASE, api_key="k", max_retries=0,
                        http_client=httpx2.Client(transport=httpx2.MockTransport(keep)))
    with pytest.raises(openai.InternalServerError):
        sdk.files.create(file=("notes.txt", b"secret \x00 bytes"), purpose="assistants")
    with pytest.raises(openai.InternalServerError):
        sdk.vector_stores.search("vs-1", query="where?", max_num_results=3)
    upload, search = seen
    call = sealed_call(upload, upload.read(), FILES_ENDPOINT, "minilm")
    assert (call.endpoint, call.model, call.path) == (FILES_ENDPOINT, "minilm", "/v1/sealed/files")
    form = json.loads(call.body)
    assert (form["filename"], form["purpose"], base64.b64decode(form["content"])) == (
        "notes.txt", "assistants", b"secret \x00 bytes")
    call = sealed_call(search, search.read(), SEARCH_ENDPOINT, "minilm")
    assert call.path == "/v1/sealed/vector_stores/vs-1/search"
    assert json.loads(call.body) == {"query": "where?", "max_num_results": 3, "model": "minilm",
                                     "vector_store_id": "vs-1"}
    with pytest.raises(UnsealedRequest, match="retrieval_model"):  # no encoder named: nothing is sent
        sealed_call(search, search.read(), SEARCH_ENDPOINT, None)


def _receipt(file_ids: tuple[str, ...]) -> Receipt:
    return Receipt(request_sha256="a" * 64, response_sha256="b" * 64, worker_key_id="c" * 64, tenant="t",
                   model="minilm", model_version="v1", model_digest="d" * 64, policy_version=1, prompt_tokens=0,
                   completion_tokens=0, tee="sim", insecure=True, issued_at=1.0, api_key_id="k", signing_key="",
                   channel_spki="", evidence_sha256="e" * 64, file_ids=file_ids)


def _signed(file_ids: tuple[str, ...]) -> bytes:
    key = Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes_raw().hex()
    receipt = _receipt(file_ids)
    return sign_receipt(Receipt(**{**vars(receipt), "signing_key": raw}), key)


def test_a_tampered_file_id_list_does_not_verify() -> None:
    signed = _signed(("file-a", "file-b"))
    assert read_signed_receipt(signed).file_ids == ("file-a", "file-b")
    for tampered in (["file-a"], ["file-a", "file-b", "file-c"], ["file-x", "file-b"], []):
        doc = json.loads(signed)
        doc["receipt"]["file_ids"] = tampered
        with pytest.raises(ReceiptInvalid):
            read_signed_receipt(json.dumps(doc).encode())
    doc = json.loads(signed)
    doc["receipt"]["file_ids"] = "file-a"
    with pytest.raises(ReceiptInvalid, match="file_ids"):
        read_signed_receipt(json.dumps(doc).encode())


def test_a_receipt_without_retrieval_signs_as_before() -> None:
    assert "file_ids" not in _receipt(()).fields()
    assert read_signed_receipt(_signed(())).file_ids == ()


def test_the_receipts_file_ids_are_the_answers() -> None:
    page = {"data": [{"file_id": "file-b"}, {"file_id": "file-a"}, {"file_id": "file-b"}]}
    check_retrieved(_receipt(("file-a", "file-b")), 200, json.dumps(page).encode())
    check_retrieved(_receipt(()), 400, b'{"error": {}}')
    for ids in ((), ("file-a",), ("file-a", "file-b", "file-c")):
        with pytest.raises(ReceiptInvalid, match="file ids"):
            check_retrieved(_receipt(ids), 200, json.dumps(page).encode())
    with pytest.raises(ReceiptInvalid):
        check_retrieved(_receipt(("file-a",)), 200, b"not json")
