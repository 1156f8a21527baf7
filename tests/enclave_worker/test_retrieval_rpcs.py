"""The worker's retrieval RPCs (enclave_worker/retrieval_rpcs.py) with the real encoder: sealed
blobs in and out, each refusal with its gRPC code, a file the worker cannot index reported in the
reply, and document text in clear refused to a tenant that requires sealed mode."""

from __future__ import annotations

import asyncio
import json
import threading
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
from policy.callers import api_key_digest
from policy.policyset import PolicySet
from protocol.rpc import worker_pb2

TEXT = "The staff canteen opens at 8 and closes at 15. CANARY-rpc-51"


@pytest.fixture(scope="module")
def encoder(minilm_dir: Path) -> Embedder:
    return Embedder(load_encoder_dir(minilm_dir), BuildOptions(LinearOptions(kernel="torch", in_place=True), 512))


def _servicer(encoder: Embedder | None, *, require_sealed: bool = False,
              file_access: dict[str, Any] | None = None) -> WorkerServicer:
    doc: dict[str, Any] = {"policy_id": "p", "version": 1, "tenant": "acme", "require_sealed": require_sealed}
    if file_access is not None:
        doc["file_access"] = file_access
    booted = SimpleNamespace(engine=object(), released=SimpleNamespace(data_key=bytes(range(32))))
    state = WorkerState(WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant="acme",
                                       model="m", version="v1"), guard=WorkerGuard(PolicySet.from_dict(doc)),
                        live=LiveState.serving(booted))  # type: ignore[arg-type]
    return WorkerServicer(state, encoder)


class Aborted(Exception):
    pass


class Context:
    code: Any = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise Aborted(details)


def _call(servicer: WorkerServicer, method: str, request: Any, context: Context | None = None) -> Any:
    return asyncio.run(getattr(servicer, method)(request, context or Context()))


def _refused(servicer: WorkerServicer, method: str, request: Any) -> grpc.StatusCode:
    context = Context()
    with pytest.raises(Aborted) as aborted:
        _call(servicer, method, request, context)
    assert "CANARY" not in str(aborted.value)
    return context.code


def _ingested(servicer: WorkerServicer) -> worker_pb2.IngestFileReply:
    sealed = _call(servicer, "SealFile", worker_pb2.SealFileRequest(tenant="acme", file_id="file-a",
                                                                      content=TEXT.encode()))
    assert sealed.key_version == "v1" and b"CANARY" not in sealed.blob
    reply: worker_pb2.IngestFileReply = _call(servicer, "IngestFile", worker_pb2.IngestFileRequest(
        tenant="acme", store_id="vs_1", file_id="file-a", filename="canteen.txt", file_blob=sealed.blob,
        attributes_json=json.dumps({"site": "hq"}), chunking_json=json.dumps({"type": "auto"})))
    return reply


def test_seal_ingest_search_and_delete(encoder: Embedder) -> None:
    servicer = _servicer(encoder)
    reply = _ingested(servicer)
    assert reply.error_code == "" and reply.snapshot.version == 1 and reply.usage_bytes == len(TEXT)
    assert json.loads(reply.chunking_json)["type"] == "static" and b"CANARY" not in reply.snapshot.blob
    found = _call(servicer, "SearchStore", worker_pb2.SearchStoreRequest(
        tenant="acme", store_id="vs_1", snapshot=reply.snapshot.blob, query="When does the canteen open?",
        max_num_results=3, filters_json=json.dumps({"type": "eq", "key": "site", "value": "hq"})))
    results = json.loads(found.results_json)
    assert list(found.file_ids) == ["file-a"] and results[0]["content"][0]["text"] == TEXT
    assert results[0]["attributes"] == {"site": "hq"} and 0 < results[0]["score"] <= 1
    after = _call(servicer, "DeleteStoreFile", worker_pb2.DeleteStoreFileRequest(
        tenant="acme", store_id="vs_1", snapshot=reply.snapshot.blob, file_id="file-a"))
    empty = _call(servicer, "SearchStore", worker_pb2.SearchStoreRequest(
        tenant="acme", store_id="vs_1", snapshot=after.blob, query="canteen"))
    assert after.version == 2 and json.loads(empty.results_json) == [] and not empty.file_ids


