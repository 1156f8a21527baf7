"""The tenant's sealed decision records, as this worker writes them (the format:
`protocol/sealed/decision_record.py`; docs/sealed-mode.md, "Decision records").

One record per opened sealed request, numbered 1, 2, 3, ... for this worker process (its boot id
and worker id say which), signed with the attested usage key and sealed to the tenant's
`decision_record_key` from its signed policy set. Without that key there is no record: a sealed
request's decisions then reach no one (the worker said so at start), and never the gateway in clear.
"""

from __future__ import annotations

import itertools
import json
import secrets
from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy.audit.worker_record import public_key_bytes
from protocol.heartbeat import worker_id_for
from protocol.rpc import worker_pb2
from protocol.sealed.decision_record import DECISION_FIELDS, DecisionRecord, seal_decision_record


class TenantRecords:
    def __init__(self, tenant_key_hex: str | None, usage_key: Ed25519PrivateKey, model: str, version: str) -> None:
        self.tenant_key = bytes.fromhex(tenant_key_hex) if tenant_key_hex else None
        self._usage_key, self._model, self._version = usage_key, model, version
        self.worker_id = worker_id_for(public_key_bytes(usage_key))
        self.boot_id = secrets.token_hex(8)
        self._seq = itertools.count(1)

    def seal(self, request: worker_pb2.SealedRequest, decisions: Sequence[worker_pb2.UsageRecord],
             at: float) -> bytes | None:
        """The next record, about `request` and the decisions signed for its choices; None without a key."""
        if self.tenant_key is None:
            return None
        fields = [json.loads(d.payload) for d in decisions]
        record = DecisionRecord(
            worker_id=self.worker_id, boot_id=self.boot_id, seq=next(self._seq), request_id=request.request_id[:128],
            tenant=request.tenant[:128], key_id=request.key_id[:128], model=self._model, version=self._version,
            at=round(at, 3), decisions=tuple({k: f[k] for k in DECISION_FIELDS} for f in fields))
        return seal_decision_record(record, self._usage_key, self.tenant_key)
