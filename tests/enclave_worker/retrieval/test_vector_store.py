"""A vector store with the real encoder (all-MiniLM-L6-v2): ingestion, search under rights and
filters, deletion, and the sealed snapshot round trip (ciphertext only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from enclave_worker.engine.embedder import Embedder
from enclave_worker.engine.encoder_checkpoint import load_encoder_dir
from enclave_worker.engine.layers.linear import LinearOptions
from enclave_worker.engine.models.options import BuildOptions
from enclave_worker.retrieval.chunking import ChunkingStrategy, chunking_strategy
from enclave_worker.retrieval.errors import InvalidRetrievalRequest, SealedStoreError
from enclave_worker.retrieval.filters import parse_filter
from enclave_worker.retrieval.index import VectorIndex
from enclave_worker.retrieval.sealed_store import open_snapshot, seal_snapshot
from enclave_worker.retrieval.vector_store import VectorStore, only_files, readable_by_all

CANARY = "CANARY-7f3a9c"
DOCS = {
    "file-legal": ("contract.txt",
                   f"The supplier contract ends on 31 March. Termination needs 90 days notice. {CANARY}",
                   {"team": "legal", "year": 2024}),
    "file-hr": ("holidays.txt", "Employees get 28 days of paid holiday a year, plus public holidays.",
                {"team": "hr", "year": 2025}),
    "file-eng": ("oncall.txt", "The on-call engineer restarts the key broker if attestation fails twice.",
                 {"team": "eng", "year": 2025}),
}


@pytest.fixture(scope="module")
def encoder(minilm_dir: Path) -> Embedder:
    return Embedder(load_encoder_dir(minilm_dir), BuildOptions(LinearOptions(kernel="torch", in_place=True), 512))


@pytest.fixture()
def store(encoder: Embedder) -> VectorStore:
    vs = VectorStore("vs_test", encoder.dim)
    strategy = chunking_strategy(None, encoder.chunk_window)
    for file_id, (name, text, attrs) in DOCS.items():
        vs.add_file(file_id, name, text, attrs, strategy, encoder)
    return vs


def _ask(encoder: Embedder, store: VectorStore, question: str, **kw) -> list[str]:  # type: ignore[no-untyped-def]
    hits = store.search(encoder.embed_texts([question])[0], 3, readable=kw.pop("readable", readable_by_all), **kw)
    return [h.file_id for h in hits]


def test_the_relevant_file_comes_first(encoder: Embedder, store: VectorStore) -> None:
    assert _ask(encoder, store, "How much notice to terminate the supplier contract?")[0] == "file-legal"
    assert _ask(encoder, store, "How many vacation days do staff have?")[0] == "file-hr"


def test_rights_and_filters_decide_which_files_answer(encoder: Embedder, store: VectorStore) -> None:
    question = "How much notice to terminate the supplier contract?"
    assert "file-legal" not in _ask(encoder, store, question, readable=only_files({"file-hr", "file-eng"}))
    assert _ask(encoder, store, question, readable=only_files(set())) == []
    year_2025 = parse_filter({"type": "eq", "key": "year", "value": 2025})
    assert sorted(_ask(encoder, store, question, filter=year_2025)) == ["file-eng", "file-hr"]


def test_a_deleted_file_is_gone_at_once(encoder: Embedder, store: VectorStore) -> None:
    assert store.remove_file("file-legal") and not store.remove_file("file-legal")
    assert "file-legal" not in _ask(encoder, store, "supplier contract termination notice")
    assert not any(CANARY in c.text for c in store.chunks.values())


def test_sealed_snapshot_round_trip_holds_no_text(encoder: Embedder, store: VectorStore) -> None:
    key = bytes(range(32))
    blob = seal_snapshot(key, store.store_id, 3, store.to_bytes())
    assert CANARY.encode() not in blob and b"supplier" not in blob
    version, plaintext = open_snapshot(key, store.store_id, blob, min_version=3)
    copy = VectorStore.from_bytes(plaintext, store.store_id)
    question = encoder.embed_texts(["on-call attestation failure"])[0]
    assert version == 3
    assert copy.search(question, 3, readable=readable_by_all) == store.search(question, 3, readable=readable_by_all)


def test_a_failed_ingestion_changes_nothing(encoder: Embedder, store: VectorStore) -> None:
    class Broken:
        def token_offsets(self, text: str) -> list[tuple[int, int]]:
            return encoder.token_offsets(text)

        def embed_texts(self, texts: list[str]) -> np.ndarray:
            return np.zeros((len(texts), encoder.dim + 1), np.float32)  # the wrong width

    before = (dict(store.files), dict(store.chunks), len(store.index))
    with pytest.raises(InvalidRetrievalRequest, match="vectors of 384"):
        store.add_file("file-new", "n.txt", "some new text", {}, ChunkingStrategy(100, 0), Broken())
    with pytest.raises(InvalidRetrievalRequest, match="already in vector store"):
        store.add_file("file-hr", "h.txt", "again", {}, ChunkingStrategy(100, 0), encoder)
    assert (dict(store.files), dict(store.chunks), len(store.index)) == before


def test_a_long_document_is_chunked_within_the_models_window(encoder: Embedder) -> None:
    vs = VectorStore("vs_long", encoder.dim)
    text = " ".join(f"Clause {i} says the tenant holds its own keys." for i in range(200))
    stored = vs.add_file("file-long", "long.txt", text, {}, chunking_strategy(None, encoder.chunk_window), encoder)
    assert len(stored.chunk_keys) > 5
    assert all(len(encoder.tokenize([c.text])[0]) <= encoder.pooling.max_tokens for c in vs.chunks.values())


@pytest.mark.parametrize("k", [0, 51])
def test_result_count_bounds(encoder: Embedder, store: VectorStore, k: int) -> None:
    with pytest.raises(InvalidRetrievalRequest, match="from 1 to 50"):
        store.search(encoder.embed_texts(["x"])[0], k, readable=readable_by_all)


def test_a_snapshot_whose_index_keys_are_not_its_chunks_is_refused(store: VectorStore) -> None:
    # A search that admits every file passes the index no key list, so the snapshot must hold no key
    # that no file lists, even when the counts agree.
    keys = sorted(store.chunks)
    other = VectorIndex(store.dim)
    other.add([k + 1000 for k in keys], store.index._rows[[store.index._row_of[k] for k in keys]])
    assert VectorStore.from_bytes(store.to_bytes(), store.store_id).files.keys() == store.files.keys()
    store.index = other
    with pytest.raises(SealedStoreError, match="disagree"):
        VectorStore.from_bytes(store.to_bytes(), store.store_id)
