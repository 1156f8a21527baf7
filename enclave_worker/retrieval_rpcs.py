"""The worker's retrieval RPCs (SealFile, IngestFile, SearchStore, DeleteStoreFile, and the store
snapshots in segments: WriteStoreSnapshot, ReadStoreSnapshot): gRPC around
enclave_worker/retrieval/service.py, mixed into WorkerServicer.

A call that names its store's snapshot (``base``) is served from the worker's open stores; when the
worker lacks that snapshot it answers NOT_FOUND and the gateway sends it (WriteStoreSnapshot) and
asks again. A new snapshot made by such a call is read back with ReadStoreSnapshot. A sealed search
names its snapshot the same way (SealedRequest.store_base), checked before its envelope opens
(``sealed_store_held``).

Errors: a request that breaks the API's rules, or a segment list that is not one whole snapshot, is
INVALID_ARGUMENT; a snapshot or file that does not open (another key, tampered, a revoked key) is
FAILED_PRECONDITION with one message, an older snapshot than this worker has seen (a replay) is
FAILED_PRECONDITION saying so; a snapshot not held is NOT_FOUND; a worker without an encoder is
UNIMPLEMENTED. A file the worker cannot index is not an error of the
call: the reply says so (OpenAI's vector store file `failed` with `last_error`). SealFile and
SearchStore carry document text in clear, so a tenant that requires sealed mode refuses them.

The work (open, embed, index, reseal) runs on a thread (the engine's compute thread: off_loop), one
call at a time per service, never on the event loop: an ingest takes seconds, and a loop held that
long misses the worker's heartbeats (the gateway then drops the worker) and stalls its other RPCs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import NoReturn, TypeVar

import grpc

from enclave_worker.lifecycle import serving
from enclave_worker.retrieval.errors import InvalidRetrievalRequest, SealedStoreError, SnapshotNeeded, StaleSnapshot
from enclave_worker.retrieval.service import FileUnreadable, RetrievalService, StoreEncoder, results_json, strategy_json
from enclave_worker.retrieval.store_cache import StoreCacheSettings
from enclave_worker.retrieval.vector_store import StoredFile
from enclave_worker.state import WorkerState
from protocol.rpc import worker_pb2
from protocol.rpc.snapshot_segments import SegmentAssembler, SnapshotName, SnapshotTransferError, segments
from protocol.sealed.http import SEARCH_ENDPOINT

T = TypeVar("T")


async def off_loop(service: RetrievalService, work: Callable[[], T]) -> T:
    """``work`` on a thread under the service's lock (the calls keep the order they had on the loop):
    the engine's compute thread when the encoder offers it (ComputeEncoder.submit: the embedding and
    faiss then run in the one OpenMP team the model was built in, with no second hop), else a
    thread of asyncio's pool (an encoder that computes on its caller's thread, as the tests' do)."""

    def locked() -> T:
        with service.calls:
            return work()

    submit = getattr(service.encoder, "submit", None)
    if submit is None:
        return await asyncio.to_thread(locked)
    return await asyncio.wrap_future(submit(locked))


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

    def current_retrieval(self) -> RetrievalService | None:
        """This worker's retrieval (None: no embedding model), shared by the RPCs and sealed requests
        (sealed_retrieval.py), so the rollback check sees every snapshot either was given."""
        booted = booted_encoder(self.state)
        if booted is not None and (self.retrieval is None or self.retrieval.encoder is not booted):
            # The encoder this worker booted (again, after a wipe: a new one; what the old one saw is gone).
            self.retrieval = retrieval_for(self.state, booted)
        return self.retrieval

    async def _service(self, context: grpc.aio.ServicerContext, *, content_in_clear: bool) -> RetrievalService:
        guard = self.state.guard
        if content_in_clear and guard is not None and guard.policy_set is not None and guard.policy_set.require_sealed:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this tenant requires sealed mode")
        if self.current_retrieval() is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this worker has no embedding model")
        if not serving(self.state) or self.state.booted is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model unavailable")
        assert self.retrieval is not None
        return self.retrieval

    async def sealed_store_held(self, request: worker_pb2.SealedRequest,
                                context: grpc.aio.ServicerContext) -> Callable[[], None]:
        """Before a sealed search's envelope opens: the snapshot it names is held here (pinned until the
        returned release), else NOT_FOUND, and the gateway sends it and relays the same request again
        (an envelope opens once: a replay is refused, so this cannot wait until it is open). A worker
        without an encoder, or not serving, lets the request open and be refused as such."""
        service = self.current_retrieval()
        if request.endpoint != SEARCH_ENDPOINT or service is None or not serving(self.state):
            return _nothing
        if not request.HasField("store_base") or request.store_base.store_id != request.store_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "a sealed search names its vector store's snapshot (store_base, of store_id)")
        name = SnapshotName.of(request.store_base)
        try:
            await off_loop(service, lambda: service.hold(request.tenant, name))
        except (InvalidRetrievalRequest, SealedStoreError, SnapshotNeeded) as exc:
            await self._refuse(context, exc)
        return lambda: service.cache.unpin(name.store_id)

    @staticmethod
    async def _refuse(context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
        if isinstance(exc, SnapshotNeeded):
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        if isinstance(exc, StaleSnapshot):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "the vector store snapshot is older than one this worker has seen (a replay)")
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
        base = _base(request)
        try:
            attributes = _json(request.attributes_json, "attributes")
            chunking = _json(request.chunking_json, "chunking_strategy")
            done = await off_loop(service, lambda: service.ingest(
                request.tenant, request.store_id, request.snapshot, request.file_id, request.filename,
                request.file_blob, attributes, chunking, base))
        except FileUnreadable as exc:
            return worker_pb2.IngestFileReply(error_code=exc.code, error_message=exc.message)
        except (InvalidRetrievalRequest, SealedStoreError, SnapshotNeeded) as exc:
            await self._refuse(context, exc)
        blob = b"" if base is not None else done.snapshot.blob  # by name: read with ReadStoreSnapshot
        return worker_pb2.IngestFileReply(
            snapshot=worker_pb2.SealedBlob(blob=blob, version=done.snapshot.version, key_version=service.version),
            usage_bytes=done.file.usage_bytes, chunking_json=strategy_json(done.file.strategy),
            made=_made(request.store_id, done.snapshot.version, done.snapshot.sha256))

    async def SearchStore(self, request: worker_pb2.SearchStoreRequest, context: grpc.aio.ServicerContext
                          ) -> worker_pb2.SearchStoreReply:
        service = await self._service(context, content_in_clear=True)
        base = _base(request)
        try:
            filters, readable = _json(request.filters_json, "filters"), file_rights(self.state, request.key_id)
            threshold = request.score_threshold if request.has_score_threshold else None
            results = await off_loop(service, lambda: service.search(
                request.tenant, request.store_id, request.snapshot, request.query, request.max_num_results,
                filters, threshold, request.rewrite_query, readable=readable, base=base))
        except (InvalidRetrievalRequest, SealedStoreError, SnapshotNeeded) as exc:
            await self._refuse(context, exc)
        return worker_pb2.SearchStoreReply(results_json=results_json(results),
                                           file_ids=sorted({r.file_id for r in results}))

    async def DeleteStoreFile(self, request: worker_pb2.DeleteStoreFileRequest, context: grpc.aio.ServicerContext
                              ) -> worker_pb2.SealedBlob:
        service = await self._service(context, content_in_clear=False)
        base = _base(request)
        try:
            snapshot = await off_loop(service, lambda: service.delete_file(request.tenant, request.store_id,
                                                                           request.snapshot, request.file_id, base))
        except (InvalidRetrievalRequest, SealedStoreError, SnapshotNeeded) as exc:
            await self._refuse(context, exc)
        return worker_pb2.SealedBlob(blob=b"" if base is not None else snapshot.blob, version=snapshot.version,
                                     key_version=service.version,
                                     made=_made(request.store_id, snapshot.version, snapshot.sha256))

    async def WriteStoreSnapshot(self, request_iterator: AsyncIterator[worker_pb2.StoreSnapshotSegment],
                                 context: grpc.aio.ServicerContext) -> worker_pb2.StoreSnapshotAck:
        """A store's sealed snapshot, in segments, after this worker said it lacks it: checked whole
        (segments, digest, then the AEAD and the version as it opens) and held open."""
        service = await self._service(context, content_in_clear=False)
        assembler = SegmentAssembler()
        try:
            async for segment in request_iterator:
                assembler.add(segment)
            tenant, name, blob = assembler.finish()
            await off_loop(service, lambda: service.load(tenant, name, blob))
        except (SnapshotTransferError, InvalidRetrievalRequest, SealedStoreError) as exc:
            await self._refuse(context, exc)
        return worker_pb2.StoreSnapshotAck(ref=name.ref())

    async def ReadStoreSnapshot(self, request: worker_pb2.ReadStoreSnapshotRequest,
                                context: grpc.aio.ServicerContext) -> AsyncIterator[worker_pb2.StoreSnapshotSegment]:
        """The snapshot an IngestFile or DeleteStoreFile by name just made, in segments."""
        service = await self._service(context, content_in_clear=False)
        name = SnapshotName.of(request.ref)
        try:
            blob = await off_loop(service, lambda: service.made(request.tenant, name))
        except (InvalidRetrievalRequest, SealedStoreError, SnapshotNeeded) as exc:
            await self._refuse(context, exc)
        for segment in segments(request.tenant, name, blob):
            yield segment
        await off_loop(service, lambda: service.read(name))


