"""A Conversations API call on a sealed-mode conversation (protocol/sealed/http.py::CONVERSATIONS):
what SealedOpenAI seals for each `/v1/conversations` route (its path, query and body as one
document), so the worker, which alone opens the conversation, answers it as the gateway does in
plaintext mode. The bounds are the plaintext routes' (api/gateway/conversations.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from protocol.openai.schemas import Strict

MAX_NEW_ITEMS = 20  # OpenAI's, per create
MAX_METADATA = 16  # pairs; keys at most 64 characters, values 512

Op = Literal["create", "retrieve", "update", "list_items", "create_items", "retrieve_item", "delete_item"]
# The ops that need an existing conversation (all but create), and those that change it.
ON_EXISTING = ("retrieve", "update", "list_items", "create_items", "retrieve_item", "delete_item")
WRITES = ("create", "update", "create_items", "delete_item")


class CreateBody(Strict):
    items: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_NEW_ITEMS)
    metadata: dict[str, str] | None = Field(default=None, max_length=MAX_METADATA)
    model: str | None = Field(default=None, min_length=1, max_length=256)


class UpdateBody(Strict):
    metadata: dict[str, str] = Field(max_length=MAX_METADATA)


class ItemsBody(Strict):
    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_NEW_ITEMS)
    model: str | None = Field(default=None, min_length=1, max_length=256)


class ListQuery(Strict):
    after: str | None = Field(default=None, max_length=64)
    limit: int = Field(default=20, ge=1, le=100)
    order: Literal["asc", "desc"] = "desc"
    include: list[str] | None = None


class ConversationCall(Strict):
    model: str = Field(min_length=1, max_length=256)  # the model whose key seals the conversation
    op: Op
    conversation_id: str | None = Field(default=None, min_length=1, max_length=64)
    item_id: str | None = Field(default=None, min_length=1, max_length=64)
    body: dict[str, Any] | None = None  # the route's JSON body (create, update, create_items)
    query: dict[str, Any] = Field(default_factory=dict)  # the route's query (list_items)


def check_metadata(metadata: dict[str, str] | None) -> None:
    """Metadata bounds beyond the schema's: OpenAIError-free (ValueError) so each side raises its own."""
    for k, v in (metadata or {}).items():
        if len(k) > 64 or len(v) > 512:
            raise ValueError("metadata keys are at most 64 characters, values at most 512")
