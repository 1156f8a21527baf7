"""What the worker still owes the gateway, delivered with its next heartbeats.

A request normally settles on its own call: the signed usage record on the final chunk, the
tenant's sealed decision record in the trailers. A call that ends before that (the client left,
the gateway gave up, the stream broke) leaves both here: the usage record for the tokens the
engine ran, and the sealed record (so the tenant's sequence has no hole the worker made). The
heartbeat (`heartbeat.py`, signed like the rest of the beat) carries a batch; a gateway that
answers `settled` has stored it (usage idempotently by request id, records by worker id and seq),
and only then is the batch dropped here.

Bounded: past `max_items` the oldest item is dropped and counted (a dropped record is a gap the
tenant sees; a dropped usage record is lost metering, logged).
"""

from __future__ import annotations

import base64
import itertools
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from protocol.rpc import worker_pb2

log = logging.getLogger(__name__)
MAX_ITEMS = 4096
BATCH_USAGE = 64  # per heartbeat; a usage record is ~300 bytes
BATCH_RECORDS = 16  # per heartbeat; a sealed record is ~5.5 KiB in base64


@dataclass(frozen=True)
class OutboxBatch:
    """One heartbeat's share; `ids` are what a `settled` answer lets the worker forget."""

    usage: tuple[worker_pb2.UsageRecord, ...]
    records: tuple[bytes, ...]
    ids: frozenset[int]

    def to_json(self) -> dict[str, Any] | None:
        if not self.usage and not self.records:
            return None
        return {"usage": [{"payload": base64.b64encode(u.payload).decode(), "signature": u.signature.hex()}
                          for u in self.usage],
                "records": [base64.b64encode(r).decode() for r in self.records]}


class Outbox:
    def __init__(self, max_items: int = MAX_ITEMS) -> None:
        self.max_items = max_items
        self._ids = itertools.count(1)
        self._usage: deque[tuple[int, worker_pb2.UsageRecord]] = deque()
        self._records: deque[tuple[int, bytes]] = deque()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._usage) + len(self._records)

    def owe_usage(self, record: worker_pb2.UsageRecord) -> None:
        self._usage.append((next(self._ids), record))
        self._bound()

    def owe_record(self, wire: bytes) -> None:
        self._records.append((next(self._ids), wire))
        self._bound()

    def _bound(self) -> None:
        while len(self) > self.max_items:
            oldest = self._usage if self._usage and (not self._records or self._usage[0][0] < self._records[0][0]) \
                else self._records
            oldest.popleft()
            self.dropped += 1
            log.error("outbox full: dropped the oldest undelivered %s (%d dropped so far)",
                      "usage record" if oldest is self._usage else "sealed decision record", self.dropped)

    def batch(self) -> OutboxBatch:
        usage = list(itertools.islice(self._usage, BATCH_USAGE))
        records = list(itertools.islice(self._records, BATCH_RECORDS))
        return OutboxBatch(tuple(u for _, u in usage), tuple(r for _, r in records),
                           frozenset(i for i, _ in itertools.chain(usage, records)))

    def settled(self, batch: OutboxBatch) -> None:
        """A gateway stored `batch`: forget it (not what was added since, nor what it did not carry)."""
        self._usage = deque(e for e in self._usage if e[0] not in batch.ids)
        self._records = deque(e for e in self._records if e[0] not in batch.ids)
