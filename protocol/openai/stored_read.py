"""A sealed read of a stored response (protocol/sealed/http.py::STORED_READ): what SealedOpenAI seals
for `GET /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`, the path and query as a body,
so the worker (which alone opens the state) answers them as the gateway does in plaintext mode."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from protocol.openai.schemas import Strict
from protocol.sealed.http import MAX_STATE_ID


class StoredReadRequest(Strict):
    model: str = Field(min_length=1, max_length=256)  # the model whose worker pinned (the blob's version)
    response_id: str = Field(min_length=1, max_length=MAX_STATE_ID)
    part: Literal["response", "input_items"]
    # GET /v1/responses/{id}
    stream: bool | None = None
    include: list[str] | None = None
    # GET /v1/responses/{id}/input_items
    after: str | None = Field(default=None, max_length=MAX_STATE_ID)
    limit: int = Field(default=20, ge=1, le=100)
    order: Literal["asc", "desc"] = "desc"
