"""Render OpenAI chat messages (with tools) into the model's prompt, inside the worker.

SmolLM2's own template ignores `tools`, so tool definitions go into the system message in the
Hermes/SmolLM2 function-calling style: tools as JSON inside <tools></tools>, calls answered as
<tool_call>{"name": ..., "arguments": {...}}</tool_call>. Templates that handle `tools` themselves
(they mention it) get them passed through untouched.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from enclave_worker.engine import InvalidRequestError, Tokenizer

TOOLS_SYSTEM = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. "
    "For each function call return a JSON object with the function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-dict>}\n"
    "</tool_call>\nYou have access to the following tools:\n<tools>\n%s\n</tools>"
)


def _content(message: dict[str, Any]) -> str:
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


def render_chat(tokenizer: Tokenizer, template_source: str | None, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None, assistant_prefix: str = "") -> str:
    if not messages:
        raise InvalidRequestError("messages must not be empty")
    flat = [{"role": m.get("role", "user"), "content": _content(m)} for m in messages]
    native_tools = bool(tools) and template_source is not None and "tools" in template_source
    if tools and not native_tools:
        specs = "\n".join(json.dumps(t.get("function", t)) for t in tools)
        block = TOOLS_SYSTEM % specs
        if flat[0]["role"] in ("system", "developer"):
            flat[0] = {"role": "system", "content": flat[0]["content"] + "\n\n" + block}
        else:
            flat.insert(0, {"role": "system", "content": block})
    flat = [{**m, "role": "system"} if m["role"] == "developer" else m for m in flat]
    text = tokenizer.apply_chat_template(flat, add_generation_prompt=True, tools=tools if native_tools else None)
    return text + assistant_prefix
