"""The Responses and Conversations APIs' items on the wire: a request's input as typed items with
ids, and the cursor pages their list endpoints answer."""

from __future__ import annotations

import secrets
from typing import Any

from protocol.openai.errors import OpenAIError

ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "file_search_call": "fs"}


def input_items(items: str | list[dict[str, Any]], fresh_ids: bool = False) -> list[dict[str, Any]]:
    """The request's input as the Responses API lists it (`input_items`): typed items with ids (new
    ones with `fresh_ids`: a conversation's item ids are this server's, never the caller's)."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    out = []
    for item in items:
        kind = item.get("type", "message")
        given = None if fresh_ids else item.get("id")
        entry = {**item, "type": kind, "id": given or f"{ID_PREFIXES.get(kind, 'item')}_{secrets.token_hex(12)}"}
        if kind == "message":
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            content = item.get("content")
            entry["content"] = [{"type": part, "text": content}] if isinstance(content, str) else content
            entry.setdefault("status", "completed")
        out.append(entry)
    return out


def page(items: list[dict[str, Any]], *, order: str, after: str | None, limit: int) -> dict[str, Any]:
    """A cursor page of items, as OpenAI's list endpoints answer (default order: newest first)."""
    ordered = items[::-1] if order == "desc" else list(items)
    if after is not None:
        ids = [i.get("id") for i in ordered]
        if after not in ids:
            raise OpenAIError(400, f"no item with id '{after[:64]}' in this list", param="after", code="invalid_value")
        ordered = ordered[ids.index(after) + 1:]
    data = ordered[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit}
