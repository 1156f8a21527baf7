"""The worker's store snapshots by name over its RPCs (enclave_worker/retrieval_rpcs.py) with the real
encoder: a store the worker lacks is NOT_FOUND; WriteStoreSnapshot takes it in segments (truncated
or reordered: INVALID_ARGUMENT, nothing cached); ReadStoreSnapshot gives back what a change made;
an older version than one seen is FAILED_PRECONDITION; and the worker's loss of its key (LiveState.fail)
empties its open stores."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from enclave_worker.engine.embedder import Embedder
from enclave_worker.engine.encoder_checkpoint import load_encoder_dir
from enclave_worker.engine.layers.linear import LinearOptions
from enclave_worker.engine.models.options import BuildOptions
from enclave_worker.guard import WorkerGuard
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from policy.policyset import PolicySet
from protocol.rpc import worker_pb2
from protocol.rpc.snapshot_segments import SnapshotName, segments

TEXT = "The staff canteen opens at 8 and closes at 15."
EMPTY = worker_pb2.StoreSnapshotRef(store_id="vs_1", version=0)


@pytest.fixture(scope="module")
def encoder(minilm_dir: Path) -> Embedder:
    return Embedder(load_encoder_dir(minilm_dir), BuildOptions(LinearOptions(kernel="torch", in_place=True), 512))


def _servicer(encoder: Embedder) -> WorkerServicer:
    doc: dict[str, Any] = {"policy_id": "p", "version": 1, "tenant": "acme"}
    booted = SimpleNamespace(engine=object(), released=SimpleNamespace(data_key=bytes(range(32))))
    state = WorkerState(
        WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant="acme", model="m", version="v1"),
        guard=WorkerGuard(PolicySet.from_dict(doc)),
        live=LiveState.serving(booted),
    )  # type: ignore[arg-type]
    return WorkerServicer(state, encoder)


class Aborted(Exception):
    pass


class Context:
    code: Any = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise Aborted(details)


async def _stream(items: Iterable[worker_pb2.StoreSnapshotSegment]) -> AsyncIterator[worker_pb2.StoreSnapshotSegment]:
    for item in items:
        yield item


def _call(servicer: WorkerServicer, method: str, request: Any) -> Any:
    return asyncio.run(getattr(servicer, method)(request, Context()))


def _refused(servicer: WorkerServicer, method: str, request: Any) -> grpc.StatusCode:
    context = Context()

    async def run() -> None:
        if method == "WriteStoreSnapshot":
            await servicer.WriteStoreSnapshot(_stream(request), context)  # type: ignore[arg-type]
        elif method == "ReadStoreSnapshot":
            _ = [s async for s in servicer.ReadStoreSnapshot(request, context)]  # type: ignore[attr-defined]
        else:
            await getattr(servicer, method)(request, context)

    with pytest.raises(Aborted):
        asyncio.run(run())
    return context.code


def _read(servicer: WorkerServicer, ref: worker_pb2.StoreSnapshotRef) -> bytes:
    async def run() -> bytes:
        parts = [
            s
            async for s in servicer.ReadStoreSnapshot(  # type: ignore[attr-defined]
                worker_pb2.ReadStoreSnapshotRequest(tenant="acme", ref=ref), Context()
            )
        ]
        return b"".join(p.data for p in parts)

    return asyncio.run(run())


def _write(servicer: WorkerServicer, ref: worker_pb2.StoreSnapshotRef, blob: bytes) -> None:
    parts = list(segments("acme", SnapshotName.of(ref), blob, 1024))
    assert len(parts) > 1
    asyncio.run(servicer.WriteStoreSnapshot(_stream(parts), Context()))  # type: ignore[arg-type]


def _ingest(servicer: WorkerServicer, base: worker_pb2.StoreSnapshotRef, file_id: str) -> worker_pb2.IngestFileReply:
    sealed = _call(
        servicer, "SealFile", worker_pb2.SealFileRequest(tenant="acme", file_id=file_id, content=TEXT.encode())
    )
    reply: worker_pb2.IngestFileReply = _call(
        servicer,
        "IngestFile",
        worker_pb2.IngestFileRequest(
            tenant="acme", store_id="vs_1", file_id=file_id, filename="canteen.txt", file_blob=sealed.blob, base=base
        ),
    )
    assert reply.snapshot.blob == b"" and reply.made.version == base.version + 1  # by name: read it back
    return reply


def _search(base: worker_pb2.StoreSnapshotRef) -> worker_pb2.SearchStoreRequest:
    return worker_pb2.SearchStoreRequest(tenant="acme", store_id="vs_1", query="When does the canteen open?", base=base)


def test_a_store_by_name_in_segments_both_ways(encoder: Embedder) -> None:
    maker = _servicer(encoder)
    made = _ingest(maker, EMPTY, "file-a").made
    blob = _read(maker, made)
    assert len(blob) > 1024  # it travelled in several segments
    assert json.loads(_call(maker, "SearchStore", _search(made)).results_json)[0]["file_id"] == "file-a"

    cold = _servicer(encoder)
    assert _refused(cold, "SearchStore", _search(made)) == grpc.StatusCode.NOT_FOUND
    parts = list(segments("acme", SnapshotName.of(made), blob, 1024))
    assert _refused(cold, "WriteStoreSnapshot", parts[:-1]) == grpc.StatusCode.INVALID_ARGUMENT  # truncated
    assert (
        _refused(cold, "WriteStoreSnapshot", [parts[0], parts[2], parts[1], *parts[3:]])
        == grpc.StatusCode.INVALID_ARGUMENT
    )  # reordered
    assert _refused(cold, "SearchStore", _search(made)) == grpc.StatusCode.NOT_FOUND  # nothing was kept
    _write(cold, made, blob)
    assert json.loads(_call(cold, "SearchStore", _search(made)).results_json)[0]["file_id"] == "file-a"

    gone = _call(
        cold,
        "DeleteStoreFile",
        worker_pb2.DeleteStoreFileRequest(tenant="acme", store_id="vs_1", file_id="file-a", base=made),
    )
    assert gone.blob == b"" and gone.made.version == 2 and _read(cold, gone.made)
    assert json.loads(_call(cold, "SearchStore", _search(gone.made)).results_json) == []
    assert _refused(cold, "SearchStore", _search(made)) == grpc.StatusCode.FAILED_PRECONDITION  # older: replay
    assert _refused(cold, "WriteStoreSnapshot", parts) == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        _refused(cold, "ReadStoreSnapshot", worker_pb2.ReadStoreSnapshotRequest(tenant="acme", ref=made))
        == grpc.StatusCode.NOT_FOUND
    )  # not one it holds for the gateway


def test_losing_the_key_empties_the_open_stores(encoder: Embedder) -> None:
    servicer = _servicer(encoder)
    made = _ingest(servicer, EMPTY, "file-a").made
    assert servicer.retrieval is not None and len(servicer.retrieval.cache) == 1
    servicer.state.live.fail("revoked")  # what lifecycle.revoke does first
    assert len(servicer.retrieval.cache) == 0
    assert _refused(servicer, "SearchStore", _search(made)) == grpc.StatusCode.UNAVAILABLE
