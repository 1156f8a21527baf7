"""Signed usage records: the worker signs, the gateway checks the signature and the facts, then stores
the row with the signed payload and the key, so the ledger can be checked again when it is read
(api/store/ledger.py) and by the tenant on its own machine (`sealed usage --verify`)."""

from __future__ import annotations

import base64
import logging

from api.errors import SealedApiError
from api.gateway.registry import WorkerInfo
from api.store.models import UsageRow
from protocol.rpc import worker_pb2
from protocol.usage_record import MAX_COUNT, UsageRecordInvalid, check_usage_record

__all__ = ["MAX_COUNT", "UsageRejected", "verify_usage"]
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
