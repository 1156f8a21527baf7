"""POST /v1/responses, the request: OpenAI's Responses API as a chat completion request.

The Responses API is served by the chat pipeline (plan_chat → worker → guard → answer): a request
becomes the `ChatCompletionRequest` it means (instructions as the system message, input items as
messages, function tools, `text.format` as `response_format`, `max_output_tokens`), so sampling,
constrained decoding and the tenant's tool-use controls apply to it unchanged. Stored state
(`store`, `previous_response_id`, `conversation`) is kept sealed by workers: the gateway's side is
api/gateway/responses_store.py, sealed mode's enclave_worker/sealed_state.py. Every parameter is
honoured or refused with a 400 naming it, never ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError

from protocol.openai.errors import OpenAIError
from protocol.openai.file_search import RESULTS_INCLUDE, has_file_search
from protocol.openai.schemas import MAX_TOKENS, ChatCompletionRequest, Strict

# Responses parameters this server does not serve: refused by name (unknown ones are refused too).
UNSUPPORTED = ("background", "reasoning", "prompt",
               "top_logprobs", "max_tool_calls", "service_tier", "stream_options", "prompt_cache_key",
               "safety_identifier", "context_management")


class ResponsesRequest(Strict):
    model: str = Field(min_length=1, max_length=256)
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    stream: bool = False
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = Field(default=None, max_length=256)
    truncation: Literal["disabled"] | None = None
    # vLLM-style extras (extra_body), as on /v1/chat/completions.
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=64)
    conversation: Any = None  # an id, or {"id": ...}: checked by conversation_id(), a 400 naming it
    # Known Responses parameters this server refuses by name (see UNSUPPORTED).
    background: Any = None
    reasoning: Any = None
    include: Any = None
    prompt: Any = None
    top_logprobs: Any = None
    max_tool_calls: Any = None
    service_tier: Any = None
    stream_options: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    context_management: Any = None


def to_chat(req: ResponsesRequest, file_search: bool = False) -> ChatCompletionRequest:
    """The chat completion request a Responses request means; OpenAIError 400 naming what is refused.
    `file_search`: the caller serves that tool (the gateway in plaintext mode, protocol/openai/file_search.py),
    so it is left out of the chat request's tools; otherwise it is refused by name."""
    for name in UNSUPPORTED:
        if getattr(req, name) is not None:
            raise OpenAIError(400, f"{name} is not supported by this server", param=name)
    _check_include(req.include, {RESULTS_INCLUDE} if has_file_search(req.tools) else set())
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else [])
    messages += _messages(req.input)
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "stream": req.stream, "temperature": req.temperature,
        "top_p": req.top_p, "max_completion_tokens": req.max_output_tokens, "user": req.user, "seed": req.seed,
        "frequency_penalty": req.frequency_penalty, "presence_penalty": req.presence_penalty,
        "repetition_penalty": req.repetition_penalty, "min_p": req.min_p,
        "parallel_tool_calls": req.parallel_tool_calls, "metadata": req.metadata}
    if req.stream:
        body["stream_options"] = {"include_usage": True}  # the final event carries the usage
    tools = [_tool(t, i) for i, t in enumerate(req.tools or []) if not (file_search and t.get("type") == "file_search")]
    if tools:
        body["tools"] = tools
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    if req.text is not None:
        body["response_format"] = _format(req.text)
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:  # name the first field it refused
        errors = exc.errors()
        loc = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else ""
        raise OpenAIError(400, f"invalid request: {loc or 'input'}: {errors[0].get('msg') if errors else exc}",
                          param=_param(loc)) from None


def conversation_id(req: ResponsesRequest) -> str | None:
    """The `conversation` parameter's id (a string or {"id": ...}); OpenAIError 400 for another shape."""
    conv = req.conversation
    if conv is None:
        return None
    if isinstance(conv, dict):
        conv = conv.get("id") if set(conv) == {"id"} else None
    if not isinstance(conv, str) or not 0 < len(conv) <= 64:
        raise OpenAIError(400, "conversation must be a conversation id or {\"id\": ...}", param="conversation")
    if req.previous_response_id is not None:
        raise OpenAIError(400, "previous_response_id and conversation cannot be used together",
                          param="conversation")
    return conv


