"""Metering: a worker's signed usage record, verified against the key it attested and the request
it answers, counted in the Prometheus metrics and written (group commit) before the stream ends.
The row keeps the signed payload and the key, so the ledger can be checked again when it is read
(api/store/ledger.py) and by the tenant on its own machine (`sealed usage --verify`)."""

from __future__ import annotations

import asyncio
import base64
import logging

from api.errors import SealedApiError
from api.gateway.metrics import Metrics
from api.gateway.registry import WorkerInfo
from api.gateway.usage_writer import UsageWriter
from api.store.models import UsageRow
from protocol.rpc import worker_pb2
from protocol.usage_record import UsageRecordInvalid, check_usage_record

log = logging.getLogger(__name__)


class UsageRejected(SealedApiError):
    pass


def verify_usage(record: worker_pb2.UsageRecord, worker: WorkerInfo, request_id: str | None, tenant: str) -> UsageRow:
    """Check a record against the key the worker registered with and the request it answers
    (`request_id` None: a record the worker owed by heartbeat, which names its own request)."""
    if record.public_key.hex() != worker.usage_public_key:
        raise UsageRejected("usage record signed by a key the worker did not register")
    try:
        facts = check_usage_record(record.payload, record.signature, record.public_key)
    except UsageRecordInvalid as exc:
        raise UsageRejected(str(exc)) from None
    if request_id is None:  # owed by heartbeat: the record names its request
        request_id = facts.request_id
    if facts.request_id != request_id or facts.tenant != tenant:
        raise UsageRejected("usage record is for another request")
    return UsageRow(request_id=request_id, tenant=tenant, key_id=facts.key_id, model=facts.model,
                    version=facts.version, worker_id=worker.worker_id, prompt_tokens=facts.prompt_tokens,
                    completion_tokens=facts.completion_tokens, worker_seconds=facts.worker_seconds,
                    signature=record.signature.hex(), payload=base64.b64encode(record.payload).decode(),
                    public_key=worker.usage_public_key)


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
