"""OpenAI answer pieces: tool calls (through protocol.toolcalls, the guard's own parser), JSON mode, logprobs shapes."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from protocol import toolcalls
from protocol.rpc import worker_pb2
from protocol.toolcall_stream import outside_content
from protocol.toolcalls import coerce_json, streamable_len

JSON_SYSTEM = "Respond only with a single valid JSON object."
# Beside tools (tool_choice auto): the answer is calls or this JSON, never prose (tool_grammar.py).
JSON_OR_TOOL_SYSTEM = ("Either call tools, or respond only with a single valid JSON value following this "
                       "JSON schema: ")


def tool_prefix(tool_choice: str | dict[str, Any] | None) -> str:
    """Text the answer is forced to start with, so that `required` and named choices are honoured."""
    if tool_choice == "required":
        return "<tool_call>\n"
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name", "")
        return "<tool_call>\n" + json.dumps({"name": name})[:-1] + ', "arguments": '
    return ""


def parse_tool_calls(text: str, tool_names: set[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """Split an answer into content and OpenAI tool calls, with the parser the worker's guard
    used on the same text (`protocol.toolcalls`); only calls to the request's tools are kept. With
    calls, the content is the text outside them (`outside_content`, which the streamed answer sends
    piece by piece, so both give the same message); without, the answer as it is."""
    parsed = toolcalls.parse_tool_calls(text)
    calls = [{"id": f"call_{secrets.token_hex(12)}", "type": "function",
              "function": {"name": c.name, "arguments": c.arguments_json()}}
             for c in parsed.calls if not tool_names or c.name in tool_names]
    content = outside_content(text) if calls else text
    return (content or None), calls


@dataclass(frozen=True)
class ChatAnswerShape:
    """How a chat answer becomes an OpenAI message: tool calls (`use_tools`), JSON mode, or text.
    `prefix` is the assistant prefix the worker was asked to continue (a forced tool call's
    opening, or "{" in JSON mode); it is part of the answer the worker's guard checked."""

    prefix: str = ""
    use_tools: bool = False
    json_mode: bool = False
    tool_names: frozenset[str] = frozenset()
    constrained: bool = False  # the engine enforced the form: a JSON answer is complete unless cut by length

    @property
    def streams_text(self) -> bool:
        """Forced tool calls and JSON mode: the answer's shape is only known at its end."""
        return not self.prefix

    def streamable(self, text: str) -> int:
        """How much of the answer so far may be sent as content before it ends: with tools, never
        a <tool_call> block or the start of one."""
        if not self.streams_text:
            return 0
        return streamable_len(text) if self.use_tools else len(text)

    def message(self, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The final message for the whole answer `text`, and its finish reason."""
        if self.use_tools:
            content, calls = parse_tool_calls(self.prefix + text, set(self.tool_names))
            if calls:  # a call held for approval was dropped by the guard: the finish reason says so
                return ({"role": "assistant", "content": content, "tool_calls": calls},
                        reason if reason == "requires_approval" else "tool_calls")
            return {"role": "assistant", "content": text}, reason
        if self.json_mode and reason == "length":
            # Cut by the token limit: returned as cut, as OpenAI does. A "repaired" object would parse
            # yet could lack the schema's required keys, and a client that only parses would take it.
            return {"role": "assistant", "content": self.prefix + text}, reason
        if self.json_mode and self.constrained:
            return {"role": "assistant", "content": text}, reason  # valid JSON by construction, any top-level type
        if self.json_mode:
            return {"role": "assistant", "content": coerce_json(self.prefix + text)}, reason
        return {"role": "assistant", "content": text}, reason


def chat_logprobs(items: list[worker_pb2.TokenLogprob]) -> dict[str, Any]:
    return {"content": [{
        "token": lp.token, "logprob": lp.logprob, "bytes": list(lp.token_bytes),
        "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token_bytes)} for t in lp.top],
    } for lp in items], "refusal": None}


def completion_logprobs(items: list[worker_pb2.TokenLogprob], offset: int = 0) -> dict[str, Any]:
    offsets, pos = [], offset
    for lp in items:
        offsets.append(pos)
        pos += len(lp.token)
    return {"tokens": [lp.token for lp in items], "token_logprobs": [lp.logprob for lp in items],
            "top_logprobs": [{t.token: t.logprob for t in lp.top} for lp in items], "text_offset": offsets}
