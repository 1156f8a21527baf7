"""Metering: a worker's signed usage record, verified against the key it attested, counted in the
Prometheus metrics and written (group commit) before the stream ends."""

from __future__ import annotations

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

    async def record(self, record: worker_pb2.UsageRecord, worker: WorkerInfo,
                     request: worker_pb2.GenerateRequest | worker_pb2.SealedRequest | None) -> None:
        """Meter a signed record: the one on a call's final chunk (`request`: that call's), or one the
        worker owed by heartbeat (`request` None: a call that ended early). Stored once per worker
        and request id, so a record that came both ways counts once."""
        try:
            row = verify_usage(record, worker, request.request_id if request else None,
                               request.tenant if request else worker.tenant)
        except UsageRejected as exc:
            log.error("usage record refused from worker %s: %s", worker.worker_id, exc)
            return
        if await self.writer.record(row):  # group commit, durable before the stream ends
            self.metrics.prompt_tokens.labels(row.tenant, row.model).inc(row.prompt_tokens)
            self.metrics.generation_tokens.labels(row.tenant, row.model).inc(row.completion_tokens)
            self.metrics.worker_seconds.labels(row.tenant).inc(row.worker_seconds)
