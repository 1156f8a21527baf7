"""OpenAI's static chunking, counted in the embedding model's tokens."""

from __future__ import annotations

import re

import pytest

from enclave_worker.retrieval.chunking import ChunkingStrategy, chunk_text, chunking_strategy
from enclave_worker.retrieval.errors import InvalidRetrievalRequest


def _offsets(text: str) -> list[tuple[int, int]]:  # one token a word, like a tokenizer's offsets
    return [m.span() for m in re.finditer(r"\S+", text)]


def test_auto_is_openais_default_capped_to_the_window() -> None:
    assert chunking_strategy(None, window=4096) == ChunkingStrategy(800, 400)
    assert chunking_strategy({"type": "auto"}, window=254) == ChunkingStrategy(254, 127)


def test_static_windows_overlap_and_cover_the_text() -> None:
    text = " ".join(f"w{i}" for i in range(250))
    chunks = chunk_text(text, _offsets(text), ChunkingStrategy(100, 40))
    assert [c.tokens for c in chunks] == [100, 100, 100, 70]
    assert [c.text.split()[0] for c in chunks] == ["w0", "w60", "w120", "w180"]
    assert chunks[-1].text.endswith("w249") and all(text[c.start:c.end] == c.text for c in chunks)


def test_a_short_text_is_one_chunk_and_an_empty_one_none() -> None:
    assert [c.text for c in chunk_text("a b c", _offsets("a b c"), ChunkingStrategy(100, 0))] == ["a b c"]
    assert chunk_text("   ", [], ChunkingStrategy(100, 0)) == []


@pytest.mark.parametrize(("raw", "message"), [
    ({"type": "semantic"}, "must be 'auto' or 'static'"),
    ({"type": "static"}, "must be 'auto' or 'static'"),
    ({"type": "static", "static": {"max_chunk_size_tokens": 99, "chunk_overlap_tokens": 0}}, "from 100 to 4096"),
    ({"type": "static", "static": {"max_chunk_size_tokens": 4097, "chunk_overlap_tokens": 0}}, "from 100 to 4096"),
    ({"type": "static", "static": {"max_chunk_size_tokens": True, "chunk_overlap_tokens": 0}}, "from 100 to 4096"),
    ({"type": "static", "static": {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 101}}, "half"),
    ({"type": "static", "static": {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": -1}}, "half"),
    ({"type": "static", "static": {"max_chunk_size_tokens": 200}}, "half"),
    ({"type": "static", "static": {"max_chunk_size_tokens": 300, "chunk_overlap_tokens": 0}}, "reads at once"),
])
def test_bad_strategies_are_refused(raw: dict, message: str) -> None:
    with pytest.raises(InvalidRetrievalRequest, match=message):
        chunking_strategy(raw, window=254)
