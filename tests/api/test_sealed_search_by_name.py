"""A sealed search names its store's snapshot, it does not carry it (issue #51; docs/retrieval.md
"Sealed mode"), through the real gateway and a real worker (real gRPC, the real encoder): a warm
search moves no snapshot byte (what crosses WorkerClients is counted); a cold worker says so before
the envelope opens, is sent the snapshot in segments and answers the same envelope relayed again; a
snapshot named with another digest, another version, another store's id or no name at all is refused
and nothing is searched; the operator's rolled-back snapshot brings no deleted file back, warm or cold;
a store replaced between the check and the search is a sealed 409, not another snapshot's answer."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import update

from api.gateway.store_snapshots import SnapshotCalls
from api.store.models import VectorStoreRow
from api.store.retrieval import RetrievalStore, StoredVectorStore
from enclave_worker.retrieval.service import RetrievalService
from protocol.rpc import snapshot_segments, worker_pb2
from protocol.rpc.snapshot_segments import SnapshotName
from tests.api.retrieval_stack import (
    RetrievalStack,
    encoder_fixture,  # noqa: F401 (the fixture "encoder")
    stack_fixture,  # noqa: F401 (the fixture "stack")
)
from tests.api.test_sealed_retrieval_api import CANARY, CONTRACT, HOLIDAYS, attach, search, upload


class Wire:
    """What the gateway sent its worker: every sealed request relayed, every snapshot segment written."""

    def __init__(self, stack: RetrievalStack, monkeypatch: pytest.MonkeyPatch, alter: Any = None) -> None:
        self.sealed: list[worker_pb2.SealedRequest] = []
        self.segments: list[worker_pb2.StoreSnapshotSegment] = []
        clients = stack.service.clients
        opened, write = clients.open, clients.write_snapshot

        async def open_spy(address: str, request: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(request, worker_pb2.SealedRequest):
                if alter is not None:
                    request = alter(request)
                self.sealed.append(request)
            return await opened(address, request, *args, **kwargs)

        async def write_spy(address: str, cert: str, segments: Any, timeout_s: float) -> None:
            parts = list(segments)
            self.segments += parts
            await write(address, cert, parts, timeout_s)

        monkeypatch.setattr(clients, "open", open_spy)
        monkeypatch.setattr(clients, "write_snapshot", write_spy)


def _retrieval(stack: RetrievalStack) -> RetrievalService:
    assert stack.servicer is not None and stack.servicer.retrieval is not None
    return stack.servicer.retrieval


def _row(stack: RetrievalStack, store_id: str) -> tuple[bytes, int]:
    with stack.service.store.sessions() as s:
        row = s.get(VectorStoreRow, store_id)
        assert row is not None
        return bytes(row.snapshot), int(row.snapshot_version)


async def _loaded(stack: RetrievalStack) -> tuple[str, dict[str, str]]:
    ids = {}
    store = await stack.sdk().vector_stores.create(name="sealed")
    for team, name, text in (("legal", "contract.txt", CONTRACT), ("hr", "holidays.txt", HOLIDAYS)):
        status, file, _ = await upload(stack, name, text)
        assert status == 200, file
        await attach(stack, store.id, file["id"])
        ids[team] = file["id"]
    return store.id, ids


async def test_a_warm_sealed_search_names_the_snapshot_and_moves_none_of_it(
        stack: RetrievalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    store_id, ids = await _loaded(stack)
    blob, version = _row(stack, store_id)
    wire = Wire(stack, monkeypatch)
    for _ in range(2):
        status, page, receipt = await search(stack, store_id, max_num_results=1)
        assert status == 200 and [r["file_id"] for r in page["data"]] == [ids["legal"]]
        assert receipt is not None and receipt.file_ids == (ids["legal"],)
    assert wire.segments == [] and len(wire.sealed) == 2
    for sent in wire.sealed:
        assert SnapshotName.of(sent.store_base) == SnapshotName(store_id, version, hashlib.sha256(blob).digest())
        # What crosses to the worker is the envelope and ids: no byte of the (much larger) snapshot.
        assert sent.ByteSize() < len(sent.body) + 1024 < len(blob)
        assert blob[-64:] not in sent.SerializeToString()


async def test_a_cold_worker_gets_the_snapshot_in_segments_and_answers_the_same_envelope(
        stack: RetrievalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    store_id, ids = await _loaded(stack)
    blob, version = _row(stack, store_id)
    wire = Wire(stack, monkeypatch)
    monkeypatch.setattr(snapshot_segments, "SEGMENT_BYTES", 1024)
    _retrieval(stack).cache.clear()  # the worker restarted, or evicted the store
    status, page, receipt = await search(stack, store_id, max_num_results=1)
    assert status == 200 and [r["file_id"] for r in page["data"]] == [ids["legal"]] and receipt is not None
    assert CANARY in page["data"][0]["content"][0]["text"]
    # Asked, told "not held" before the envelope opened, sent the snapshot, the same envelope again.
    assert len(wire.sealed) == 2 and wire.sealed[0] == wire.sealed[1]
    assert len(wire.segments) > 1 and [s.index for s in wire.segments] == list(range(len(wire.segments)))
    assert b"".join(s.data for s in wire.segments) == blob
    assert {SnapshotName.of(s.ref) for s in wire.segments} == {SnapshotName.of(wire.sealed[0].store_base)}
    assert SnapshotName.of(wire.sealed[0].store_base).version == version
    sent = len(wire.segments)
    status, _, _ = await search(stack, store_id)
    assert status == 200 and len(wire.segments) == sent and len(wire.sealed) == 3  # warm again: nothing resent
    assert _retrieval(stack).cache.pinned(store_id) == 0  # every search released its pin


@pytest.mark.parametrize("wrong", ["digest", "version", "store"])
async def test_a_snapshot_named_wrong_is_refused_and_nothing_is_searched(
        stack: RetrievalStack, monkeypatch: pytest.MonkeyPatch, wrong: str) -> None:
    """A gateway that names the snapshot wrong (and sends the stored bytes under that name)."""
    store_id, ids = await _loaded(stack)
    other = await stack.sdk().vector_stores.create(name="other")
    blob, _ = _row(stack, store_id)
    named = SnapshotCalls.name

    def wrong_name(calls: SnapshotCalls, tenant: str, store: StoredVectorStore) -> SnapshotName:
        right = named(calls, tenant, store)
        if wrong == "digest":
            return replace(right, sha256=bytes(32))
        if wrong == "version":
            return replace(right, version=right.version + 1)
        return replace(right, store_id=other.id)

    monkeypatch.setattr(SnapshotCalls, "name", wrong_name)
    monkeypatch.setattr(RetrievalStore, "snapshot", lambda *_: blob)  # whatever version is asked for
    wire = Wire(stack, monkeypatch)
    searched: list[Any] = []
    search_store = _retrieval(stack).search
    monkeypatch.setattr(_retrieval(stack), "search", lambda *a, **k: searched.append(a) or search_store(*a, **k))
    _retrieval(stack).cache.clear()
    status, error, receipt = await search(stack, store_id)
    assert receipt is None and searched == [], (status, error)  # refused before the envelope opened
    if wrong == "store":
        assert status == 400 and error["error"]["code"] == "sealed_request_rejected" and wire.segments == []
    elif wrong == "digest":  # the segments' bytes are not the digest named: refused before anything opens
        assert status == 400 and wire.segments, error
    else:  # the snapshot opens as another version than the one named
        assert status == 409 and error["error"]["code"] == "sealed_data_unreadable" and wire.segments, error
    assert len(_retrieval(stack).cache) == 0  # nothing held under the wrong name
    monkeypatch.undo()
    status, page, _ = await search(stack, store_id, max_num_results=1)
    assert status == 200 and [r["file_id"] for r in page["data"]] == [ids["legal"]]


async def test_a_sealed_search_without_a_name_is_refused_before_it_opens(
        stack: RetrievalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    store_id, _ = await _loaded(stack)
    kept: list[worker_pb2.SealedRequest] = []

    def unnamed(request: worker_pb2.SealedRequest) -> worker_pb2.SealedRequest:
        kept.append(request)
        changed = worker_pb2.SealedRequest()
        changed.CopyFrom(request)
        changed.ClearField("store_base")
        return changed

    Wire(stack, monkeypatch, unnamed)
    status, error, receipt = await search(stack, store_id)
    assert status == 400 and receipt is None and "store_base" in error["error"]["message"], error
    monkeypatch.undo()
    # The envelope did not open (an opened one is never opened again): relayed with its name, it answers.
    key = stack.service.store.lookup_key(stack.tenant_key)
    assert key is not None
    chunks = [c async for c in stack.service.sealed_stream(key, kept[0].model, kept[0])]
    assert chunks and chunks[-1].HasField("usage")


async def test_a_rolled_back_snapshot_brings_no_deleted_file_back_in_sealed_mode(
        stack: RetrievalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    store_id, ids = await _loaded(stack)
    old = _row(stack, store_id)
    await stack.sdk().vector_stores.files.delete(ids["legal"], vector_store_id=store_id)
    status, page, _ = await search(stack, store_id, max_num_results=50)
    assert status == 200 and ids["legal"] not in [r["file_id"] for r in page["data"]]
    with stack.service.store.sessions.begin() as s:  # the operator writes the older snapshot back
        s.execute(update(VectorStoreRow).where(VectorStoreRow.id == store_id)
                  .values(snapshot=old[0], snapshot_version=old[1]))
    for cold in (False, True):
        if cold:
            _retrieval(stack).cache.clear()  # the version seen outlives the open store
        status, error, _ = await search(stack, store_id, max_num_results=50)
        assert status == 409, (cold, error)
        assert ids["legal"] not in str(error) and CANARY not in str(error)


async def test_a_store_replaced_between_the_check_and_the_search_is_a_sealed_conflict(
        stack: RetrievalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    """A change that lands after the check before opening (it replaces the pinned entry): the search
    checks the name again and answers a sealed 409, never the snapshot it was not named."""
    store_id, _ = await _loaded(stack)
    service = _retrieval(stack)
    hold = service.hold

    def then_replaced(tenant: str, name: SnapshotName) -> None:
        hold(tenant, name)
        service.cache.drop(name.store_id)  # as a change by name replaces the entry

    monkeypatch.setattr(service, "hold", then_replaced)
    status, error, receipt = await search(stack, store_id)
    assert status == 409 and error["error"]["code"] == "conflict" and receipt is not None, error
    assert service.cache.pinned(store_id) == 0