def test_refusals_and_their_codes(encoder: Embedder) -> None:
    servicer = _servicer(encoder)
    snapshot = _ingested(servicer).snapshot.blob
    search = worker_pb2.SearchStoreRequest(tenant="acme", store_id="vs_1", snapshot=snapshot, query="canteen")
    bad_filter = worker_pb2.SearchStoreRequest()
    bad_filter.CopyFrom(search)
    bad_filter.filters_json = "{not json"
    tampered = worker_pb2.SearchStoreRequest()
    tampered.CopyFrom(search)
    tampered.snapshot = snapshot[:-1] + bytes([snapshot[-1] ^ 1])
    assert _refused(servicer, "SearchStore", bad_filter) == grpc.StatusCode.INVALID_ARGUMENT
    assert _refused(servicer, "SearchStore", tampered) == grpc.StatusCode.FAILED_PRECONDITION
    assert _refused(servicer, "DeleteStoreFile", worker_pb2.DeleteStoreFileRequest(
        tenant="acme", store_id="vs_1", snapshot=snapshot, file_id="file-none")) == grpc.StatusCode.INVALID_ARGUMENT
    assert _refused(_servicer(None), "SearchStore", search) == grpc.StatusCode.UNIMPLEMENTED
    sealed_only = _servicer(encoder, require_sealed=True)
    assert _refused(sealed_only, "SearchStore", search) == grpc.StatusCode.PERMISSION_DENIED
    assert _refused(sealed_only, "SealFile", worker_pb2.SealFileRequest(
        tenant="acme", file_id="file-b", content=b"x")) == grpc.StatusCode.PERMISSION_DENIED


def test_a_file_that_is_not_text_is_reported_failed(encoder: Embedder) -> None:
    servicer = _servicer(encoder)
    sealed = _call(servicer, "SealFile", worker_pb2.SealFileRequest(tenant="acme", file_id="file-b",
                                                                      content=b"\xff\xfe\x00"))
    reply = _call(servicer, "IngestFile", worker_pb2.IngestFileRequest(
        tenant="acme", store_id="vs_2", file_id="file-b", filename="b.bin", file_blob=sealed.blob))
    assert (reply.error_code, reply.snapshot.blob) == ("unsupported_file", b"")


def test_the_tenants_file_access_decides_which_caller_gets_passages(encoder: Embedder) -> None:
    legal, other = api_key_digest("sk-legal"), api_key_digest("sk-other")
    servicer = _servicer(encoder, file_access={"rules": [{"attribute": "site", "value": "hq", "api_keys": [legal]}]})
    snapshot = _ingested(servicer).snapshot.blob  # file-a has {"site": "hq"}
    for key_id, expected in (("key_" + legal[:16], ["file-a"]), ("key_" + other[:16], []), ("", [])):
        found = _call(servicer, "SearchStore", worker_pb2.SearchStoreRequest(
            tenant="acme", key_id=key_id, store_id="vs_1", snapshot=snapshot, query="canteen", max_num_results=50,
            filters_json=json.dumps({"type": "eq", "key": "site", "value": "hq"})))
        assert list(found.file_ids) == expected
        assert ("CANARY" in found.results_json) is bool(expected)


def test_a_worker_serves_retrieval_with_the_encoder_it_booted(encoder: Embedder,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    servicer = _servicer(None)  # nothing injected: the booted encoder (an embedding model's worker) is used
    request = worker_pb2.SealFileRequest(tenant="acme", file_id="file-c", content=TEXT.encode())
    assert _refused(servicer, "SealFile", request) == grpc.StatusCode.UNIMPLEMENTED  # a chat model's worker
    monkeypatch.setattr(LiveState, "embedder", property(lambda _: encoder), raising=False)
    assert _call(servicer, "SealFile", request).blob
    assert servicer.retrieval is not None and servicer.retrieval.encoder is encoder


class GatedEncoder:
    """The real encoder, whose embedding waits until the event loop opens the gate: an RPC that ran
    its work on the loop would wait for a loop it holds (the gate gives up after a minute, closed)."""

    def __init__(self, encoder: Embedder) -> None:
        self.encoder, self.gate, self.opened = encoder, threading.Event(), False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)

    def embed_texts(self, texts: list[str]) -> Any:
        self.opened = self.gate.wait(60)
        return self.encoder.embed_texts(texts)


def test_the_work_runs_off_the_event_loop(encoder: Embedder) -> None:
    """An ingest or a search takes seconds on a large file or store; on the loop it would stall the
    worker's heartbeats (the gateway drops the worker) and every other RPC meanwhile."""
    gated = GatedEncoder(encoder)
    servicer = _servicer(gated)  # type: ignore[arg-type]

    async def ingest_while_the_loop_runs() -> worker_pb2.IngestFileReply:
        sealed = await servicer.SealFile(worker_pb2.SealFileRequest(tenant="acme", file_id="file-a",
                                                                    content=TEXT.encode()), Context())
        call = asyncio.ensure_future(servicer.IngestFile(worker_pb2.IngestFileRequest(
            tenant="acme", store_id="vs_1", file_id="file-a", filename="canteen.txt", file_blob=sealed.blob),
            Context()))
        await asyncio.sleep(0)  # the RPC starts, and must hand the loop back while it embeds
        gated.gate.set()
        reply: worker_pb2.IngestFileReply = await call
        return reply

    reply = asyncio.run(ingest_while_the_loop_runs())
    assert gated.opened and reply.error_code == "" and reply.snapshot.version == 1
