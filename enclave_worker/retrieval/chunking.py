"""OpenAI's static chunking (vector store files' `chunking_strategy`): windows of at most
`max_chunk_size_tokens` tokens that overlap by `chunk_overlap_tokens`, counted in the embedding
model's own tokens. A chunk's text is the exact span of the document its tokens cover (the
tokenizer's offsets), so a citation quotes the document, not a re-detokenization of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import InvalidRetrievalRequest

# OpenAI's documented bounds and defaults ("auto": 800 / 400).
MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = 100, 4096
AUTO_CHUNK_TOKENS, AUTO_OVERLAP_TOKENS = 800, 400


@dataclass(frozen=True)
class ChunkingStrategy:
    max_chunk_size_tokens: int
    chunk_overlap_tokens: int

    def as_openai(self) -> dict[str, Any]:
        return {"type": "static", "static": {"max_chunk_size_tokens": self.max_chunk_size_tokens,
                                             "chunk_overlap_tokens": self.chunk_overlap_tokens}}


@dataclass(frozen=True)
class Chunk:
    text: str
    start: int  # character offsets of the span in the document
    end: int
    tokens: int


def chunking_strategy(raw: dict[str, Any] | None, window: int) -> ChunkingStrategy:
    """The strategy a request names (None or {"type": "auto"}: OpenAI's 800 / 400, capped to what the
    embedding model reads at once, `window` tokens without its special tokens). A static strategy
    outside OpenAI's bounds, or larger than the window, is refused: a chunk the model cannot read
    whole would be indexed as if it were."""
    if raw is None or raw.get("type") == "auto":
        size = min(AUTO_CHUNK_TOKENS, window)
        return ChunkingStrategy(size, min(AUTO_OVERLAP_TOKENS, size // 2))
    if raw.get("type") != "static" or not isinstance(raw.get("static"), dict):
        raise InvalidRetrievalRequest("chunking_strategy.type must be 'auto' or 'static' (with a 'static' object)")
    static = raw["static"]
    size, overlap = static.get("max_chunk_size_tokens"), static.get("chunk_overlap_tokens")
    if not isinstance(size, int) or isinstance(size, bool) or not MIN_CHUNK_TOKENS <= size <= MAX_CHUNK_TOKENS:
        raise InvalidRetrievalRequest(f"chunking_strategy.static.max_chunk_size_tokens must be an integer from "
                                      f"{MIN_CHUNK_TOKENS} to {MAX_CHUNK_TOKENS}")
    if not isinstance(overlap, int) or isinstance(overlap, bool) or not 0 <= overlap <= size // 2:
        raise InvalidRetrievalRequest("chunking_strategy.static.chunk_overlap_tokens must be an integer from 0 to "
                                      "half of max_chunk_size_tokens")
    if size > window:
        raise InvalidRetrievalRequest(f"chunking_strategy.static.max_chunk_size_tokens {size} exceeds the "
                                      f"{window} tokens this vector store's embedding model reads at once")
    return ChunkingStrategy(size, overlap)


def chunk_text(text: str, offsets: list[tuple[int, int]], strategy: ChunkingStrategy) -> list[Chunk]:
    """Chunks of ``text`` given its tokens' character ``offsets`` (no special tokens)."""
    if not offsets:
        return []
    step = strategy.max_chunk_size_tokens - strategy.chunk_overlap_tokens
    chunks = []
    for first in range(0, len(offsets), step):
        window = offsets[first:first + strategy.max_chunk_size_tokens]
        start, end = window[0][0], window[-1][1]
        chunks.append(Chunk(text=text[start:end], start=start, end=end, tokens=len(window)))
        if first + strategy.max_chunk_size_tokens >= len(offsets):
            break
    return chunks
