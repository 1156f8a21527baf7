"""Retrieval in sealed mode (docs/retrieval.md "Sealed mode"): a sealed upload and a sealed vector
store search, opened and answered inside the encoder's worker, so the gateway relays ciphertext.

The bodies are the JSON forms the client seals (sealed_client/retrieval.py), each naming the model
and, for a search, the store id the URL carries: the worker checks it against the store whose snapshot
the gateway names (a gateway that swaps stores gets a 400, not another store's passages). The
snapshot is named, not carried (SealedRequest.store_base): it is served from the stores this worker
holds open, checked (held, pinned) before the envelope opened (retrieval_rpcs.sealed_store_held), and
its name (id, version, digest) checked again here, so an older or other snapshot is never searched. The work is
the plaintext RPCs' own (retrieval/service.py, on a thread: retrieval_rpcs.off_loop), under the
tenant's signed `file_access` for the API key bound into the request. What the gateway keeps of an
upload (the file's ciphertext, id, name, purpose, size) rides on the final chunk; a search's file ids
go only into the receipt and the tenant's sealed decision record, one `retrieval` decision
per file (its `rule` is the file id, its `policy_id` the store's id)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from enclave_worker.guard import GuardNote
from enclave_worker.retrieval.errors import InvalidRetrievalRequest, SealedStoreError, SnapshotNeeded
from enclave_worker.retrieval.service import MAX_FILE_BYTES, RetrievalService, check_id, results_json
from enclave_worker.retrieval_rpcs import file_rights, off_loop
from enclave_worker.state import WorkerState
from policy.decision import Decision
from protocol.openai.errors import OpenAIError
from protocol.rpc import worker_pb2
from protocol.rpc.snapshot_segments import SnapshotName
from protocol.sealed.http import FILES_ENDPOINT

RETRIEVE_ACTION = "retrieval"  # policy/audit/worker_record.py ACTIONS


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str


class SealedUpload(_Body):
    """POST /v1/files as the client seals it: the multipart form's fields, the content in base64."""

    filename: str = Field(max_length=4096)
    purpose: str
    content: str  # base64


class _Ranking(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ranker: str | None = None
    score_threshold: float | None = None


class SealedSearch(_Body):
    """POST /v1/vector_stores/{id}/search's body, with the id the URL carried."""

    vector_store_id: str
    query: str | list[str]
    max_num_results: int = Field(default=10, ge=1, le=50)
    filters: dict[str, Any] | None = None
    ranking_options: _Ranking | None = None
    rewrite_query: bool = False


@dataclass
class RetrievalAnswer:
    """What a sealed retrieval call leaves for the final chunk: the file the gateway keeps (upload), the
    file ids the receipt names (search), and the decisions for the tenant's sealed record."""

    document: dict[str, Any]
    sealed_file: worker_pb2.SealedFile | None = None
    file_ids: tuple[str, ...] = ()
    decisions: tuple[worker_pb2.UsageRecord, ...] = ()


async def retrieval_answer(state: WorkerState, request: worker_pb2.SealedRequest, body: bytes,
                           service: RetrievalService | None, parse: Callable[[type[Any], bytes, str], Any]
                           ) -> RetrievalAnswer:
    """The inner answer to an opened sealed upload or search; refusals are OpenAIError (sealed)."""
    if service is None:
        raise OpenAIError(400, f"model {request.model} is not an embedding model: files and vector stores are "
                               "sealed and searched by an encoder's worker", code="invalid_value", param="model")
    try:
        if request.endpoint == FILES_ENDPOINT:
            return await _upload(state, request, parse(SealedUpload, body, request.model), service)
        return await _search(state, request, parse(SealedSearch, body, request.model), service)
    except InvalidRetrievalRequest as exc:
        raise OpenAIError(400, str(exc), code="invalid_value") from exc
    except SnapshotNeeded as exc:  # a change replaced it after the check before opening: the client asks again
        raise OpenAIError(409, "the vector store changed meanwhile; retry", code="conflict") from exc
    except SealedStoreError as exc:
        raise OpenAIError(409, "this worker cannot open or seal the vector store or file (its key differs, was "
                               "revoked, or the snapshot is older than one it was given)", code="conflict") from exc


async def _upload(state: WorkerState, request: worker_pb2.SealedRequest, upload: SealedUpload,
                  service: RetrievalService) -> RetrievalAnswer:
    if upload.purpose not in ("assistants", "user_data"):
        raise OpenAIError(400, "purpose must be 'assistants' or 'user_data'", param="purpose", code="invalid_value")
    try:
        content = base64.b64decode(upload.content, validate=True)
    except (binascii.Error, ValueError):
        raise OpenAIError(400, "content is not base64", param="file", code="invalid_value") from None
    if len(content) > MAX_FILE_BYTES:
        raise OpenAIError(413, f"a file may have at most {MAX_FILE_BYTES} bytes", param="file",
                          code="file_too_large")
    file_id, filename = check_id("file_id", request.file_id), upload.filename[:256] or "file"
    blob = await off_loop(service, lambda: service.seal_file(request.tenant, file_id, content))
    document = {"id": file_id, "object": "file", "bytes": len(content), "created_at": int(state.clock.now()),
                "filename": filename, "purpose": upload.purpose, "status": "processed", "expires_at": None,
                "status_details": None}
    sealed = worker_pb2.SealedFile(file_id=file_id, blob=blob, key_version=service.version, filename=filename,
                                   purpose=upload.purpose, bytes=len(content))
    return RetrievalAnswer(document, sealed_file=sealed)


async def _search(state: WorkerState, request: worker_pb2.SealedRequest, search: SealedSearch,
                  service: RetrievalService) -> RetrievalAnswer:
    if search.vector_store_id != request.store_id:
        # The gateway named another store than the one the client sealed its query for.
        raise OpenAIError(400, "the vector store searched is not the one the request names",
                          param="vector_store_id", code="invalid_value")
    queries = [search.query] if isinstance(search.query, str) else search.query
    if len(queries) != 1:
        raise OpenAIError(400, "query must be one string (or a list of one)", param="query", code="invalid_value")
    threshold = search.ranking_options.score_threshold if search.ranking_options else None
    readable, base = file_rights(state, request.key_id), SnapshotName.of(request.store_base)
    results = await off_loop(service, lambda: service.search(
        request.tenant, request.store_id, b"", queries[0], search.max_num_results,
        search.filters, threshold, search.rewrite_query, readable=readable, base=base))
    file_ids = tuple(sorted({r.file_id for r in results}))
    document = {"object": "vector_store.search_results.page", "search_query": queries,
                "data": json.loads(results_json(results)), "has_more": False, "next_page": None}
    return RetrievalAnswer(document, file_ids=file_ids, decisions=_retrieved(state, request, file_ids))


def _retrieved(state: WorkerState, request: worker_pb2.SealedRequest, file_ids: tuple[str, ...]
               ) -> tuple[worker_pb2.UsageRecord, ...]:
    """One signed `retrieval` decision per file that gave passages (the audit of a sealed
    search, for the tenant's sealed record: the gateway never sees it)."""
    guard = state.guard
    version = guard.policy_set.version if guard is not None and guard.policy_set is not None else 0
    notes = [GuardNote(RETRIEVE_ACTION, "allow", Decision(True, policy_id=request.store_id, policy_version=version,
                                                          rule=file_id)) for file_id in file_ids]
    return state.signer.decisions(request, notes, None, state.clock.now())

