"""The worker's retrieval RPCs (SealFile, IngestFile, SearchStore, DeleteStoreFile): gRPC around
enclave_worker/retrieval/service.py, mixed into WorkerServicer.

Errors: a request that breaks the API's rules is INVALID_ARGUMENT; a snapshot or file that does not
open (another key, tampered, replayed, a revoked key) is FAILED_PRECONDITION with one message; a
worker without an encoder is UNIMPLEMENTED. A file the worker cannot index is not an error of the
call: the reply says so (OpenAI's vector store file `failed` with `last_error`). SealFile and
SearchStore carry document text in clear, so a tenant that requires sealed mode refuses them.

The work (open, embed, index, reseal) runs on a thread, one call at a time per service, never on the
event loop: an ingest takes seconds, and a loop held that long misses the worker's heartbeats (the
gateway then drops the worker) and stalls its other RPCs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import NoReturn, TypeVar

import grpc

from enclave_worker.lifecycle import serving
from enclave_worker.retrieval.errors import InvalidRetrievalRequest, SealedStoreError
from enclave_worker.retrieval.service import FileUnreadable, RetrievalService, StoreEncoder, results_json, strategy_json
from enclave_worker.retrieval.vector_store import StoredFile
from enclave_worker.state import WorkerState
from protocol.rpc import worker_pb2

T = TypeVar("T")


async def off_loop(service: RetrievalService, work: Callable[[], T]) -> T:
    """``work`` on a thread under the service's lock (the calls keep the order they had on the loop)."""

    def locked() -> T:
        with service.calls:
            return work()

    return await asyncio.to_thread(locked)


def _json(raw: str, field: str) -> object:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise InvalidRetrievalRequest(f"{field} must be JSON") from None


class RetrievalRpcs:
    state: WorkerState
    retrieval: RetrievalService | None

    async def _service(self, context: grpc.aio.ServicerContext, *, content_in_clear: bool) -> RetrievalService:
        guard = self.state.guard
        if content_in_clear and guard is not None and guard.policy_set is not None and guard.policy_set.require_sealed:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this tenant requires sealed mode")
        booted = booted_encoder(self.state)
        if booted is not None and (self.retrieval is None or self.retrieval.encoder is not booted):
            # The encoder this worker booted (again, after a wipe: a new one; what the old one saw is gone).
            self.retrieval = retrieval_for(self.state, booted)
        if self.retrieval is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this worker has no embedding model")
        if not serving(self.state) or self.state.booted is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model unavailable")
        assert self.retrieval is not None
        return self.retrieval

    def _rights(self, key_id: str) -> Callable[[StoredFile], bool]:
        """The tenant's signed `file_access` for this caller (policy/file_access.py): checked on every
        file inside the search (faiss's selector), so a file the caller may not read gives no passage."""
        guard = self.state.guard
        access = guard.policy_set.file_access if guard is not None and guard.policy_set is not None else None
        if access is None:
            return lambda _: True
        return lambda f: access.readable(key_id, f.attributes)

    @staticmethod
    async def _refuse(context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
        if isinstance(exc, SealedStoreError):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "this worker cannot open or seal the vector store or file "
                                "(its key differs or was revoked)")
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        raise AssertionError("context.abort raises")

    async def SealFile(self, request: worker_pb2.SealFileRequest, context: grpc.aio.ServicerContext
                       ) -> worker_pb2.SealedBlob:
        service = await self._service(context, content_in_clear=True)
        try:
            blob = await off_loop(service, lambda: service.seal_file(request.tenant, request.file_id,
                                                                     request.content))
        except (InvalidRetrievalRequest, SealedStoreError) as exc:
            await self._refuse(context, exc)
        return worker_pb2.SealedBlob(blob=blob, version=0, key_version=service.version)

    async def IngestFile(self, request: worker_pb2.IngestFileRequest, context: grpc.aio.ServicerContext
                         ) -> worker_pb2.IngestFileReply:
        service = await self._service(context, content_in_clear=False)
        try:
            attributes = _json(request.attributes_json, "attributes")
            chunking = _json(request.chunking_json, "chunking_strategy")
            done = await off_loop(service, lambda: service.ingest(
                request.tenant, request.store_id, request.snapshot, request.file_id, request.filename,
                request.file_blob, attributes, chunking))
        except FileUnreadable as exc:
            return worker_pb2.IngestFileReply(error_code=exc.code, error_message=exc.message)
        except (InvalidRetrievalRequest, SealedStoreError) as exc:
            await self._refuse(context, exc)
        return worker_pb2.IngestFileReply(
            snapshot=worker_pb2.SealedBlob(blob=done.snapshot.blob, version=done.snapshot.version,
                                        key_version=service.version),
            usage_bytes=done.file.usage_bytes, chunking_json=strategy_json(done.file.strategy))

    async def SearchStore(self, request: worker_pb2.SearchStoreRequest, context: grpc.aio.ServicerContext
                          ) -> worker_pb2.SearchStoreReply:
        service = await self._service(context, content_in_clear=True)
        try:
            filters, readable = _json(request.filters_json, "filters"), self._rights(request.key_id)
            threshold = request.score_threshold if request.has_score_threshold else None
            results = await off_loop(service, lambda: service.search(
                request.tenant, request.store_id, request.snapshot, request.query, request.max_num_results,
                filters, threshold, request.rewrite_query, readable=readable))
        except (InvalidRetrievalRequest, SealedStoreError) as exc:
            await self._refuse(context, exc)
        return worker_pb2.SearchStoreReply(results_json=results_json(results),
                                           file_ids=sorted({r.file_id for r in results}))

    async def DeleteStoreFile(self, request: worker_pb2.DeleteStoreFileRequest, context: grpc.aio.ServicerContext
                              ) -> worker_pb2.SealedBlob:
        service = await self._service(context, content_in_clear=False)
        try:
            snapshot = await off_loop(service, lambda: service.delete_file(request.tenant, request.store_id,
                                                                           request.snapshot, request.file_id))
        except (InvalidRetrievalRequest, SealedStoreError) as exc:
            await self._refuse(context, exc)
        return worker_pb2.SealedBlob(blob=snapshot.blob, version=snapshot.version, key_version=service.version)


def retrieval_for(state: WorkerState, encoder: StoreEncoder | None) -> RetrievalService | None:
    """This worker's retrieval over ``encoder`` (None: no embedding model, the RPCs are refused); its
    keys come from the data key the broker released, read at every call (wiped on revocation)."""
    if encoder is None:
        return None
    settings = state.settings

    def data_key() -> bytes:
        booted = state.booted
        return booted.released.data_key if booted is not None else b""

    return RetrievalService(encoder, data_key, settings.tenant, settings.model, settings.version)


def booted_encoder(state: WorkerState) -> StoreEncoder | None:
    """The encoder of a worker whose package is an embedding model (LiveState.embedder, issue #51's
    embeddings work), once booted; None on a chat model's worker or before boot."""
    return state.live.embedder
