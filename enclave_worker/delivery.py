"""How a call's signed records reach the gateway: with the call, or, if it ends early, by heartbeat.

A sealed call owes two things besides its chunks: the usage record the gateway meters (on the
final chunk) and the tenant's sealed decision record (in the trailers, never the decisions in
clear). A plaintext call owes its usage record. When the call ends before the handler finished
(the client or the gateway went away, the stream broke), whatever it had not delivered goes to
the outbox (`outbox.py`) for the next heartbeats; the gateway stores each once, so a record that
also arrived on the call is not counted twice. `settle` runs from the handler's `finally` and
from the RPC's done callback, whichever comes first; it acts once.
"""

from __future__ import annotations

from collections.abc import Callable

from enclave_worker.state import WorkerState
from protocol.rpc import worker_pb2
from protocol.sealed.decision_record import RECORD_METADATA_KEY


class Delivery:
    """One call's owed records. `usage` and `decisions` are read when needed (so far, if cut short)."""

    def __init__(self, state: WorkerState, usage: Callable[[], worker_pb2.UsageRecord | None],
                 sealed: tuple[worker_pb2.SealedRequest, Callable[[], tuple[worker_pb2.UsageRecord, ...]]] | None
                 = None) -> None:
        self.state, self._usage, self._sealed = state, usage, sealed
        self._record: bytes | None = None
        self._recorded = self._completed = self._settled = False

    def record(self) -> bytes | None:
        """The tenant's sealed record of this call, made once (its seq is taken then)."""
        if self._sealed is not None and not self._recorded:
            request, decisions = self._sealed
            self._record = self.state.records.seal(request, decisions(), self.state.clock.now())
            self._recorded = True
        return self._record

    def trailers(self) -> tuple[tuple[str, bytes], ...]:
        record = self.record()
        return ((RECORD_METADATA_KEY, record),) if record is not None else ()

    def completed(self) -> None:
        """The handler delivered everything on the call (final chunk, trailers)."""
        self._completed = True

    def settle(self, *_: object) -> None:
        if self._settled:
            return
        self._settled = True
        if self._completed:
            return
        usage = self._usage()
        if usage is not None:
            self.state.outbox.owe_usage(usage)
        record = self.record()
        if record is not None:
            self.state.outbox.owe_record(record)
