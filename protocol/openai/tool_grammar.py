"""The answer's grammar under `tool_choice: auto` when the request asks more of it than free text:
`strict` tools, a `response_format` beside the tools, or `parallel_tool_calls: false`.

The answer stays the model's to choose (a message or calls), and the grammar switches on at the
call syntax's opener, `<tool_call>` (the hermes syntax every later stage reads, protocol/toolcalls.py):

- without a response_format the answer is free text up to the opener (a lazy lexeme: the first
  `<tool_call>` ends it), or free text to the end; after the opener, a call object whose name is
  one of the offered tools and whose arguments follow the tool's schema where the tool is strict
  (any JSON object where it is not, as OpenAI leaves them), then `</tool_call>`;
- with a response_format the answer is either that JSON value (its schema, or any object for
  `json_object`) or calls from the first byte on: no prose either way;
- `parallel_tool_calls: false` ends the answer after the first call; otherwise further calls may follow.

The grammar is llguidance's Lark dialect (enclave_worker/engine/structured.py compiles it; vLLM's
guidance backend reads the same text). Families that write calls in another syntax (llama3_json,
mistral) are refused in the worker (enclave_worker/tool_syntax.py::native_structured), not left
unconstrained.
"""

from __future__ import annotations

import json
from typing import Any

from protocol.openai.errors import OpenAIError
from protocol.sampling import InvalidSamplingParams, StructuredOutput

# The engine's compact JSON layout (structured.JSON_DEFAULTS), stated inline in each embedded schema.
_LAYOUT = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}
_OBJECT: dict[str, Any] = {"type": "object"}


def needs_auto_grammar(tools: list[dict[str, Any]], message_schema: dict[str, Any] | None,
                       parallel: bool) -> bool:
    """Whether an auto answer must be constrained at all (free text and lenient calls cost nothing)."""
    return message_schema is not None or not parallel or any(t["function"].get("strict") for t in tools)


def call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """One call object: the name of an offered tool and, for a strict tool, arguments of its schema."""
    calls = []
    for t in tools:
        params = t["function"].get("parameters") or _OBJECT
        if not isinstance(params, dict):
            raise OpenAIError(400, "a tool's parameters must be a JSON schema object", param="tools")
        calls.append({"type": "object", "properties": {
            "name": {"const": t["function"]["name"]},
            "arguments": params if t["function"].get("strict") else _OBJECT},
            "required": ["name", "arguments"], "additionalProperties": False})
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def auto_tools_constraint(tools: list[dict[str, Any]], message_schema: dict[str, Any] | None,
                          parallel: bool) -> StructuredOutput:
    """The grammar described above, as the constraint the worker's engine enforces."""
    if message_schema is not None and not isinstance(message_schema, dict):
        raise OpenAIError(400, "a JSON schema must be an object", param="response_format.json_schema.schema")
    more = ' ("\\n<tool_call>\\n" call "\\n</tool_call>")*' if parallel else ""
    rules = [
        'calls: call "\\n</tool_call>"' + more,
        "call: %json " + json.dumps({**call_schema(tools), **_LAYOUT}, ensure_ascii=False),
    ]
    if message_schema is None:
        rules = ["start: text | opened calls",
                 "text: /(?s:.*)/",
                 # lazy: the lexeme ends at the first opener, where the call's grammar takes over
                 "opened[lazy]: /(?s:.*)<tool_call>\\n/", *rules]
    else:
        rules = ['start: message | "<tool_call>\\n" calls',
                 "message: %json " + json.dumps({**message_schema, **_LAYOUT}, ensure_ascii=False), *rules]
    try:
        return StructuredOutput("lark", "\n".join(rules))
    except InvalidSamplingParams as exc:  # e.g. many large tool schemas: over the spec size limit
        raise OpenAIError(400, str(exc), param="tools") from None
