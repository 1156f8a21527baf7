"""POST /v1/responses, the answer: the chat pipeline's answer in the Responses API's shape.

Not streamed, the chat completion becomes a `response` object (a `message` output item for the
text, a `function_call` item per tool call). Streamed, the chat completion's chunks become the
Responses events the openai SDK reads (`response.created`, `response.output_item.added`,
`response.output_text.delta`, `response.function_call_arguments.delta`, ..., `response.completed`):
a tool call's arguments stream in the fragments the worker's guard released
(protocol/openai/tool_deltas.py). A finish held for approval by the tenant's policy is an
`incomplete` response (reason `content_filter`); a cut by max_output_tokens is `incomplete` too.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from protocol.openai.errors import OpenAIError
from protocol.openai.file_search import Grounding
from protocol.openai.responses_request import ResponsesRequest


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _echo(req: ResponsesRequest, base: dict[str, Any], rid: str) -> dict[str, Any]:
    """The response object's fields that do not depend on the answer."""
    extra: dict[str, Any] = {k: base[k] for k in ("tee", "insecure", "system_fingerprint") if k in base}
    return {"id": rid, "object": "response", "created_at": base.get("created", 0), "model": req.model,
            "status": "in_progress", "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "output": [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p, "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [], "text": req.text or {"format": {"type": "text"}},
            "store": bool(base.get("store", False)), "metadata": req.metadata or {},
            "previous_response_id": req.previous_response_id,
            "conversation": {"id": base["conversation"]} if base.get("conversation") else None, "reasoning": None,
            "truncation": "disabled", "user": req.user, "usage": None, **extra}


