"""POST /v1/chat/completions: plan the choices, then render their chunks as OpenAI answers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from protocol.openai import format as fmt
from protocol.openai.combinations import allowed_tools, check_chat_combinations
from protocol.openai.constraints import (
    guided_constraint,
    named_call_arguments_constraint,
    response_format_constraint,
    tool_call_constraint,
)
from protocol.openai.errors import OpenAIError, error_body
from protocol.openai.runner import (
    SSE_DONE,
    ChoiceRunner,
    ChunkEncoder,
    Streams,
    check_stream_options,
    sampling_params,
    sse,
    usage_of,
)
from protocol.openai.schemas import ChatCompletionRequest, NamedToolChoice
from protocol.openai.tool_deltas import ToolCallDeltas
from protocol.openai.tool_grammar import auto_tools_constraint, needs_auto_grammar
from protocol.rpc import worker_pb2
from protocol.sampling import resolve_max_tokens


@dataclass(frozen=True)
class ChatPlan:
    requests: list[worker_pb2.GenerateRequest]
    prefix: str
    use_tools: bool
    json_mode: bool
    constrained: bool  # the worker's engine enforces the answer's form (protocol/openai/constraints.py)
    tool_names: frozenset[str]
    affinity: str  # the prompt's opening, for prefix-cache routing
    reserve_chars: int

    @property
    def shape(self) -> fmt.ChatAnswerShape:
        return fmt.ChatAnswerShape(prefix=self.prefix, use_tools=self.use_tools, json_mode=self.json_mode,
                                   tool_names=self.tool_names, constrained=self.constrained)


def plan_chat(req: ChatCompletionRequest, *, rid: str, tenant: str, key_id: str, agent_killed: bool,
              default_max_tokens: int) -> ChatPlan:
    check_stream_options(req)
    check_chat_combinations(req)
    if req.store:
        raise OpenAIError(400, "this server keeps no chat completions: store must be false or absent", param="store")
    max_tokens = resolve_max_tokens(req.max_completion_tokens or req.max_tokens, "chat", default_max_tokens)
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    tools, choice = allowed_tools(tools, req.tool_choice)
    choice = choice.model_dump() if isinstance(choice, NamedToolChoice) else choice
    use_tools = bool(tools) and choice != "none"
    prefix, extra_stop = (fmt.tool_prefix(choice) if use_tools else ""), []
    structured = guided_constraint(req)
    if isinstance(choice, dict) and use_tools:
        tools = [t for t in tools if t["function"]["name"] == choice["function"].get("name")]
        if not tools:
            raise OpenAIError(400, "tool_choice names a function that is not in tools", param="tool_choice")
        extra_stop = ["</tool_call>"]
    forced = use_tools and (choice == "required" or isinstance(choice, dict))
    wants_json = req.response_format is not None and req.response_format.type != "text"
    json_mode = wants_json and not use_tools
    if structured is not None and (forced or json_mode):
        raise OpenAIError(400, "guided_* cannot be combined with response_format or a forced tool_choice",
                          param="response_format" if json_mode else "tool_choice")
    message_schema = _message_schema(req) if wants_json and use_tools and not forced else None
    if use_tools and not forced and needs_auto_grammar(tools, message_schema, req.parallel_tool_calls is not False):
        if structured is not None:
            raise OpenAIError(400, "guided_* cannot be combined with strict tools, response_format or "
                              "parallel_tool_calls false", param="tools")
        # A message or calls, chosen by the model; the grammar starts at the call opener (tool_grammar.py).
        structured = auto_tools_constraint(tools, message_schema, req.parallel_tool_calls is not False)
        if message_schema is not None:
            messages = [{"role": "system", "content": fmt.JSON_OR_TOOL_SYSTEM + json.dumps(message_schema)},
                        *messages]
    if forced and isinstance(choice, dict):  # the name is in the prefix; the arguments follow its schema
        structured = named_call_arguments_constraint(tools[0])
    elif forced:  # the whole call is constrained: the name is one of the tools, the arguments follow its schema
        structured = tool_call_constraint(tools)
    if json_mode:
        hint = fmt.JSON_SYSTEM
        if req.response_format and req.response_format.json_schema:
            hint += " It must follow this JSON schema: " + json.dumps(req.response_format.json_schema.get("schema"))
        messages = [{"role": "system", "content": hint}, *messages]
        structured = response_format_constraint(req)  # decoding follows the schema; nothing is forced in text
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    requests = [worker_pb2.GenerateRequest(
        request_id=f"{rid}-{i}", tenant=tenant, key_id=key_id, kind="chat", agent_killed=agent_killed,
        messages_json=json.dumps(messages, ensure_ascii=False),
        tools_json=json.dumps(tools, ensure_ascii=False) if use_tools else "",
        assistant_prefix=prefix, params=sampling_params(req, max_tokens, logprobs, extra_stop, i, structured))
        for i in range(req.n)]
    return ChatPlan(requests=requests, prefix=prefix, use_tools=use_tools, json_mode=json_mode,
                    constrained=structured is not None,
                    tool_names=frozenset(t["function"]["name"] for t in tools),
                    affinity=json.dumps(messages[:2])[:4096], reserve_chars=len(requests[0].messages_json))


def _message_schema(req: ChatCompletionRequest) -> dict[str, Any]:
    """The schema a message must follow beside tools: `json_schema`'s, or any object (`json_object`)."""
    fmt_ = req.response_format
    if fmt_ is None or fmt_.type == "json_object":
        return {"type": "object"}
    schema = (fmt_.json_schema or {}).get("schema", {})
    if not isinstance(schema, dict):
        raise OpenAIError(400, "a JSON schema must be an object", param="response_format.json_schema.schema")
    return schema


