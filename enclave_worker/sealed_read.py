"""Reading a stored response back in sealed mode (`GET /v1/responses/{id}` and `…/input_items`
through SealedOpenAI): the client seals the read (protocol/openai/stored_read.py), the gateway
sends the one blob it keeps under the id the client named in clear, and the worker opens it here
and answers with it sealed to the client. The gateway never sees the state in clear.

Only a state a sealed-mode answer stored is read this way: the gateway can have any document
sealed in clear under any id (SealState), so a state without the sealed-mode mark could be one it
made up. The answer's head names the id opened (covered by the receipt), which the client checks.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from enclave_worker.engine import InvalidRequestError
from enclave_worker.response_state import SEALED_MARK, StateUnreadable, open_history
from enclave_worker.state import WorkerState
from protocol.openai.errors import OpenAIError
from protocol.openai.items import page
from protocol.openai.stored_read import StoredReadRequest
from protocol.rpc import worker_pb2
from protocol.sealed.http import ResponseHead


def read_stored(state: WorkerState, request: worker_pb2.SealedRequest, body: bytes) -> tuple[ResponseHead, bytes]:
    """The head and JSON body of a sealed read; OpenAIError (sealed to the client) for anything refused."""
    try:
        read = StoredReadRequest.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors()
        param = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else ""
        raise OpenAIError(400, f"invalid stored-response read: {param or 'body'}", param=param or None,
                          code="invalid_value") from None
    if read.model != request.model:
        raise OpenAIError(400, "the body names another model than the sealed request", param="model")
    if read.include:
        raise OpenAIError(400, f"include value {read.include[0][:64]!r} is not supported by this server",
                          param="include")
    if read.stream:
        raise OpenAIError(400, "streaming a stored response is not supported by this server", param="stream")
    document = _open(state, request, read.response_id)
    if read.part == "response":
        answer: dict[str, Any] = document["response"]
    else:
        answer = page(document["input_items"], order=read.order, after=read.after, limit=read.limit)
    return ResponseHead(200, "application/json", (read.response_id,)), json.dumps(answer).encode()


def _open(state: WorkerState, request: worker_pb2.SealedRequest, response_id: str) -> dict[str, Any]:
    history = list(request.history)
    if len(history) != 1 or history[0].id != response_id:
        raise OpenAIError(400, "the gateway sent another stored state than the one this read names: refused",
                          param="response_id", code="state_mismatch")
    try:
        [document] = open_history(state, request.tenant, history)
    except StateUnreadable:
        raise OpenAIError(404, f"Response with id '{response_id[:64]}' can no longer be opened: the key of the "
                               "model version that stored it is not served, or the stored state was altered",
                          param="response_id", code="state_unreadable") from None
    except InvalidRequestError as exc:
        raise OpenAIError(400, str(exc), param="response_id") from None
    response = document.get("response")
    if document.get(SEALED_MARK) is not True:
        raise OpenAIError(400, f"response {response_id[:64]!r} was stored in plaintext mode: read it with "
                               "GET /v1/responses/{id}; a sealed read opens only responses stored in sealed mode",
                          param="response_id", code="state_mismatch")
    if not isinstance(response, dict) or response.get("id") != response_id \
            or not isinstance(document.get("input_items"), list):
        raise OpenAIError(400, "the stored state is not the response this read names", param="response_id",
                          code="state_mismatch")
    return document
