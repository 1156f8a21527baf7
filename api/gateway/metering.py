"""Metering: a worker's signed usage record, verified against the key it attested, counted in the
Prometheus metrics and written (group commit) before the stream ends."""

from __future__ import annotations

import asyncio
import logging

from api.gateway.metrics import Metrics
from api.gateway.registry import WorkerInfo
from api.gateway.usage import UsageRejected, verify_usage
from api.gateway.usage_writer import UsageWriter
from protocol.rpc import worker_pb2

log = logging.getLogger(__name__)


class Metering:
    def __init__(self, metrics: Metrics, writer: UsageWriter) -> None:
        self.metrics, self.writer = metrics, writer
        self._keys_kept: set[str] = set()  # usage keys whose attestation document is stored

    async def _keep_key(self, worker: WorkerInfo) -> None:
        """Store the attestation document of the key that signed a row, once, before the row: the
        ledger counts only rows of a registered key, and the tenant's export needs the document."""
        if worker.usage_public_key in self._keys_kept:
            return
        doc = {k: v for k, v in (worker.attestation_doc or {}).items()
               if k in ("tee", "insecure", "evidence", "token", "model_digest", "sealed_key_id", "promises")}
        doc.update({"worker_id": worker.worker_id, "tenant": worker.tenant, "model": worker.model,
                    "version": worker.version, "usage_public_key": worker.usage_public_key,
                    "grpc_tls_cert": worker.tls_cert or None})
        await asyncio.to_thread(self.writer.store.remember_usage_key, worker.usage_public_key, worker.tenant,
                                worker.worker_id, doc)
        self._keys_kept.add(worker.usage_public_key)

    async def record(self, record: worker_pb2.UsageRecord, worker: WorkerInfo,
                     request: worker_pb2.GenerateRequest | worker_pb2.SealedRequest | worker_pb2.EmbedRequest | None
                     ) -> None:
        """Meter a signed record: the one on a call's final chunk (`request`: that call's), or one the
        worker owed by heartbeat (`request` None: a call that ended early). Stored once per worker
        and request id, so a record that came both ways counts once."""
        try:
            row = verify_usage(record, worker, request.request_id if request else None,
                               request.tenant if request else worker.tenant)
        except UsageRejected as exc:
            log.error("usage record refused from worker %s: %s", worker.worker_id, exc)
            return
        await self._keep_key(worker)
        if await self.writer.record(row):  # group commit, durable before the stream ends
            self.metrics.prompt_tokens.labels(row.tenant, row.model).inc(row.prompt_tokens)
            self.metrics.generation_tokens.labels(row.tenant, row.model).inc(row.completion_tokens)
            self.metrics.worker_seconds.labels(row.tenant).inc(row.worker_seconds)