async def chat_body(req: ChatCompletionRequest, plan: ChatPlan, run: ChoiceRunner, streams: Streams,
                    base: dict[str, Any]) -> dict[str, Any]:
    """The whole answer as one JSON document (stream=false)."""
    results = await run.collect(streams)
    choices = []
    for i, r in enumerate(results):
        message, reason = plan.shape.message(r.text, r.finish_reason)
        choices.append({"index": i, "message": {**message, "refusal": None}, "finish_reason": reason,
                        "logprobs": fmt.chat_logprobs(r.logprobs) if req.logprobs else None})
    return {**base, "object": "chat.completion", "choices": choices, "usage": usage_of(results)}


def _tool_choices(i: int, tools: ToolCallDeltas, text: str, finish: str | None,
                  lp: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One choice's chunks for new output when tools are on: content, then one chunk per tool-call
    delta (as OpenAI sends them), and at the end the finish reason ("tool_calls" once a call was sent)."""
    content, calls = tools.feed(text, finish is not None)
    last = finish is not None and not tools.count  # an answer without calls ends with its content's rest
    out: list[dict[str, Any]] = []
    if (content and not last) or (lp and not finish):
        out.append({"index": i, "delta": {"content": content}, "finish_reason": None, "logprobs": lp})
        lp = None
    out.extend({"index": i, "delta": {"tool_calls": [call]}, "finish_reason": None, "logprobs": None} for call in calls)
    if finish is not None:
        delta = {"content": content} if last else {}
        reason = "tool_calls" if tools.count and finish != "requires_approval" else finish
        out.append({"index": i, "delta": delta, "finish_reason": reason, "logprobs": lp})
    return out


async def chat_events(req: ChatCompletionRequest, plan: ChatPlan, run: ChoiceRunner, streams: Streams,
                      base: dict[str, Any]) -> AsyncIterator[bytes]:
    """The answer as server-sent events (stream=true), one event per yielded bytes."""
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    # JSON mode (unconstrained): the answer's shape is only known at its end. Tools: text streams
    # until a <tool_call> marker could be starting; each call then streams in OpenAI's delta shape
    # (protocol/openai/tool_deltas.py) as the worker's guard releases it.
    shape = plan.shape
    buffered = not shape.streams_text and not shape.use_tools
    chunk_base = {**base, "object": "chat.completion.chunk"}
    encode = ChunkEncoder(chunk_base)
    texts, sent, results = [""] * req.n, [0] * req.n, [worker_pb2.GenerateChunk()] * req.n
    tools = [ToolCallDeltas(plan.prefix, plan.tool_names) for _ in range(req.n)] if shape.use_tools else []
    # With tools the first delta carries no content: an answer that is only calls then accumulates to
    # content null, as its non-streamed message has it.
    first = {"role": "assistant"} if tools else {"role": "assistant", "content": ""}
    for i in range(req.n):
        yield sse({**chunk_base, "choices": [{"index": i, "delta": first, "finish_reason": None, "logprobs": None}]})
    try:
        async for i, out in run.merged(streams):
            results[i] = out
            texts[i] += out.text
            lp = fmt.chat_logprobs(list(out.logprobs)) if req.logprobs else None
            if tools:
                for choice in _tool_choices(i, tools[i], texts[i], out.finish_reason or None, lp):
                    yield encode(choice)
            elif not buffered and not out.finish_reason:
                upto = shape.streamable(texts[i])
                if upto > sent[i] or lp:
                    yield encode({"index": i, "delta": {"content": texts[i][sent[i]:upto]}, "finish_reason": None,
                                  "logprobs": lp})
                    sent[i] = max(sent[i], upto)
            elif out.finish_reason:
                message, reason = shape.message(texts[i], out.finish_reason)
                message.pop("role")
                if not buffered:
                    message["content"] = texts[i][sent[i]:]
                yield sse({**chunk_base, "choices": [{"index": i, "delta": message,
                                                      "finish_reason": reason, "logprobs": lp}]})
    except OpenAIError as exc:
        yield sse(error_body(exc.message, exc.type, exc.code))
        return
    finally:
        await run.close()
    if include_usage:
        yield sse({**chunk_base, "choices": [], "usage": usage_of(results)})
    yield SSE_DONE
