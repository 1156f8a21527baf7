"""What an OpenAI request asks the answer to be, as a constraint the worker's engine enforces token by
token (protocol/sampling.py::StructuredOutput; enclave_worker/engine/structured.py): JSON mode, a
JSON schema, a forced tool call's JSON, and vLLM's `guided_json` / `guided_regex` / `guided_choice`.

Tool calls: under `required` the answer starts with `<tool_call>\\n` (the assistant prefix) and the
constraint is one call object, `{"name": <one of the offered tools>, "arguments": <that tool's
parameters>}`, so the name is a tool the request offered and the arguments follow its schema; exactly
one call is made (the grammar allows one object). Under a named tool_choice the prefix already holds
`<tool_call>\\n{"name": "<name>", "arguments": ` (so the worker's guard knows the call from the first
token on, before any argument byte exists) and the constraint is the arguments, then the closing
brace (`named_call_arguments_constraint`, a Lark grammar around the JSON schema).
"""

from __future__ import annotations

import json
import re
from typing import Any

from protocol.openai.errors import OpenAIError
from protocol.openai.schemas import ChatCompletionRequest, SamplingFields
from protocol.sampling import InvalidSamplingParams, StructuredOutput

JSON_OBJECT = {"type": "object"}


def _structured(kind: str, spec: str, param: str) -> StructuredOutput:
    try:
        return StructuredOutput(kind, spec)
    except InvalidSamplingParams as exc:  # e.g. a schema over the size limit
        raise OpenAIError(400, str(exc), param=param) from None


def _schema(doc: Any, param: str) -> StructuredOutput:
    if not isinstance(doc, dict | bool):
        raise OpenAIError(400, "a JSON schema must be an object", param=param)
    return _structured("json_schema", json.dumps(doc, ensure_ascii=False), param)


def response_format_constraint(req: ChatCompletionRequest) -> StructuredOutput | None:
    """`json_object`: any JSON object; `json_schema`: its `schema` (strict or not: decoding follows
    it either way), any JSON value where it names none."""
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return _schema(JSON_OBJECT, "response_format")
    body = fmt.json_schema or {}
    return _schema(body.get("schema", {}), "response_format.json_schema.schema")


def tool_call_constraint(tools: list[dict[str, Any]]) -> StructuredOutput:
    """One call to one of `tools` (already narrowed to the named one, for a named tool_choice)."""
    calls = [{"type": "object", "properties": {
        "name": {"const": t["function"]["name"]},
        "arguments": t["function"].get("parameters") or JSON_OBJECT},
        "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return _schema(calls[0] if len(calls) == 1 else {"anyOf": calls}, "tools")


def named_call_arguments_constraint(tool: dict[str, Any]) -> StructuredOutput:
    """The rest of a named call after its prefix: the arguments (the tool's parameters), then `}`."""
    schema = tool["function"].get("parameters") or JSON_OBJECT
    if not isinstance(schema, dict):
        raise OpenAIError(400, "a tool's parameters must be a JSON schema object", param="tools")
    # The same compact layout the engine gives JSON schemas (structured.JSON_DEFAULTS), inline.
    layout = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}
    return _structured("lark", 'start: arguments "}"\narguments: %json ' + json.dumps({**schema, **layout}),
                       "tools")


def guided_constraint(req: SamplingFields) -> StructuredOutput | None:
    """vLLM's extras: at most one of guided_json, guided_regex, guided_choice."""
    given = [(k, v) for k, v in (("guided_json", req.guided_json), ("guided_regex", req.guided_regex),
                                 ("guided_choice", req.guided_choice)) if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise OpenAIError(400, "give at most one of guided_json, guided_regex, guided_choice", param=given[1][0])
    name, value = given[0]
    if name == "guided_json":
        try:
            return _schema(json.loads(value) if isinstance(value, str) else value, name)
        except ValueError:
            raise OpenAIError(400, "guided_json is not valid JSON", param=name) from None
    if isinstance(value, str):  # guided_regex
        return _structured("regex", value, name)
    return _structured("regex", "|".join(f"(?:{_escape(c)})" for c in value), name)  # guided_choice


def _escape(text: str) -> str:
    """`text` as a literal in the grammar library's regex syntax (Rust's regex crate: these
    characters are its metacharacters, and escaping any other is an error there)."""
    return _META.sub(r"\\\g<0>", text)


_META = re.compile(r"[\\.+*?()|\[\]{}^$#&\-~]")
