"""OpenAI response pieces the worker does not produce: tool calls, JSON mode, logprobs shapes."""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from protocol.rpc import worker_pb2

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
JSON_SYSTEM = "Respond only with a single valid JSON object."


def tool_prefix(tool_choice: str | dict[str, Any] | None) -> str:
    """Text the answer is forced to start with, so that `required` and named choices are honoured."""
    if tool_choice == "required":
        return "<tool_call>\n"
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name", "")
        return "<tool_call>\n" + json.dumps({"name": name})[:-1] + ', "arguments": '
    return ""


def streamable_len(text: str) -> int:
    """How much of a tools-enabled answer can be streamed as content: up to a <tool_call> marker, and
    never a tail that could be the start of one."""
    marker = "<tool_call>"
    found = text.find(marker)
    if found >= 0:
        return found
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)


def _calls_from(obj: Any) -> list[dict[str, Any]]:
    items = obj if isinstance(obj, list) else [obj]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            continue
        args = item.get("arguments", item.get("parameters", {}))
        calls.append({"id": f"call_{secrets.token_hex(12)}", "type": "function", "function": {
            "name": item["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return calls


def parse_tool_calls(text: str, tool_names: set[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """Split a SmolLM2/Hermes-style answer into content and tool calls (<tool_call>{json}</tool_call>)."""
    calls: list[dict[str, Any]] = []
    for body in TOOL_CALL_RE.findall(text):
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = json.loads(coerce_json(body)) if body.lstrip().startswith(("{", "[")) else None
        calls += [c for c in _calls_from(parsed) if not tool_names or c["function"]["name"] in tool_names]
    content = TOOL_CALL_RE.sub("", text).strip() if calls else text
    return (content or None), calls


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
