"""A request's prompt as the engine sees it: rendered, tokenized, with the input data controls applied.

The pipeline's first step (`enclave_worker/answer.py`), and the whole of the Tokenize RPC, so
`/tokenize` counts exactly the tokens a generation would run.
"""

from __future__ import annotations

import json
import logging

from enclave_worker.chat_format import chat_prompt_ids
from enclave_worker.engine import InvalidRequestError
from enclave_worker.engine_protocol import ServingEngine
from enclave_worker.family_tool_calls import native_prefix
from enclave_worker.guard import GuardNote, GuardRefusal, WorkerGuard
from enclave_worker.tool_syntax import syntax_for_template
from protocol.rpc import worker_pb2

log = logging.getLogger(__name__)


def prompt_ids(engine: ServingEngine, guard: WorkerGuard | None, model: str, request: worker_pb2.GenerateRequest,
               notes: list[GuardNote] | None = None, add_generation_prompt: bool = True) -> list[int]:
    """The prompt's token ids. The guard's input controls run on every text the model will read
    (a refusal raises GuardRefusal; a redaction is noted in `notes`). Anything else wrong with the
    request's content is InvalidRequestError (INVALID_ARGUMENT), never an unhandled error: the
    gateway must not take it for a sick worker."""
    try:
        ids = _render(engine, guard, model, request, notes, add_generation_prompt)
    except (GuardRefusal, InvalidRequestError):
        raise
    except Exception as exc:  # malformed JSON, a template error, text the tokenizer refuses, ...
        log.info("request %s refused: %s", request.request_id, type(exc).__name__)
        raise InvalidRequestError(f"the request cannot be rendered ({type(exc).__name__})") from None
    if not ids:
        raise InvalidRequestError("the prompt is empty")
    return ids


def _render(engine: ServingEngine, guard: WorkerGuard | None, model: str, request: worker_pb2.GenerateRequest,
            notes: list[GuardNote] | None, add_generation_prompt: bool) -> list[int]:
    if request.kind == "chat":
        messages = json.loads(request.messages_json)
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise InvalidRequestError("messages must be a list of objects")
        if guard is not None:  # data controls on every text the model will read
            messages = guard.check_messages(request.key_id, model, messages, notes)
        tokenizer = engine.tokenizer  # only now: a refused request never touches the engine
        prefix = request.assistant_prefix
        if request.tools_json:  # a forced call opens in the family's own syntax (tool_syntax.py)
            prefix = native_prefix(syntax_for_template(tokenizer.chat_template), prefix)
        return chat_prompt_ids(tokenizer, tokenizer.chat_template, messages,
                               json.loads(request.tools_json) if request.tools_json else None,
                               prefix, add_generation_prompt)
    # /v1/completions: the caller writes the whole prompt, special tokens included (as in vLLM).
    prompt = guard.check_input(request.key_id, model, [request.prompt], notes)[0] if guard else request.prompt
    return engine.tokenizer.encode(prompt + request.assistant_prefix)
