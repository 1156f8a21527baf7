"""The state a stored response keeps, built alike by the gateway (plaintext mode) and the worker
(sealed mode): the response object, its input items, and the turn as chat messages (what a
continuation puts before its new input). The state is sealed by a worker (enclave_worker/response_state.py).
"""

from __future__ import annotations

import secrets
from typing import Any

from protocol.openai.responses_request import ResponsesRequest, input_messages

# In the worker's refusal to open a sealed-mode state for a plaintext answer: the gateway passes that
# refusal on as it is (a 400 naming sealed mode) instead of "can no longer be opened".
SEALED_ONLY = "was stored in sealed mode"


def input_items(items: str | list[dict[str, Any]], fresh_ids: bool = False) -> list[dict[str, Any]]:
    """The request's input as the Responses API lists it (`input_items`): typed items with ids (new
    ones with `fresh_ids`: a conversation's item ids are this server's, never the caller's)."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    out = []
    for item in items:
        kind = item.get("type", "message")
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(kind, "item")
        given = None if fresh_ids else item.get("id")
        entry = {**item, "type": kind, "id": given or f"{prefix}_{secrets.token_hex(12)}"}
        if kind == "message":
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            content = item.get("content")
            entry["content"] = [{"type": part, "text": content}] if isinstance(content, str) else content
            entry.setdefault("status", "completed")
        out.append(entry)
    return out


def state_document(req: ResponsesRequest, response: dict[str, Any]) -> dict[str, Any]:
    """The state to seal: the response, this turn's input items, and the turn as chat messages."""
    return {"response": response, "input_items": input_items(req.input),
            "messages": input_messages(req.input) + input_messages(response["output"])}