def _finish(doc: dict[str, Any], reason: str | None, usage: dict[str, int] | None) -> dict[str, Any]:
    incomplete = {"length": "max_output_tokens", "requires_approval": "content_filter"}.get(reason or "")
    doc["status"] = "incomplete" if incomplete else "completed"
    doc["incomplete_details"] = {"reason": incomplete} if incomplete else None
    if usage is not None:
        doc["usage"] = {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens": usage["completion_tokens"],
                        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": usage["total_tokens"]}
    return doc


def _message(item_id: str, text: str, status: str = "completed",
             annotations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [_text_part(text, annotations)] if status == "completed" else []}


def _text_part(text: str, annotations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": annotations or [], "logprobs": []}


def _call(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def responses_body(req: ResponsesRequest, chat: dict[str, Any], base: dict[str, Any],
                   grounding: Grounding | None = None) -> dict[str, Any]:
    """A whole chat completion (stream=false) as a response object (after its file search's item)."""
    choice = chat["choices"][0]
    message = choice["message"]
    doc = _echo(req, base, base.get("response_id") or _id("resp"))
    if grounding is not None:
        doc["output"].append(grounding.item())
    if message.get("content"):
        text = message["content"]
        doc["output"].append(_message(_id("msg"), text, annotations=grounding.citations(text) if grounding else None))
    for call in message.get("tool_calls") or []:
        doc["output"].append(_call(_id("fc"), call["id"], call["function"]["name"], call["function"]["arguments"]))
    return _finish(doc, choice["finish_reason"], chat.get("usage"))


class _Events:
    """The Responses event stream of one answer, built from its chat completion chunks."""

    def __init__(self, req: ResponsesRequest, base: dict[str, Any], grounding: Grounding | None) -> None:
        self.doc = _echo(req, base, base.get("response_id") or _id("resp"))
        self.grounding = grounding
        self.seq = 0
        self.text: dict[str, Any] | None = None  # the open message item: {"index", "id", "text"}
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> {"index", "item"}
        self.reason: str | None = None

    def event(self, kind: str, **fields: Any) -> bytes:
        self.seq += 1
        doc = {"type": kind, "sequence_number": self.seq - 1, **fields}
        return f"event: {kind}\ndata: {json.dumps(doc)}\n\n".encode()

    def start(self) -> list[bytes]:
        out = [self.event("response.created", response=self.doc),
               self.event("response.in_progress", response=self.doc)]
        if self.grounding is None:
            return out
        # The search ran before the answer started: its item's events come first, already done.
        g, index = self.grounding, len(self.doc["output"])
        out.append(self.event("response.output_item.added", output_index=index, item=g.item("in_progress")))
        for stage in ("in_progress", "searching", "completed"):
            out.append(self.event(f"response.file_search_call.{stage}", item_id=g.id, output_index=index))
        self.doc["output"].append(g.item())
        return [*out, self.event("response.output_item.done", output_index=index, item=g.item())]

    def content(self, delta: str) -> list[bytes]:
        out = []
        if self.text is None:
            self.text = {"index": len(self.doc["output"]), "id": _id("msg"), "text": ""}
            self.doc["output"].append(None)
            item = _message(self.text["id"], "", status="in_progress")
            out += [self.event("response.output_item.added", output_index=self.text["index"], item=item),
                    self.event("response.content_part.added", item_id=self.text["id"],
                               output_index=self.text["index"], content_index=0, part=_text_part(""))]
        self.text["text"] += delta
        out.append(self.event("response.output_text.delta", item_id=self.text["id"], output_index=self.text["index"],
                              content_index=0, delta=delta, logprobs=[]))
        return out

    def close_text(self) -> list[bytes]:
        if self.text is None:
            return []
        t, self.text = self.text, None
        citations = self.grounding.citations(t["text"]) if self.grounding else []
        item = _message(t["id"], t["text"], annotations=citations)
        self.doc["output"][t["index"]] = item
        added = [self.event("response.output_text.annotation.added", item_id=t["id"], output_index=t["index"],
                            content_index=0, annotation_index=n, annotation=a) for n, a in enumerate(citations)]
        return [*added,
                self.event("response.output_text.done", item_id=t["id"], output_index=t["index"], content_index=0,
                           text=t["text"], logprobs=[]),
                self.event("response.content_part.done", item_id=t["id"], output_index=t["index"], content_index=0,
                           part=_text_part(t["text"], citations)),
                self.event("response.output_item.done", output_index=t["index"], item=item)]

    def tool_call(self, delta: dict[str, Any]) -> list[bytes]:
        out = []
        call = self.calls.get(delta["index"])
        if call is None:
            out += self.close_text()
            fn = delta.get("function") or {}
            item = _call(_id("fc"), delta.get("id") or _id("call"), fn.get("name", ""), "", status="in_progress")
            call = self.calls[delta["index"]] = {"index": len(self.doc["output"]), "item": item}
            self.doc["output"].append(None)
            out.append(self.event("response.output_item.added", output_index=call["index"], item=item))
        fragment = (delta.get("function") or {}).get("arguments") or ""
        if fragment:
            call["item"]["arguments"] += fragment
            out.append(self.event("response.function_call_arguments.delta", item_id=call["item"]["id"],
                                  output_index=call["index"], delta=fragment))
        return out

    def close_calls(self) -> list[bytes]:
        out = []
        for call in self.calls.values():
            item = {**call["item"], "status": "completed"}
            self.doc["output"][call["index"]] = item
            out += [self.event("response.function_call_arguments.done", item_id=item["id"],
                               output_index=call["index"], name=item["name"], arguments=item["arguments"]),
                    self.event("response.output_item.done", output_index=call["index"], item=item)]
        self.calls = {}
        return out

    def chunk(self, doc: dict[str, Any]) -> list[bytes]:
        if "error" in doc:
            err = doc["error"]
            return [self.event("error", code=err.get("code"), message=err.get("message"), param=err.get("param"),
                               error=err)]
        out: list[bytes] = []
        for choice in doc.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self.content(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self.tool_call(call)
            if choice.get("finish_reason"):
                self.reason = choice["finish_reason"]
                out += self.close_text() + self.close_calls()
        if doc.get("usage"):
            _finish(self.doc, self.reason, doc["usage"])
            self.doc["output"] = [o for o in self.doc["output"] if o is not None]
            kind = "response.completed" if self.doc["status"] == "completed" else "response.incomplete"
            out.append(self.event(kind, response=self.doc))
        return out


async def responses_events(req: ResponsesRequest, chat: AsyncIterator[bytes], base: dict[str, Any],
                           finished: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
                           grounding: Grounding | None = None) -> AsyncIterator[bytes]:
    """The chat completion's server-sent events (with usage) as the Responses API's events.
    `finished` gets the final response object before its terminal event is sent (a stored
    response is kept before the client hears it is done); an error it raises becomes an `error` event."""
    events = _Events(req, base, grounding)
    for part in events.start():
        yield part
    async for raw in chat:
        for line in raw.decode().splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[len("data: "):])
            parts = events.chunk(doc)
            if finished is not None and doc.get("usage") and "error" not in doc:
                try:
                    await finished(events.doc)
                except OpenAIError as exc:  # the answer stands, but it was not stored: say so, not "completed"
                    parts = parts[:-1] + events.chunk({"error": {"code": exc.code, "message": exc.message,
                                                                 "param": exc.param}})
            for part in parts:
                yield part
