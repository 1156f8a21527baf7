"""The worker's retrieval service with the real encoder (all-MiniLM-L6-v2): files and stores leave
it only sealed; ingestion, search (filters, threshold), deletion at once; replayed, moved, foreign
or tampered blobs and a wiped key refused; every bad request refused with the store unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from enclave_worker.engine.embedder import Embedder
from enclave_worker.engine.encoder_checkpoint import load_encoder_dir
from enclave_worker.engine.layers.linear import LinearOptions
from enclave_worker.engine.models.options import BuildOptions
from enclave_worker.retrieval.errors import InvalidRetrievalRequest, RetrievalError, SealedStoreError
from enclave_worker.retrieval.service import FileUnreadable, RetrievalService, Snapshot

CANARY = "CANARY-51b-4e1d"
DATA_KEY = bytes(range(32))
DOCS = {
    "file-legal": ("contract.txt", f"The supplier contract ends on 31 March. Termination needs 90 days notice. "
                                   f"{CANARY}", {"team": "legal"}),
    "file-hr": ("holidays.txt", "Employees get 28 days of paid holiday a year, plus public holidays.", {"team": "hr"}),
}


@pytest.fixture(scope="module")
def encoder(minilm_dir: Path) -> Embedder:
    return Embedder(load_encoder_dir(minilm_dir), BuildOptions(LinearOptions(kernel="torch", in_place=True), 512))


class Keys:
    def __init__(self, key: bytes = DATA_KEY) -> None:
        self.key = key

    def __call__(self) -> bytes:
        return self.key


def _service(encoder: Embedder, keys: Keys | None = None, version: str = "v1") -> RetrievalService:
    return RetrievalService(encoder, keys or Keys(), "acme", "m", version)


def _loaded(service: RetrievalService) -> tuple[Snapshot, dict[str, bytes]]:
    snapshot, blobs = Snapshot(b"", 0), {}
    for file_id, (name, text, attrs) in DOCS.items():
        blobs[file_id] = service.seal_file("acme", file_id, text.encode())
        snapshot = service.ingest("acme", "vs_1", snapshot.blob, file_id, name, blobs[file_id], attrs, None).snapshot
    return snapshot, blobs


def _files(service: RetrievalService, snapshot: Snapshot, query: str = "When does the contract end?",
           **kw: Any) -> list[str]:
    return [r.file_id for r in service.search("acme", "vs_1", snapshot.blob, query, 5, **kw)]


def test_ingest_search_and_delete_through_sealed_snapshots(encoder: Embedder) -> None:
    service = _service(encoder)
    snapshot, blobs = _loaded(service)
    assert snapshot.version == 2
    assert all(CANARY.encode() not in b and b"supplier" not in b for b in (snapshot.blob, *blobs.values()))
    hits = service.search("acme", "vs_1", snapshot.blob, "When does the contract end?", 1)
    assert [h.file_id for h in hits] == ["file-legal"] and CANARY in hits[0].text
    assert _files(service, snapshot, filters={"type": "eq", "key": "team", "value": "hr"}) == ["file-hr"]
    assert _files(service, snapshot, score_threshold=0.99) == []

    # A fresh worker (same key: another replica) opens the same snapshot.
    assert _files(_service(encoder), snapshot)[0] == "file-legal"

    after = service.delete_file("acme", "vs_1", snapshot.blob, "file-legal")
    assert after.version == 3 and "file-legal" not in _files(service, after)
    assert "file-legal" not in _files(_service(encoder), after)  # gone from the sealed snapshot too
    # The older snapshot, which still holds the file, is refused by a worker that has seen the newer.
    with pytest.raises(SealedStoreError):
        service.search("acme", "vs_1", snapshot.blob, "contract", 5)
    with pytest.raises(SealedStoreError):
        service.search("acme", "vs_1", b"", "contract", 5)  # nor an empty one in its place


def test_a_wiped_key_another_key_or_version_opens_nothing(encoder: Embedder) -> None:
    keys = Keys()
    service = _service(encoder, keys)
    snapshot, blobs = _loaded(service)
    for other in (_service(encoder, Keys(bytes(32))), _service(encoder, version="v2")):
        with pytest.raises(SealedStoreError):
            other.search("acme", "vs_1", snapshot.blob, "contract", 5)
        with pytest.raises(SealedStoreError):
            other.ingest("acme", "vs_2", b"", "file-hr", "h.txt", blobs["file-hr"], None, None)
    keys.key = b""  # revoked: the worker wiped its data key
    with pytest.raises(SealedStoreError):
        service.search("acme", "vs_1", snapshot.blob, "contract", 5)
    with pytest.raises(SealedStoreError):
        service.seal_file("acme", "file-x", b"text")


@pytest.mark.parametrize("case", ["file blob under another id", "store snapshot under another id",
                                  "file blob as a snapshot", "flipped bit", "truncated"])
def test_moved_or_tampered_blobs_are_refused(encoder: Embedder, case: str) -> None:
    service = _service(encoder)
    snapshot, blobs = _loaded(service)
    flipped = snapshot.blob[:-1] + bytes([snapshot.blob[-1] ^ 1])
    with pytest.raises(SealedStoreError):
        if case == "file blob under another id":
            service.ingest("acme", "vs_2", b"", "file-other", "x.txt", blobs["file-hr"], None, None)
        elif case == "store snapshot under another id":
            service.search("acme", "vs_2", snapshot.blob, "contract", 5)
        elif case == "file blob as a snapshot":
            service.search("acme", "vs_1", blobs["file-hr"], "contract", 5)
        else:
            service.search("acme", "vs_1", flipped if case == "flipped bit" else snapshot.blob[:40], "contract", 5)


INGEST_REFUSALS: list[tuple[str, dict[str, Any]]] = [
    ("another tenant", {"tenant": "globex"}),
    ("bad file id", {"file_id": "../etc"}),
    ("bad store id", {"store_id": "vs 1"}),
    ("file already in the store", {"file_id": "file-hr"}),
    ("attributes not an object", {"attributes": ["team"]}),
    ("attribute value an object", {"attributes": {"team": {"a": 1}}}),
    ("17 attributes", {"attributes": {f"k{i}": i for i in range(17)}}),
    ("chunking not an object", {"chunking": "auto"}),
    ("unknown chunking type", {"chunking": {"type": "semantic"}}),
    ("chunk size under 100", {"chunking": {"type": "static", "static": {"max_chunk_size_tokens": 99,
                                                                         "chunk_overlap_tokens": 0}}}),
    ("overlap over half", {"chunking": {"type": "static", "static": {"max_chunk_size_tokens": 200,
                                                                      "chunk_overlap_tokens": 101}}}),
    ("chunk over the model's window", {"chunking": {"type": "static", "static": {"max_chunk_size_tokens": 800,
                                                                                  "chunk_overlap_tokens": 400}}}),
]


@pytest.mark.parametrize("case,change", INGEST_REFUSALS, ids=[c for c, _ in INGEST_REFUSALS])
def test_bad_ingestion_is_refused_and_changes_nothing(encoder: Embedder, case: str, change: dict[str, Any]) -> None:
    service = _service(encoder)
    snapshot, blobs = _loaded(service)
    before = _files(service, snapshot, "holiday")
    args: dict[str, Any] = {"tenant": "acme", "store_id": "vs_1", "snapshot": snapshot.blob, "file_id": "file-hr",
                            "filename": "h.txt", "file_blob": blobs["file-hr"], "attributes": None, "chunking": None}
    if "file_id" not in change:
        args["file_id"] = "file-new"
        args["file_blob"] = service.seal_file("acme", "file-new", b"A new file about parking spaces.")
    with pytest.raises(InvalidRetrievalRequest):
        service.ingest(**{**args, **change})
    assert _files(service, snapshot, "holiday") == before
    assert _files(service, snapshot, "parking")[:1] != ["file-new"]


def test_a_file_that_is_not_text_fails_without_changing_the_store(encoder: Embedder) -> None:
    service = _service(encoder)
    snapshot, _ = _loaded(service)
    blob = service.seal_file("acme", "file-bin", b"\xff\xfe\x00binary")
    with pytest.raises(FileUnreadable) as failed:
        service.ingest("acme", "vs_1", snapshot.blob, "file-bin", "x.bin", blob, None, None)
    assert failed.value.code == "unsupported_file"
    assert _files(service, snapshot) and "file-bin" not in _files(service, snapshot)


SEARCH_REFUSALS: list[tuple[str, dict[str, Any]]] = [
    ("rewrite_query", {"rewrite_query": True}),
    ("empty query", {"query": "  "}),
    ("query too long", {"query": "word " * 1000}),
    ("51 results", {"max_num_results": 51}),
    ("threshold over 1", {"score_threshold": 1.5}),
    ("threshold under 0", {"score_threshold": -0.1}),
    ("unknown filter type", {"filters": {"type": "like", "key": "team", "value": "hr"}}),
    ("filter not an object", {"filters": "team=hr"}),
    ("another tenant", {"tenant": "globex"}),
]


@pytest.mark.parametrize("case,change", SEARCH_REFUSALS, ids=[c for c, _ in SEARCH_REFUSALS])
def test_bad_searches_are_refused(encoder: Embedder, case: str, change: dict[str, Any]) -> None:
    service = _service(encoder)
    snapshot, _ = _loaded(service)
    args: dict[str, Any] = {"tenant": "acme", "store_id": "vs_1", "snapshot": snapshot.blob, "query": "contract",
                            "max_num_results": 5}
    with pytest.raises(RetrievalError) as refused:
        service.search(**{**args, **change})
    assert isinstance(refused.value, InvalidRetrievalRequest) and CANARY not in str(refused.value)


def test_deleting_a_file_the_store_lacks_is_refused(encoder: Embedder) -> None:
    service = _service(encoder)
    snapshot, _ = _loaded(service)
    with pytest.raises(InvalidRetrievalRequest):
        service.delete_file("acme", "vs_1", snapshot.blob, "file-none")
    assert sorted(_files(service, snapshot)) == ["file-hr", "file-legal"]
