"""What both engines (ours, `LLMEngine`, and the vLLM adapter, `VllmEngine`) do the same way around
their model: the request table, one background thread that steps while there is work, request
validation, aborts, streaming to asyncio and shutdown. A step that raises leaves the engine
unusable, so every waiting request is failed and no new one is taken.

Each engine says what "work" is, how one step runs and how a finished or aborted request gives
back its resources; the thread, its lock and the lifecycle live here once, so a fix to one (a
missed wake-up, a request left hanging after a failed step) holds for both.

No torch import of its own: the vLLM engine imports this from vLLM's virtualenv.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, TypeVar

from .compute_thread import ComputeThread
from .config import RequestOutput, SamplingParams
from .errors import EngineDeadError, InvalidRequestError
from .output_stream import Sink, stream_request

if TYPE_CHECKING:
    from .output_processor import OutputProcessor
    from .sequence import Sequence

log = logging.getLogger(__name__)


class EngineRequest(Protocol):
    """One request as an engine tracks it: its sequence and where its outputs go."""

    @property
    def seq(self) -> Sequence: ...

    @property
    def sink(self) -> Sink: ...


R = TypeVar("R", bound=EngineRequest)


class ThreadedEngine(Generic[R]):
    thread_name: ClassVar[str] = "engine"
    # Set by the engine before the first request (they bound what a request may ask for).
    vocab_size: int
    max_model_len: int
    output: OutputProcessor

    def __init__(self, compute: ComputeThread | None = None) -> None:
        """``compute``: the thread the model was built on, which then runs the step loop (compute_thread.py);
        None: the loop gets a thread of its own."""
        self._compute = compute
        self._requests: dict[str, R] = {}
        self._next_seq_id = 0
        self._cond = threading.Condition(threading.Lock())  # guards the request table and engine state
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._dead: BaseException | None = None

    # ------------------------------------------------------------ what each engine supplies

    def step(self) -> list[RequestOutput]:
        """Run one step of the model and deliver its outputs to the requests' sinks."""
        raise NotImplementedError

    def _has_work(self) -> bool:
        """Under the lock: whether the thread should step now (otherwise it sleeps until notified)."""
        raise NotImplementedError

    def _release(self, req: R, reason: str) -> None:
        """Under the lock: finish `req` with `reason` and give back what it holds (KV blocks)."""
        raise NotImplementedError

    def _pace(self) -> None:
        """Before each step of the thread: wait here when a step could make no progress."""

    def _closed(self) -> None:
        """After shutdown has joined the thread: free what the engine holds beyond its requests."""

    # ------------------------------------------------------------ requests

    def validate(self, request_id: str, prompt: list[int], params: SamplingParams, cache_salt: bytes) -> None:
        """Raise InvalidRequestError unless the request fits this model (vocabulary, context)."""
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be SamplingParams")
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError("request_id must be a non-empty string")
        if not isinstance(cache_salt, bytes):
            raise InvalidRequestError("cache_salt must be bytes")
        if not prompt:
            raise InvalidRequestError("prompt must not be empty")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt):
            raise InvalidRequestError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        if len(prompt) >= self.max_model_len:
            raise InvalidRequestError(
                f"prompt has {len(prompt)} tokens; the context holds {self.max_model_len} (prompt + output)")
        bad = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if bad:
            raise InvalidRequestError(f"unknown stop token ids {bad}")
        bad = [t for t, _ in params.logit_bias if t >= self.vocab_size]
        if bad:
            raise InvalidRequestError(f"logit_bias names token ids outside the vocabulary: {bad[:8]}")

    def _submit(self, request_id: str, make: Callable[[int], R]) -> None:
        """Take a request: `make(seq_id)` builds it and queues it to the engine (under the lock)."""
        with self._cond:
            if self._stopped or self._dead is not None:
                raise EngineDeadError("engine is shut down")
            if request_id in self._requests:
                raise InvalidRequestError(f"duplicate request id {request_id!r}")
            self._requests[request_id] = make(self._next_seq_id)
            self._next_seq_id += 1
            self._cond.notify()

    def abort(self, request_id: str) -> None:
        """Cancel a request and free its KV blocks at once; its sink gets the final output."""
        with self._cond:
            req = self._requests.pop(request_id, None)
            if req is None:
                return
            self._release(req, "abort")
            out = self.output.emit(req.seq)
        req.sink(out)

    def has_unfinished_requests(self) -> bool:
        with self._cond:
            return bool(self._requests)

    # ------------------------------------------------------------ the stepping thread

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not self._has_work():
                    self._cond.wait()
                if self._stopped:
                    return
            try:
                self._pace()
                self.step()
            except BaseException as exc:  # the engine is unusable: fail every request
                log.exception("%s step failed", self.thread_name)
                with self._cond:
                    self._dead = exc
                    reqs, self._requests = list(self._requests.values()), {}
                # The type only: an exception's text could quote a request's content.
                for req in reqs:
                    req.sink(EngineDeadError(f"engine step failed: {type(exc).__name__}"))
                return

    def _ensure_thread(self) -> None:
        if self._thread is not None:
            return
        if self._compute is not None:
            self._compute.start(self._loop)
            self._compute.close()  # the loop is its last call: the thread ends with it
            self._thread = self._compute.thread
        else:
            self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
            self._thread.start()

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, sink: Sink,
                    cache_salt: bytes = b"") -> None:
        raise NotImplementedError

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 cache_salt: bytes = b"") -> AsyncGenerator[RequestOutput, None]:
        """Stream one request's deltas; closing the iterator early aborts the request."""
        def start(sink: Sink) -> None:
            self.add_request(request_id, prompt_token_ids, params, sink, cache_salt)
            self._ensure_thread()

        return stream_request(start, lambda: self.abort(request_id))

    async def shutdown(self) -> None:
        """Abort every request, stop the thread and wait for it, then free the engine (`_closed`)."""
        with self._cond:
            self._stopped = True
            ids = list(self._requests)
            self._cond.notify_all()
        for rid in ids:
            self.abort(rid)
        if self._thread is None and self._compute is not None:  # never stepped: end the idle thread
            self._compute.close()
            self._thread = self._compute.thread
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._closed()
