"""The state a stored response keeps, built alike by the gateway (plaintext mode) and the worker
(sealed mode): the response object, its input items, and the turn as chat messages (what a
continuation puts before its new input). The state is sealed by a worker (enclave_worker/response_state.py).
"""

from __future__ import annotations

from typing import Any

from protocol.openai.items import input_items
from protocol.openai.responses_request import ResponsesRequest, input_messages

# In the worker's refusal to open a sealed-mode state for a plaintext answer: the gateway passes that
# refusal on as it is (a 400 naming sealed mode) instead of "can no longer be opened".
SEALED_ONLY = "was stored in sealed mode"


def state_document(req: ResponsesRequest, response: dict[str, Any]) -> dict[str, Any]:
    """The state to seal: the response, this turn's input items, and the turn as chat messages."""
    return {"response": response, "input_items": input_items(req.input),
            "messages": input_messages(req.input) + input_messages(response["output"])}
