"""Opening a sealed answer into the response the SDK reads (the I/O half: the two drivers of
sealed_client/steps.py call it), once for sync and async: a whole answer
is read and its receipt checked before it is handed over; a stream (server-sent events) is handed
over as it opens, and ends with an error if it was cut or its receipt does not check."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx2

from sealed_client.answer import AnswerReader
from sealed_client.session import RECEIPT_HEADER

_SSE_DONE = b"data: [DONE]\n\n"


def _release(part: bytes, held: list[bytes]) -> list[bytes]:
    """The stream's end marker is held back until the receipt has been checked: an SDK that stops
    reading at [DONE] would otherwise never see (or check) the receipt."""
    if part == _SSE_DONE:
        held.append(part)
        return []
    return [part]


def _whole_answer(reader: AnswerReader, pending: list[bytes]) -> httpx2.Response:
    reader.finish()
    head = reader.head
    assert head is not None
    return httpx2.Response(head.status, headers={"content-type": head.content_type,
                                                 RECEIPT_HEADER: reader.receipt_header()},
                           content=b"".join(pending))


def _stream_head(reader: AnswerReader) -> tuple[int, dict[str, str]] | None:
    """The status and headers of a streamed answer; None for a whole one."""
    assert reader.head is not None
    if not reader.head.content_type.startswith("text/event-stream"):
        return None
    return reader.head.status, {"content-type": reader.head.content_type}


def open_answer(response: httpx2.Response, reader: AnswerReader) -> httpx2.Response:
    chunks = iter(response.stream)  # type: ignore[arg-type]  # the transport's raw bytes
    pending: list[bytes] = []
    try:
        while reader.head is None:
            pending += reader.feed(next(chunks))
    except StopIteration:
        response.close()
        reader.finish()  # raises: truncated before the head
    stream = _stream_head(reader)
    if stream is not None:
        return httpx2.Response(stream[0], headers=stream[1], stream=_SyncBody(reader, pending, chunks, response))
    for data in chunks:
        pending += reader.feed(data)
    response.close()
    return _whole_answer(reader, pending)


async def open_answer_async(response: httpx2.Response, reader: AnswerReader) -> httpx2.Response:
    chunks = response.stream.__aiter__()  # type: ignore[union-attr]
    pending: list[bytes] = []
    try:
        while reader.head is None:
            pending += reader.feed(await anext(chunks))
    except StopAsyncIteration:
        await response.aclose()
        reader.finish()
    stream = _stream_head(reader)
    if stream is not None:
        return httpx2.Response(stream[0], headers=stream[1], stream=_AsyncBody(reader, pending, chunks, response))
    async for data in chunks:
        pending += reader.feed(data)
    await response.aclose()
    return _whole_answer(reader, pending)


class _SyncBody(httpx2.SyncByteStream):
    def __init__(self, reader: AnswerReader, pending: list[bytes], chunks: Iterator[bytes],
                 response: httpx2.Response) -> None:
        self._reader, self._pending, self._chunks, self._response = reader, pending, chunks, response

    def __iter__(self) -> Iterator[bytes]:
        held: list[bytes] = []
        for part in self._pending:
            yield from _release(part, held)
        for data in self._chunks:
            for part in self._reader.feed(data):
                yield from _release(part, held)
        self._reader.finish()  # raises on truncation: the caller never takes a cut answer as whole
        yield from held

    def close(self) -> None:
        self._response.close()


class _AsyncBody(httpx2.AsyncByteStream):
    def __init__(self, reader: AnswerReader, pending: list[bytes], chunks: AsyncIterator[bytes],
                 response: httpx2.Response) -> None:
        self._reader, self._pending, self._chunks, self._response = reader, pending, chunks, response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held: list[bytes] = []
        for part in self._pending:
            for p in _release(part, held):
                yield p
        async for data in self._chunks:
            for part in self._reader.feed(data):
                for p in _release(part, held):
                    yield p
        self._reader.finish()
        for p in held:
            yield p

    async def aclose(self) -> None:
        await self._response.aclose()