def _base(request: worker_pb2.IngestFileRequest | worker_pb2.SearchStoreRequest
          | worker_pb2.DeleteStoreFileRequest) -> SnapshotName | None:
    """The snapshot the gateway names (None: it sent the snapshot itself, the first protocol)."""
    return SnapshotName.of(request.base) if request.HasField("base") else None


def _nothing() -> None:
    return None


def _made(store_id: str, version: int, sha256: bytes) -> worker_pb2.StoreSnapshotRef:
    return SnapshotName(store_id, version, sha256).ref()


def file_rights(state: WorkerState, key_id: str) -> Callable[[StoredFile], bool]:
    """The tenant's signed `file_access` for this caller (policy/file_access.py): checked on every file
    inside the search, so a file the caller may not read gives no passage. No section: every file."""
    guard = state.guard
    access = guard.policy_set.file_access if guard is not None and guard.policy_set is not None else None
    if access is None:
        return lambda _: True
    return lambda f: access.readable(key_id, f.attributes)


def retrieval_for(state: WorkerState, encoder: StoreEncoder | None) -> RetrievalService | None:
    """This worker's retrieval over ``encoder`` (None: no embedding model, the RPCs are refused); its
    keys come from the data key the broker released, read at every call (wiped on revocation)."""
    if encoder is None:
        return None
    settings = state.settings

    def data_key() -> bytes:
        booted = state.booted
        return booted.released.data_key if booted is not None else b""

    service = RetrievalService(encoder, data_key, settings.tenant, settings.model, settings.version,
                               cache=StoreCacheSettings(settings.store_cache_bytes))
    state.live.on_wipe(service.evict)  # revocation: no opened store outlives the key
    return service


def booted_encoder(state: WorkerState) -> StoreEncoder | None:
    """The encoder of a worker whose package is an embedding model (LiveState.embedder, issue #51's
    embeddings work), once booted; None on a chat model's worker or before boot."""
    return state.live.embedder
