"""The I/O a sans-IO flow of the client asks for, and the two drivers that do it, one blocking and
one awaited (as h11 and httpcore keep the protocol apart from the I/O), so that the sync and the async
transport run the same pin, seal, retry and open code (sealed_client/flow.py, file_search.serve).

A flow is a generator: it yields a step, and is sent the step's result. An error of the I/O is
thrown into the flow at the step that asked for it, so the flow meets it where a direct call would
have raised it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

import httpx2

from sealed_client.answer import AnswerReader
from sealed_client.opening import open_answer, open_answer_async

T = TypeVar("T")


@dataclass(frozen=True)
class Send:
    """Post `request` through the inner transport; the answer comes back unread (its stream open)."""

    request: httpx2.Request


@dataclass(frozen=True)
class Read:
    """Read the whole body of `response`, then close it."""

    response: httpx2.Response


@dataclass(frozen=True)
class ReadRequest:
    """The caller's request body."""

    request: httpx2.Request


@dataclass(frozen=True)
class Open:
    """Open the sealed answer `response` with `reader` into the response the SDK reads
    (sealed_client/opening.py)."""

    response: httpx2.Response
    reader: AnswerReader


Step = Send | Read | ReadRequest | Open
Flow = Generator[Step, object, T]


def _result(value: object, kind: type[T]) -> T:
    if not isinstance(value, kind):
        raise TypeError(f"a driver answered a step with {type(value).__name__}, not {kind.__name__}")
    return value


def send(request: httpx2.Request) -> Flow[httpx2.Response]:
    return _result((yield Send(request)), httpx2.Response)


def read(response: httpx2.Response) -> Flow[bytes]:
    return _result((yield Read(response)), bytes)


def read_request(request: httpx2.Request) -> Flow[bytes]:
    return _result((yield ReadRequest(request)), bytes)


def open_sealed(response: httpx2.Response, reader: AnswerReader) -> Flow[httpx2.Response]:
    return _result((yield Open(response, reader)), httpx2.Response)


# What a step came to: its result, or the error its I/O raised (thrown into the flow).
_Outcome = tuple[object, Exception | None]


@dataclass(frozen=True)
class _Done(Generic[T]):
    value: T


def _next(flow: Flow[T], outcome: _Outcome) -> Step | _Done[T]:
    """The flow's next step, given what the last came to; _Done with its value at its end."""
    result, error = outcome
    try:
        return flow.send(result) if error is None else flow.throw(error)
    except StopIteration as done:
        return _Done(cast(T, done.value))


def _do(step: Step, inner: Callable[[httpx2.Request], httpx2.Response]) -> _Outcome:
    try:
        if isinstance(step, Send):
            return inner(step.request), None
        if isinstance(step, Read):
            try:
                return step.response.read(), None
            finally:
                step.response.close()
        if isinstance(step, ReadRequest):
            return step.request.read(), None
        return open_answer(step.response, step.reader), None
    except Exception as exc:  # handed to the flow, which raises it on where it does not handle it
        return None, exc


async def _do_async(step: Step, inner: Callable[[httpx2.Request], Awaitable[httpx2.Response]]) -> _Outcome:
    try:
        if isinstance(step, Send):
            return await inner(step.request), None
        if isinstance(step, Read):
            try:
                return await step.response.aread(), None
            finally:
                await step.response.aclose()
        if isinstance(step, ReadRequest):
            return await step.request.aread(), None
        return await open_answer_async(step.response, step.reader), None
    except Exception as exc:
        return None, exc


def drive(flow: Flow[T], inner: Callable[[httpx2.Request], httpx2.Response]) -> T:
    """Run `flow` to its end, blocking; `inner` sends a request (the inner transport)."""
    step = _next(flow, (None, None))
    while not isinstance(step, _Done):
        step = _next(flow, _do(step, inner))
    return step.value


async def drive_async(flow: Flow[T], inner: Callable[[httpx2.Request], Awaitable[httpx2.Response]]) -> T:
    """`drive`, awaited."""
    step = _next(flow, (None, None))
    while not isinstance(step, _Done):
        step = _next(flow, await _do_async(step, inner))
    return step.value
