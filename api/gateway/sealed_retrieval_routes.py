"""Retrieval's sealed routes (docs/retrieval.md "Sealed mode"): a file upload and a vector store search
sealed to the attested encoder's worker, through the one sealed relay (sealed_router.sealed_relay).

What the gateway handles of them is what it routes, meters and lists by: the store id in the URL
(whose sealed snapshot it names, as a plaintext search does: store_snapshots.py; the worker checks
the name before the envelope opens and, lacking it, gets it in segments before the same envelope
is relayed again), the file id it gives an upload, and what the worker's final
chunk leaves for it (the file's ciphertext under the store key, its name, purpose and size). The
query, the document and the passages stay ciphertext; a search's file ids are in the client's receipt
and the tenant's sealed decision record, not the gateway's audit, which says only that a sealed
upload or search happened (ids and sizes)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from api.gateway.dependencies import ApiKey, Service
from api.gateway.errors import GatewayError
from api.gateway.files_routes import get_retrieval
from api.gateway.generation import CleanupStreamingResponse
from api.gateway.registry import WorkerInfo
from api.gateway.sealed_router import sealed_relay
from api.gateway.vector_stores import MAX_FILE_BYTES, GatewayRetrieval, new_id
from api.store.repo import KeyRecord
from protocol.rpc import worker_pb2
from protocol.sealed.http import FILES_ENDPOINT, HEADER_MODEL, SEARCH_ENDPOINT

router = APIRouter()


def _keep_file(retrieval: GatewayRetrieval, key: KeyRecord, model: str, file_id: str,
               chunk: worker_pb2.SealedChunk) -> None:
    """The row of a file the worker sealed, kept before the client hears the upload is done. A worker
    answer without one (a refusal, sealed for the client) keeps nothing."""
    if not chunk.HasField("sealed_file"):
        return
    f = chunk.sealed_file
    if (f.file_id != file_id or not f.blob or not f.key_version or f.purpose not in ("assistants", "user_data")
            or f.bytes > MAX_FILE_BYTES or len(f.filename) > 256):
        raise GatewayError(502, "the worker returned a malformed sealed file", type_="server_error")
    retrieval.rows.put_file(file_id=file_id, tenant=key.tenant, purpose=f.purpose, filename=f.filename or "file",
                            size=f.bytes, model=model, version=f.key_version, blob=f.blob)
    retrieval.service.audit.append(tenant=key.tenant, action="file.create", decision="allow", reason="caller",
                                   metadata={"key_id": key.key_id, "file_id": file_id, "bytes": f.bytes,
                                             "sealed": True})


@router.post("/v1/sealed/files", response_model=None)
async def sealed_upload(request: Request, key: ApiKey, service: Service,
                        retrieval: GatewayRetrieval = Depends(get_retrieval)) -> CleanupStreamingResponse:
    """files.create, sealed: the gateway names the file; the worker seals its content under the file key."""
    file_id, model = new_id("file"), request.headers.get(HEADER_MODEL, "")

    def routed(sealed: worker_pb2.SealedRequest) -> None:
        sealed.file_id = file_id

    # Nothing generated, as a plaintext upload: no tokens reserved (a document's size is not its tokens).
    return await sealed_relay(FILES_ENDPOINT, request, key, service, routed=routed, reserved_tokens=0,
                              final=lambda chunk: _keep_file(retrieval, key, model, file_id, chunk))


@router.post("/v1/sealed/vector_stores/{store_id}/search", response_model=None)
async def sealed_search(store_id: str, request: Request, key: ApiKey, service: Service,
                        retrieval: GatewayRetrieval = Depends(get_retrieval)) -> CleanupStreamingResponse:
    """vector_stores.search, sealed: the envelope names the store's snapshot (id, version, digest) to
    the pinned worker of its model, which serves it from the stores it holds open; a worker that lacks
    it is sent it in segments first. A store with no file yet (version 0) is searched empty."""
    store = retrieval.store(key, store_id)  # the row without the snapshot's bytes
    model = request.headers.get(HEADER_MODEL, "")
    if store.model and store.model != model:
        raise GatewayError(400, "the vector store is sealed under another model than the request's",
                           param="model", code="invalid_value")
    name = retrieval.snapshots.name(key.tenant, store)

    def routed(sealed: worker_pb2.SealedRequest) -> None:
        sealed.store_id = store.id
        sealed.store_base.CopyFrom(name.ref())

    async def missing(worker: WorkerInfo) -> None:
        await retrieval.snapshots.send(worker, key.tenant, name)

    answer = await sealed_relay(SEARCH_ENDPOINT, request, key, service, routed=routed, reserved_tokens=0,
                                missing=missing)
    # That a sealed search ran, on which store: not what it found (the tenant's sealed record has that).
    service.audit.append(tenant=key.tenant, action="vector_store.search", decision="allow", reason="caller",
                         metadata={"key_id": key.key_id, "vector_store_id": store_id,
                                   "search_id": new_id("search"), "sealed": True})
    return answer
