"""OpenAI's /v1/embeddings: the request as OpenAI documents it, and the response body built from
the worker's float32 rows (float lists, or base64 of the little-endian float32 bytes as OpenAI's
`encoding_format: "base64"` gives them)."""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from pydantic import Field, field_validator

from protocol.openai.schemas import Strict

# OpenAI's bound on one request's inputs; the worker checks it again with the token bounds.
MAX_EMBEDDING_INPUTS = 2048
MAX_TOKEN_ID = (1 << 32) - 1  # uint32 on the worker protocol

Input = str | list[str] | list[int] | list[list[int]]


def as_list(raw: Input) -> list[str | list[int]]:
    if isinstance(raw, str):
        return [raw]
    if raw and all(isinstance(t, int) for t in raw):
        return [[int(t) for t in raw]]  # type: ignore[arg-type]
    return [item if isinstance(item, str) else [int(t) for t in item] for item in raw]  # type: ignore[union-attr]


class EmbeddingsRequest(Strict):
    model: str = Field(min_length=1, max_length=256)
    input: Input
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = Field(default=None, max_length=256)

    @field_validator("input")
    @classmethod
    def _bounded(cls, raw: Input) -> Input:
        """Checked on the field, so a refusal names `input` and says why (the 400's message)."""
        items = as_list(raw)
        if not items:
            raise ValueError("input must not be empty")
        if len(items) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"input has {len(items)} items; at most {MAX_EMBEDDING_INPUTS} per request")
        for i, item in enumerate(items):
            if not item:
                raise ValueError(f"input[{i}] is empty")
            if isinstance(item, list) and any(not 0 <= t <= MAX_TOKEN_ID for t in item):
                raise ValueError(f"input[{i}] has a token id outside 0..{MAX_TOKEN_ID}")
        return raw

    def inputs(self) -> list[str | list[int]]:
        """The inputs as a list, each a text or a token-id list (a flat id list is one input)."""
        return as_list(self.input)

    def reserve_tokens(self) -> int:
        """A worst-case estimate of the tokens the inputs will take (settled with the signed usage)."""
        return sum(len(i) // 3 + 2 if isinstance(i, str) else len(i) for i in self.inputs())


def rows(vectors: bytes, dimensions: int) -> list[bytes]:
    """The reply's little-endian float32 rows, each `dimensions` wide (a malformed reply raises ValueError)."""
    width = dimensions * 4
    if dimensions <= 0 or len(vectors) % width:
        raise ValueError("the worker's vectors do not divide into rows of its dimensions")
    return [vectors[i:i + width] for i in range(0, len(vectors), width)]


def embeddings_body(model: str, row_bytes: list[bytes], encoding_format: str, prompt_tokens: int
                    ) -> dict[str, Any]:
    def encode(row: bytes) -> list[float] | str:
        if encoding_format == "base64":
            return base64.b64encode(row).decode()
        return list(struct.unpack(f"<{len(row) // 4}f", row))

    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": encode(r)} for i, r in enumerate(row_bytes)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
