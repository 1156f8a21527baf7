"""Combinations of Chat Completions parameters that OpenAI answers with a 400, refused here the same way
(each valid alone, meaningless together): nothing is accepted and then ignored (docs/gateway.md,
"Parameter conformance")."""

from __future__ import annotations

import re
from typing import Any

from protocol.openai.errors import OpenAIError
from protocol.openai.schemas import AllowedToolsChoice, ChatCompletionRequest

_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_JSON_SCHEMA_KEYS = frozenset({"name", "description", "schema", "strict"})


def check_chat_combinations(req: ChatCompletionRequest) -> None:
    if not req.tools:
        if req.tool_choice is not None:
            raise OpenAIError(400, "tool_choice is only allowed when tools are specified", param="tool_choice")
        if req.parallel_tool_calls is not None:
            raise OpenAIError(400, "parallel_tool_calls is only allowed when tools are specified",
                              param="parallel_tool_calls")
    if req.top_logprobs is not None and not req.logprobs:
        raise OpenAIError(400, "top_logprobs is only allowed when logprobs is true", param="top_logprobs")
    fmt = req.response_format
    if fmt is None:
        return
    if fmt.type != "json_schema":
        if fmt.json_schema is not None:
            raise OpenAIError(400, f"json_schema is only allowed when response_format.type is json_schema, "
                              f"not {fmt.type}", param="response_format.json_schema")
        return
    body = fmt.json_schema
    if body is None:
        raise OpenAIError(400, "missing required parameter: response_format.json_schema",
                          param="response_format.json_schema")
    unknown = sorted(set(body) - _JSON_SCHEMA_KEYS)
    if unknown:
        raise OpenAIError(400, f"unknown parameter: response_format.json_schema.{unknown[0][:64]}",
                          param=f"response_format.json_schema.{unknown[0][:64]}")
    name = body.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise OpenAIError(400, "response_format.json_schema.name is required: 1 to 64 letters, digits, _ or -",
                          param="response_format.json_schema.name")
    if "strict" in body and not isinstance(body["strict"], bool | None):
        raise OpenAIError(400, "response_format.json_schema.strict must be a boolean",
                          param="response_format.json_schema.strict")


def allowed_tools(tools: list[dict[str, Any]], choice: Any) -> tuple[list[dict[str, Any]], Any]:
    """`tool_choice: {"type": "allowed_tools"}` as the tools it allows and its mode (`auto` or
    `required`), which the rest honours as usual; any other choice passes unchanged. A name that is
    not among `tools` is a 400, as for a named choice."""
    if not isinstance(choice, AllowedToolsChoice):
        return tools, choice
    names = {t.function.get("name") for t in choice.allowed_tools.tools}
    offered = {t["function"]["name"] for t in tools}
    if not names <= offered:
        raise OpenAIError(400, "tool_choice.allowed_tools names a function that is not in tools",
                          param="tool_choice.allowed_tools.tools")
    return [t for t in tools if t["function"]["name"] in names], choice.allowed_tools.mode