def _check_include(include: Any, allowed: set[str]) -> None:
    """`include` asks for extra output data. An empty list (the OpenAI Agents SDK always sends one)
    asks for nothing and is accepted; `file_search_call.results` is produced beside a file_search tool;
    every other value is one this server does not produce, and is refused by name rather than ignored."""
    if include is None:
        return
    if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
        raise OpenAIError(400, "include must be a list of strings", param="include")
    for value in include:
        if value not in allowed:
            raise OpenAIError(400, f"include value {value[:64]!r} is not supported by this server",
                              param="include")


def _param(chat_loc: str) -> str:
    """A chat request's field as the Responses request names it."""
    head = chat_loc.split(".")[0]
    return {"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text.format"
            }.get(head, head or "input")


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input (or output) items as the chat messages they mean; OpenAIError 400 naming a bad one."""
    return _messages(items)


def _messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role, content = item.get("role"), item.get("content")
            if role not in ("user", "system", "developer", "assistant"):
                raise OpenAIError(400, f"input[{i}].role must be user, system, developer or assistant",
                                  param=f"input[{i}].role")
            out.append({"role": role, "content": _text(content, i)})
        elif kind == "function_call":
            call = {"id": _str(item, "call_id", i), "type": "function",
                    "function": {"name": _str(item, "name", i), "arguments": _str(item, "arguments", i)}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "file_search_call":
            continue  # a past search: its passages were that turn's context, not a message of the conversation
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": _str(item, "call_id", i),
                        "content": output if isinstance(output, str) else _text(output, i)})
        else:
            raise OpenAIError(400, f"input items of type {str(kind)[:64]!r} are not supported",
                              param=f"input[{i}].type")
    return out


def _str(item: dict[str, Any], key: str, i: int) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise OpenAIError(400, f"input[{i}].{key} must be a string", param=f"input[{i}].{key}")
    return value


def _text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(400, f"input[{i}].content must be a string or a list of parts", param=f"input[{i}].content")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, dict) else None
            raise OpenAIError(400, f"content parts of type {str(kind)[:64]!r} are not supported (text only)",
                              param=f"input[{i}].content[{j}].type")
        if not isinstance(part.get("text"), str):
            raise OpenAIError(400, "a text part needs its text", param=f"input[{i}].content[{j}].text")
        texts.append(part["text"])
    return "".join(texts)


def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") == "file_search":
        raise OpenAIError(400, "the file_search tool is served by the gateway in plaintext mode and by "
                               "SealedOpenAI itself in sealed mode, never inside the chat model's worker",
                          param=f"tools[{i}].type")
    if tool.get("type") != "function":
        raise OpenAIError(400, f"tools of type {str(tool.get('type'))[:64]!r} are not supported (function tools only)",
                          param=f"tools[{i}].type")
    extra = set(tool) - {"type", "name", "description", "parameters", "strict"}
    if extra:
        raise OpenAIError(400, f"unsupported tool field {sorted(extra)[0]!r}", param=f"tools[{i}].{sorted(extra)[0]}")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str) or set(choice) - {"type", "name"}:
        raise OpenAIError(400, "tool_choice must be none, auto, required or {\"type\": \"function\", \"name\": ...}",
                          param="tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def _format(text: dict[str, Any]) -> dict[str, Any]:
    if set(text) - {"format"}:
        name = sorted(set(text) - {"format"})[0]
        raise OpenAIError(400, f"text.{name} is not supported", param=f"text.{name}")
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type")
    if kind in ("text", "json_object") and set(fmt) == {"type"}:
        return {"type": kind}
    if kind == "json_schema" and not set(fmt) - {"type", "name", "schema", "strict", "description"}:
        if not isinstance(fmt.get("schema"), dict):
            raise OpenAIError(400, "text.format.schema must be a JSON schema object", param="text.format.schema")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                       if k in fmt}}
    raise OpenAIError(400, "text.format must be text, json_object or json_schema", param="text.format")
