"""Vector stores named, not carried, between the real gateway and a real worker (real gRPC, the real
encoder; api/gateway/store_snapshots.py): a warm search sends no snapshot; a worker that lacks the
store is sent it in segments, once; a deleted file is gone at once with the store warm; the operator
rolling the database back to an older snapshot gets no passage of a deleted file; and a worker that
loses its key holds no open store."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from sqlalchemy import update

from api.store.models import VectorStoreRow
from enclave_worker.retrieval.service import RetrievalService
from protocol.rpc import snapshot_segments, worker_pb2
from tests.api.retrieval_stack import (
    RetrievalStack,
    encoder_fixture,  # noqa: F401 (the fixture "encoder")
    stack_fixture,  # noqa: F401 (the fixture "stack")
)

CONTRACT = "The supplier contract ends on 31 March. Termination needs 90 days notice. CANARY-cache-51"
HOLIDAYS = "Employees get 28 days of paid holiday a year, plus public holidays."
QUERY = "When does the supplier contract end?"


class Wire:
    """What the gateway sent its worker: every unary request, every segment written."""

    def __init__(self, stack: RetrievalStack, monkeypatch: pytest.MonkeyPatch) -> None:
        self.requests: list[Any] = []
        self.segments: list[worker_pb2.StoreSnapshotSegment] = []
        clients = stack.service.clients
        unary, write = clients.unary, clients.write_snapshot

        async def unary_spy(address: str, cert: str, method: str, request: Any, timeout_s: float) -> Any:
            self.requests.append(request)
            return await unary(address, cert, method, request, timeout_s)

        async def write_spy(address: str, cert: str, segments: Any, timeout_s: float) -> None:
            parts = list(segments)
            self.segments += parts
            await write(address, cert, parts, timeout_s)

        monkeypatch.setattr(clients, "unary", unary_spy)
        monkeypatch.setattr(clients, "write_snapshot", write_spy)

    def searches(self) -> list[worker_pb2.SearchStoreRequest]:
        return [r for r in self.requests if isinstance(r, worker_pb2.SearchStoreRequest)]


def _retrieval(stack: RetrievalStack) -> RetrievalService:
    assert stack.servicer is not None and stack.servicer.retrieval is not None
    return stack.servicer.retrieval


async def _loaded(stack: RetrievalStack) -> tuple[str, dict[str, str]]:
    c = stack.sdk()
    store = await c.vector_stores.create(name="policies")
    ids = {}
    for name, text, team in (("contract.txt", CONTRACT, "legal"), ("holidays.txt", HOLIDAYS, "hr")):
        done = await c.vector_stores.files.upload_and_poll(vector_store_id=store.id, file=(name, text.encode()))
        assert done.status == "completed", done
        ids[team] = done.id
    return store.id, ids


async def _found(stack: RetrievalStack, store_id: str) -> list[str]:
    return [r.file_id for r in (await stack.sdk().vector_stores.search(store_id, query=QUERY)).data]


async def test_a_warm_search_sends_no_snapshot_and_a_cold_worker_gets_it_once_in_segments(
    stack: RetrievalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_id, ids = await _loaded(stack)
    wire = Wire(stack, monkeypatch)
    assert (await _found(stack, store_id))[0] == ids["legal"]
    assert (await _found(stack, store_id))[0] == ids["legal"]
    assert wire.segments == [] and len(wire.searches()) == 2
    assert all(r.snapshot == b"" and r.HasField("base") for r in wire.searches())

    monkeypatch.setattr(snapshot_segments, "SEGMENT_BYTES", 1024)
    _retrieval(stack).cache.clear()  # the worker restarted, or evicted the store
    assert (await _found(stack, store_id))[0] == ids["legal"]
    assert len(wire.segments) > 1 and [s.index for s in wire.segments] == list(range(len(wire.segments)))
    assert len(wire.searches()) == 4  # asked, told "not held", sent the snapshot, asked again
    sent = len(wire.segments)
    assert (await _found(stack, store_id))[0] == ids["legal"]
    assert len(wire.searches()) == 5 and len(wire.segments) == sent  # warm again: nothing resent


async def test_a_deleted_file_is_gone_at_once_with_the_store_warm(stack: RetrievalStack) -> None:
    store_id, ids = await _loaded(stack)
    assert ids["legal"] in await _found(stack, store_id)
    await stack.sdk().vector_stores.files.delete(ids["legal"], vector_store_id=store_id)
    assert ids["legal"] not in await _found(stack, store_id)


async def test_the_operator_rolling_the_snapshot_back_gets_no_deleted_passage(stack: RetrievalStack) -> None:
    store_id, ids = await _loaded(stack)
    row = _row(stack, store_id)
    await stack.sdk().vector_stores.files.delete(ids["legal"], vector_store_id=store_id)
    with stack.service.store.sessions.begin() as s:  # the operator writes the older snapshot back
        s.execute(
            update(VectorStoreRow).where(VectorStoreRow.id == store_id).values(snapshot=row[0], snapshot_version=row[1])
        )
    with pytest.raises(openai.ConflictError) as refused:
        await _found(stack, store_id)
    assert "older than one this worker has seen" in str(refused.value.body)
    _retrieval(stack).cache.clear()  # cold: refused the same (the version seen outlives the open store)
    with pytest.raises(openai.ConflictError):
        await _found(stack, store_id)


def _row(stack: RetrievalStack, store_id: str) -> tuple[bytes, int]:
    with stack.service.store.sessions() as s:
        row = s.get(VectorStoreRow, store_id)
        assert row is not None
        return bytes(row.snapshot), int(row.snapshot_version)


async def test_a_worker_that_loses_its_key_holds_no_open_store(stack: RetrievalStack) -> None:
    store_id, _ = await _loaded(stack)
    assert await _found(stack, store_id) and len(_retrieval(stack).cache) == 1
    stack.state.live.fail("revoked")  # lifecycle.revoke: the key revoked or its lease run out
    assert len(_retrieval(stack).cache) == 0
    with pytest.raises(openai.APIStatusError):
        await _found(stack, store_id)
