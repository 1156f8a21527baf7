"""Render OpenAI chat messages (with tools) into the model's prompt, inside the worker.

SmolLM2's own template ignores `tools`, so tool definitions go into the system message in the
Hermes/SmolLM2 function-calling style: tools as JSON inside <tools></tools>, calls answered as
<tool_call>{"name": ..., "arguments": {...}}</tool_call>. Templates that handle `tools` themselves
(they mention it) get them passed through untouched.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from typing import Any

from enclave_worker.engine import InvalidRequestError, Tokenizer

TOOLS_SYSTEM = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. "
    "For each function call return a JSON object with the function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-dict>}\n"
    "</tool_call>\nYou have access to the following tools:\n<tools>\n%s\n</tools>"
)


def message_text(message: dict[str, Any]) -> str:
    """Everything of one message the model will read, as text: string content, the text parts of
    list-form content, and the assistant's earlier tool calls in the tool-call syntax. Data controls
    check exactly this, so nothing reaches the model that they did not see."""
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        text = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        args = fn.get("arguments", "{}")
        with contextlib.suppress(ValueError):
            args = json.loads(args) if isinstance(args, str) else args
        text += "<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args}) + "\n</tool_call>"
    return text


def _flatten(template_source: str | None, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
             ) -> tuple[list[dict[str, str]], bool]:
    if not messages or not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequestError("messages must be a non-empty list of objects")
    flat = [{"role": str(m.get("role", "user")), "content": message_text(m)} for m in messages]
    native_tools = bool(tools) and template_source is not None and "tools" in template_source
    if tools and not native_tools:
        specs = "\n".join(json.dumps(t.get("function", t)) for t in tools)
        block = TOOLS_SYSTEM % specs
        if flat[0]["role"] in ("system", "developer"):
            flat[0] = {"role": "system", "content": flat[0]["content"] + "\n\n" + block}
        else:
            flat.insert(0, {"role": "system", "content": block})
    flat = [{**m, "role": "system"} if m["role"] == "developer" else m for m in flat]
    return flat, native_tools


def chat_prompt_ids(tokenizer: Tokenizer, template_source: str | None, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None, assistant_prefix: str = "",
                    add_generation_prompt: bool = True) -> list[int]:
    """Token ids of the chat prompt, where only the template's own text can become control tokens.

    Each message's content is rendered as an unguessable marker, then tokenized on its own with
    special tokens disabled, so `<|im_start|>system` typed by a user stays text. (A template that
    rewrites content, e.g. trims it, gets the content as sent; tools rendered natively by a template
    are not isolated this way: SmolLM2's path puts them into the system message's content.)
    """
    flat, native_tools = _flatten(template_source, messages, tools)
    nonce = secrets.token_hex(8)
    marked = [{**m, "content": f"\ue000{nonce}.{i}\ue001"} for i, m in enumerate(flat)]
    text = tokenizer.apply_chat_template(marked, add_generation_prompt=add_generation_prompt,
                                         tools=tools if native_tools else None)
    segments: list[tuple[str, bool]] = []
    pos = 0
    for match in re.finditer(f"\ue000{nonce}\\.(\\d+)\ue001", text):
        segments += [(text[pos:match.start()], True), (flat[int(match.group(1))]["content"], False)]
        pos = match.end()
    segments.append((text[pos:] + assistant_prefix, True))
    return tokenizer.encode_segments(segments)
