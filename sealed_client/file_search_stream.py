"""A streamed sealed file_search (docs/retrieval.md "Sealed mode: file_search"): the chat model's
worker streams its Responses events for the grounded request (opened and checked as any sealed
stream: sealed_client/opening.py), and the client turns them into the events the plaintext path
sends for the same request (protocol/openai/responses.py `_Events` with a grounding):

- after `response.in_progress`, the file_search_call item's events, already done (the search ran
  before the answer started): `response.output_item.added`, `response.file_search_call.in_progress`
  / `searching` / `completed`, `response.output_item.done`;
- every worker event's `output_index` one on (the file_search_call item is output 0);
- each citation a `response.output_text.annotation.added` before `response.output_text.done`, and
  in the `content_part.done` part and the `output_item.done` message;
- `tools` and `include` of every response object as the caller sent them, and the final response's
  output with the file_search_call item first and the citations (FileSearchPlan.answer);
- `sequence_number` counted again over the whole stream.

Sans-IO (`GroundedEvents`) plus one byte stream that both drivers read: the worker's stream is
read as it opens, so a cut or a receipt that does not check raises here as it does without the tool."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

import httpx2

from protocol.openai.file_search import Grounding

_TERMINAL = ("response.completed", "response.incomplete", "response.failed")


class Plan(Protocol):
    """What a stream needs of sealed_client/file_search.py's FileSearchPlan (named here: no import circle)."""

    @property
    def request(self) -> dict[str, Any]: ...

    def answer(self, grounding: Grounding, doc: dict[str, Any]) -> dict[str, Any]: ...


class GroundedEvents:
    """Feed the worker's server-sent event bytes; get the plaintext path's events for the same request."""

    def __init__(self, plan: Plan, grounding: Grounding) -> None:
        self._plan, self._grounding = plan, grounding
        self._buffer = b""
        self._seq = 0
        self._searched = False  # the file_search_call item's events are out

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data.replace(b"\r\n", b"\n")
        out: list[bytes] = []
        while b"\n\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n\n", 1)
            out += self._event(raw)
        return out

    def finish(self) -> list[bytes]:
        """What is left when the worker's stream ended (an event without its blank line)."""
        raw, self._buffer = self._buffer, b""
        return self._event(raw) if raw.strip() else []

    def _emit(self, doc: dict[str, Any]) -> bytes:
        doc["sequence_number"], self._seq = self._seq, self._seq + 1
        kind = doc.get("type", "message")
        return f"event: {kind}\ndata: {json.dumps(doc)}\n\n".encode()

    def _searched_events(self) -> list[bytes]:
        self._searched = True
        g, at = self._grounding, 0
        out = [self._emit({"type": "response.output_item.added", "output_index": at, "item": g.item("in_progress")})]
        for stage in ("in_progress", "searching", "completed"):
            out.append(self._emit({"type": f"response.file_search_call.{stage}", "item_id": g.id, "output_index": at}))
        return [*out, self._emit({"type": "response.output_item.done", "output_index": at, "item": g.item()})]

    def _event(self, raw: bytes) -> list[bytes]:
        data = [line[len(b"data:"):].strip() for line in raw.split(b"\n") if line.startswith(b"data:")]
        try:
            doc = json.loads(b"\n".join(data)) if data else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return [raw + b"\n\n"]  # not an event of the Responses API (the end marker): as it came
        kind = doc.get("type", "")
        out: list[bytes] = []
        if not self._searched and kind not in ("response.created", "response.in_progress"):
            out += self._searched_events()  # a stream without in_progress: still before any output
        if isinstance(doc.get("output_index"), int):
            doc["output_index"] += 1
        if isinstance(doc.get("response"), dict):
            doc["response"] = self._response(doc["response"], final=kind in _TERMINAL)
        if kind == "response.output_text.done":
            for n, citation in enumerate(self._grounding.citations(str(doc.get("text", "")))):
                out.append(self._emit({"type": "response.output_text.annotation.added", "item_id": doc.get("item_id"),
                                       "output_index": doc.get("output_index"),
                                       "content_index": doc.get("content_index", 0), "annotation_index": n,
                                       "annotation": citation}))
        elif kind == "response.content_part.done" and isinstance(doc.get("part"), dict):
            self._cite(doc["part"])
        elif kind == "response.output_item.done" and isinstance(doc.get("item"), dict) \
                and doc["item"].get("type") == "message":
            for part in doc["item"].get("content") or []:
                self._cite(part)
        out.append(self._emit(doc))
        if kind == "response.in_progress" and not self._searched:
            out += self._searched_events()
        return out

    def _cite(self, part: dict[str, Any]) -> None:
        if part.get("type") == "output_text":
            part["annotations"] = [*(part.get("annotations") or []), *self._grounding.citations(part.get("text", ""))]

    def _response(self, doc: dict[str, Any], final: bool) -> dict[str, Any]:
        if final:
            return self._plan.answer(self._grounding, doc)
        return {**doc, "tools": self._plan.request.get("tools"),
                "include": self._plan.request.get("include", doc.get("include"))}


class GroundedStream(httpx2.SyncByteStream, httpx2.AsyncByteStream):
    """The worker's opened stream (sync or async, whichever driver opened it) as GroundedEvents gives it."""

    def __init__(self, inner: httpx2.SyncByteStream | httpx2.AsyncByteStream, events: GroundedEvents) -> None:
        self._inner, self._events = inner, events

    def __iter__(self) -> Iterator[bytes]:
        if not isinstance(self._inner, httpx2.SyncByteStream):
            raise TypeError("an async stream read by the sync client")
        for data in self._inner:
            yield from self._events.feed(data)
        yield from self._events.finish()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if not isinstance(self._inner, httpx2.AsyncByteStream):
            raise TypeError("a sync stream read by the async client")
        async for data in self._inner:
            for part in self._events.feed(data):
                yield part
        for part in self._events.finish():
            yield part

    def close(self) -> None:
        if isinstance(self._inner, httpx2.SyncByteStream):
            self._inner.close()

    async def aclose(self) -> None:
        if isinstance(self._inner, httpx2.AsyncByteStream):
            await self._inner.aclose()
