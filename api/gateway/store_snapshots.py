"""Worker calls that name a vector store's snapshot instead of carrying it (issue #51).

A worker keeps the stores it opened in memory (enclave_worker/retrieval/store_cache.py). So the
gateway names the snapshot it holds (store id, version, SHA-256) and sends the bytes only when the
worker answers that it lacks them (SnapshotNeeded), in segments (protocol/rpc/snapshot_segments.py),
then asks again, on the same worker (a sealed search likewise: the worker checks the name before
its envelope opens, and the gateway relays the same envelope again). A change (ingest, delete) made
by name leaves the new snapshot in the worker, and the gateway reads it back from that worker in
segments before it stores it.

The digest of a stored snapshot is computed once per (store, version): a version, once stored, never
changes (compare-and-set on the version), and store ids are never reused. The gateway still holds
no key: the digest is of ciphertext."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from api.gateway.errors import GatewayError
from api.gateway.grpc_client import SnapshotNeeded, WorkerUnavailable
from api.gateway.registry import WorkerInfo
from api.gateway.service import GatewayService
from api.store.repo import KeyRecord
from api.store.retrieval import RetrievalStore, StoredVectorStore
from protocol.rpc import worker_pb2
from protocol.rpc.snapshot_segments import SnapshotName, segments

CALL_TIMEOUT_S = 30.0
# Ingestion is synchronous (OpenAI's `completed` on the first poll): embedding a file on a CPU takes
# seconds per 50 chunks on a quiet machine, and took over 30 s on a loaded one (the 10,000-chunk
# benchmark got 504s), so it has its own bound.
METHOD_TIMEOUT_S = {"IngestFile": 300.0}
TRANSFER_TIMEOUT_S = 120.0  # a whole snapshot (up to 1 GiB) one way
MAX_DIGESTS = 4096


class StoreChanged(GatewayError):
    """The store's snapshot changed while a call was being made: the caller's compare-and-set loop retries."""

    def __init__(self) -> None:
        super().__init__(409, "the vector store changed meanwhile; retry", code="conflict")


class SnapshotCalls:
    def __init__(self, service: GatewayService, rows: RetrievalStore) -> None:
        self.service, self.rows = service, rows
        self._digests: OrderedDict[tuple[str, int], bytes] = OrderedDict()

    def name(self, tenant: str, store: StoredVectorStore) -> SnapshotName:
        """What names ``store``'s stored snapshot (version 0, no digest: a store that has none yet)."""
        if store.snapshot_version == 0:
            return SnapshotName(store.id, 0, b"")
        digest = self._digests.get((store.id, store.snapshot_version))
        if digest is None:
            blob = store.snapshot or self.rows.snapshot(tenant, store.id, store.snapshot_version)
            if blob is None:
                raise StoreChanged()
            digest = hashlib.sha256(blob).digest()
            self.remember(SnapshotName(store.id, store.snapshot_version, digest))
        self._digests.move_to_end((store.id, store.snapshot_version))
        return SnapshotName(store.id, store.snapshot_version, digest)

    def remember(self, name: SnapshotName) -> None:
        self._digests[(name.store_id, name.version)] = name.sha256
        while len(self._digests) > MAX_DIGESTS:
            self._digests.popitem(last=False)

    async def call(
        self, key: KeyRecord, store: StoredVectorStore, method: str, build: Callable[[worker_pb2.StoreSnapshotRef], Any]
    ) -> tuple[Any, WorkerInfo]:
        """``method`` with the request ``build`` makes for the store's snapshot by name, on a worker of
        the store's model version (only its key opens the store); the reply and the worker that gave it."""
        name = self.name(key.tenant, store)
        tried: set[str] = set()
        while True:
            worker = self.service.registry.pick(key.tenant, store.model, {store.version: 100.0}, "", frozenset(tried))
            try:
                return await self._on(worker, key.tenant, store, name, method, build(name.ref())), worker
            except WorkerUnavailable:
                tried.add(worker.worker_id)

    async def _on(
        self, worker: WorkerInfo, tenant: str, store: StoredVectorStore, name: SnapshotName, method: str, request: Any
    ) -> Any:
        clients = self.service.clients
        timeout_s = METHOD_TIMEOUT_S.get(method, CALL_TIMEOUT_S)
        try:
            return await clients.unary(worker.grpc_address, worker.tls_cert, method, request, timeout_s)
        except SnapshotNeeded:
            await self.send(worker, tenant, name)
        # Once more: a worker that lacks it again (evicted at once under memory pressure) is an error.
        return await clients.unary(worker.grpc_address, worker.tls_cert, method, request, timeout_s)

    async def send(self, worker: WorkerInfo, tenant: str, name: SnapshotName) -> None:
        """The stored snapshot ``name`` to a worker that said it lacks it, in segments (a sealed search's
        too: sealed_retrieval_routes.py); StoreChanged when that version is no longer the stored one."""
        blob = self.rows.snapshot(tenant, name.store_id, name.version)
        if blob is None:
            raise StoreChanged()
        await self.service.clients.write_snapshot(
            worker.grpc_address, worker.tls_cert, segments(tenant, name, blob), TRANSFER_TIMEOUT_S
        )

    async def read_made(self, worker: WorkerInfo, tenant: str, made: worker_pb2.StoreSnapshotRef) -> bytes:
        """The snapshot a change by name made, from the worker that made it (digest checked); the
        caller ``remember``s its name once it is stored (another change may win that version)."""
        blob: bytes = await self.service.clients.read_snapshot(
            worker.grpc_address,
            worker.tls_cert,
            worker_pb2.ReadStoreSnapshotRequest(tenant=tenant, ref=made),
            TRANSFER_TIMEOUT_S,
        )
        return blob
