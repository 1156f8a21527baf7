"""What workers owe after a call, stored once: the tenant's sealed decision records and the usage
of calls that ended early.

A sealed request's decisions reach the gateway only as the tenant's sealed record
(`protocol/sealed/decision_record.py`): ciphertext of a fixed size, one per opened sealed request,
decisions or none. The gateway audits each as an opaque entry (action `sealed-record`, decision
`record`, no reason): the worker id and its attested usage key, the record's sequence number, the
request id when it came on the call, and the record itself (base64). It never learns the rules or
the outcome; the tenant's audit view opens them (`sealed audit decisions`). Records come on the
call's trailers or, from a call that ended early, in a heartbeat; each (worker id, seq) is audited
once per gateway process (the tenant's view also removes duplicates, e.g. from two replicas).
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections import OrderedDict

from api.gateway.metering import Metering
from api.gateway.registry import WorkerInfo
from policy.audit import AuditLog
from policy.audit.entry import MetaValue
from protocol.rpc import worker_pb2
from protocol.sealed.decision_record import record_seq
from protocol.sealed.errors import SealedFormatError
from protocol.worker_status import Settle

log = logging.getLogger(__name__)
SEEN_MAX = 1 << 16  # (worker id, seq) pairs remembered for idempotence


class Settlement:
    def __init__(self, audit: AuditLog, metering: Metering) -> None:
        self.audit, self.metering = audit, metering
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()

    def sealed_record(self, worker: WorkerInfo, wire: bytes, request_id: str = "") -> bool:
        """Audit one sealed record from `worker` (once); False if it is not one."""
        try:
            seq = record_seq(wire)
        except SealedFormatError as exc:
            log.error("worker %s sent a malformed sealed decision record", worker.worker_id)
            self.audit.append(tenant=worker.tenant, action="sealed-record-invalid", decision="deny", reason=str(exc),
                              metadata={"worker_id": worker.worker_id[:64]})
            return False
        if (worker.worker_id, seq) in self._seen:
            return True
        meta: dict[str, MetaValue] = {"worker_id": worker.worker_id[:64], "worker_key": worker.usage_public_key,
                                      "seq": seq, "sealed_record": base64.b64encode(wire).decode()}
        if request_id:
            meta["request_id"] = request_id[:128]
        self.audit.append(tenant=worker.tenant, action="sealed-record", decision="record", metadata=meta)
        self._seen[(worker.worker_id, seq)] = None
        while len(self._seen) > SEEN_MAX:
            self._seen.popitem(last=False)
        return True

    async def owed(self, worker: WorkerInfo, settle: Settle) -> None:
        """A heartbeat's batch (its signature already checked against the worker's pinned key)."""
        for usage in settle.usage:
            try:
                payload = base64.b64decode(usage.payload, validate=True)
            except binascii.Error:
                log.error("worker %s owed a usage record that is not base64", worker.worker_id)
                continue
            record = worker_pb2.UsageRecord(payload=payload, signature=bytes.fromhex(usage.signature),
                                            public_key=bytes.fromhex(worker.usage_public_key))
            await self.metering.record(record, worker, None)
        for wire in settle.records:
            try:
                self.sealed_record(worker, base64.b64decode(wire, validate=True))
            except binascii.Error:
                log.error("worker %s owed a sealed record that is not base64", worker.worker_id)
