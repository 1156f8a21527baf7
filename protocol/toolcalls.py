"""Tool calls in a model's answer: the one parser the in-enclave guard and the gateway share.

SmolLM2/Hermes style: `<tool_call>{json}</tool_call>`, where the JSON is one call or a list of
calls, and a call is `{"name": str, "arguments": object}` ("parameters" is accepted for
"arguments"). A block the model did not close (cut off by max_tokens or a stop sequence) runs to
the end of the answer, and JSON it did not finish is repaired (`coerce_json`): a call cut off at
`{"name": "delete_files", "arguments": {"path": "/home` is still a call to delete_files with
path "/home". The guard checks exactly the calls the gateway will turn into OpenAI `tool_calls`,
because both read the answer through `parse_tool_calls`; a second, stricter parser in one of them
is how a call once slipped past the guard (issue #12).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
TOOL_CALL_BLOCK = _BLOCK  # where a block starts and ends; group 1 is its body (protocol/toolcall_stream.py)

JsonObject = Mapping[str, object]


@dataclass(frozen=True)
class GeneratedToolCall:
    """A call the model asked for. `arguments` is the object it wrote, or the JSON text it wrote
    as a string (OpenAI's own shape); the policy parses that text itself, never trusting it."""

    name: str
    arguments: JsonObject | str

    def arguments_json(self) -> str:
        """The arguments as OpenAI's `function.arguments` carries them: a JSON string."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class ParsedAnswer:
    """An answer split into its text and its tool calls. `content` is the answer without any
    tool-call block (stripped); with no calls it is the answer unchanged."""

    content: str
    calls: tuple[GeneratedToolCall, ...]


def parse_tool_calls(text: str) -> ParsedAnswer:
    calls: list[GeneratedToolCall] = []
    for body in _BLOCK.findall(text):
        calls.extend(block_calls(body))
    return ParsedAnswer(content=strip_tool_calls(text) if calls else text, calls=tuple(calls))


def block_calls(body: str) -> list[GeneratedToolCall]:
    """The calls in one block's body (group 1 of TOOL_CALL_BLOCK)."""
    return _calls_from(_decode(body))


def strip_tool_calls(text: str) -> str:
    return _BLOCK.sub("", text).strip()


def streamable_len(text: str) -> int:
    """How much of a tools-enabled answer can be streamed as content: up to a <tool_call> marker, and
    never a tail that could be the start of one."""
    found = text.find(TOOL_CALL_OPEN)
    if found >= 0:
        return found
    for k in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(TOOL_CALL_OPEN[:k]):
            return len(text) - k
    return len(text)


def _decode(body: str) -> object:
    try:
        return json.loads(body)
    except ValueError:
        pass
    if body.lstrip().startswith(("{", "[")):
        return json.loads(coerce_json(body))
    return None


def _calls_from(doc: object) -> list[GeneratedToolCall]:
    calls = []
    for item in doc if isinstance(doc, list) else [doc]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            continue
        args = item.get("arguments", item.get("parameters", {}))
        if args is None:
            args = {}
        if not isinstance(args, dict | str):
            args = json.dumps(args)  # not an object: the policy sees the text and refuses it
        calls.append(GeneratedToolCall(item["name"], args))
    return calls


def coerce_json(text: str) -> str:
    """The first JSON object in `text`; if the model stopped inside it, close it (best effort)."""
    start = text.find("{")
    if start < 0:
        return "{}"
    stack, in_str, esc, last_good = [], False, False, None
    for i, ch in enumerate(text[start:], start):
        if in_str:
            esc = (ch == "\\") and not esc
            if ch == '"' and not esc:
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack:
                break
            stack.pop()
            if not stack:
                candidate = text[start:i + 1]
                try:
                    json.loads(candidate)
                    return candidate
                except ValueError:
                    break
        elif ch == "," and len(stack) == 1:
            last_good = i
    # Unterminated: cut back to the last complete member of the top-level object, then close it.
    for cut in (text[start:], text[start:last_good] if last_good else None):
        if cut is None:
            continue
        fixed = cut + ('"' if in_str and cut is text[start:] else "")
        fixed += "".join(reversed(_open_brackets(fixed)))
        try:
            json.loads(fixed)
            return fixed
        except ValueError:
            continue
    return "{}"


def _open_brackets(text: str) -> list[str]:
    stack: list[str] = []
    in_str = esc = False
    for ch in text:
        if in_str:
            esc = (ch == "\\") and not esc
            if ch == '"' and not esc:
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    return stack
