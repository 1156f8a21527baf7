"""One request inside the worker: render → guard → engine → check → sign.

Every choice the worker generates takes these steps, whether the gateway sent it in plaintext
(the `Generate` RPC) or the worker opened it from a sealed request (`enclave_worker/sealed.py`):

1. render: the prompt's token ids, with the tenant's input data controls (`render.py`);
2. guard: the signed policy's admission limits on the tokens the engine will run;
3. engine: stream the answer (closing the stream aborts the request and frees its KV blocks);
4. check: where output or tool-use controls apply, nothing leaves before the whole answer is checked;
5. sign: the usage record on the last chunk, and the in-enclave decisions (`signing.py`).

A refusal by the tenant's policy is `RequestRefused`, carrying its signed decisions; any other
failure is an `AnswerError` with the status the gateway would answer.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import replace

from enclave_worker.engine import EngineError, InvalidRequestError, RequestOutput, Tokenizer
from enclave_worker.engine.config import TokenLogprob
from enclave_worker.engine_protocol import ServingEngine
from enclave_worker.errors import AnswerError, RequestRefused
from enclave_worker.family_tool_calls import canonical_outputs, native_structured
from enclave_worker.guard import GuardNote, GuardRefusal
from enclave_worker.lifecycle import serving
from enclave_worker.render import prompt_ids
from enclave_worker.stage_times import StageTimes
from enclave_worker.state import WorkerState
from enclave_worker.tool_stream import ToolCallRelease
from enclave_worker.tool_syntax import ToolCallSyntaxError, syntax_for_template
from protocol.rpc import worker_pb2
from protocol.rpc.sampling import from_wire
from protocol.toolcalls import strip_tool_calls

Outputs = AsyncGenerator[RequestOutput, None]


class Answer:
    """One choice of one request. Iterate `chunks()`; when it ends, answered or refused,
    `decisions` holds the decisions the worker signed for it (for the gateway's audit trail)."""

    def __init__(self, state: WorkerState, request: worker_pb2.GenerateRequest,
                 timing: StageTimes | None = None) -> None:
        self.state, self.request = state, request
        self.timing = timing  # stamped for traces only (stage_times.py); None when tracing is off
        self.notes: list[GuardNote] = []  # decisions that let the request go on (redactions, held calls)
        self.decisions: tuple[worker_pb2.UsageRecord, ...] = ()
        self.ended = False  # answered or refused: `decisions` is final
        self.progress: tuple[int, int] | None = None  # (prompt, completion) tokens the engine has run so far
        self.started = state.clock.monotonic()

    async def chunks(self) -> AsyncGenerator[worker_pb2.GenerateChunk, None]:
        engine = self._engine()
        started = self.started = self.state.clock.monotonic()
        try:
            stream, first = await self._start(engine)  # render → guard → engine
            async with contextlib.aclosing(stream):  # leaving early aborts the engine request
                if self._checks_whole_answer():
                    outs = await _rest(first, stream, self._ran)
                    yield self._sign_usage(self._checked(engine.tokenizer, outs), started)  # check → sign
                elif self._checks_tool_calls():
                    async for chunk in self._released(engine.tokenizer, first, stream, started):
                        yield chunk
                else:
                    async for chunk in self._streamed(engine.tokenizer, first, stream, started):
                        yield chunk
        except GuardRefusal as exc:
            self.decisions = self.state.signer.decisions(self.request, self.notes, exc, self.state.clock.now())
            self.ended = True
            raise RequestRefused(str(exc), self.decisions) from exc
        self.decisions = self.state.signer.decisions(self.request, self.notes, None, self.state.clock.now())
        self.ended = True

    def decisions_so_far(self) -> tuple[worker_pb2.UsageRecord, ...]:
        """The signed decisions, also of an answer cut short (its client left): those noted so far."""
        if self.ended:
            return self.decisions
        return self.state.signer.decisions(self.request, self.notes, None, self.state.clock.now())

    def usage_so_far(self) -> worker_pb2.UsageRecord | None:
        """A signed usage record for the tokens run so far (an answer cut short is metered too);
        None if the engine never ran this request."""
        if self.progress is None:
            return None
        clock = self.state.clock
        return self.state.signer.usage(self.request, *self.progress, clock.monotonic() - self.started, clock.now())

    def _engine(self) -> ServingEngine:
        if not serving(self.state) or self.state.booted is None:  # serving() may have just revoked the key
            raise AnswerError(503, "model unavailable", type_="model_unavailable", code="model_unavailable")
        return self.state.booted.engine

    async def _start(self, engine: ServingEngine) -> tuple[Outputs, RequestOutput]:
        state, request = self.state, self.request
        state.cold_start.first_request()
        try:
            prompt = prompt_ids(engine, state.guard, state.settings.model, request, self.notes)
            if state.guard is not None and request.tools_json:  # a call forced by name: judged before any byte
                state.guard.check_forced_call(request.key_id, request.assistant_prefix, request.agent_killed)
            params = from_wire(request.params)
            syntax = syntax_for_template(engine.tokenizer.chat_template) if request.tools_json else None
            if syntax is not None:  # a forced call is constrained in the family's own syntax
                params = replace(params, structured=native_structured(syntax, request.assistant_prefix,
                                                                      params.structured))
            if state.guard is not None:
                state.guard.check_admission(request.key_id, state.settings.model, len(prompt), params.max_tokens)
            timing = self.timing
            if timing is not None:
                timing.submitted = time.monotonic()
            stream = engine.generate(request.request_id, prompt, params, cache_salt=state.cache_salt(request.tenant))
            if syntax is not None and syntax.checked:  # the family's calls, rewritten as the one syntax the rest reads
                stream = canonical_outputs(stream, syntax, engine.tokenizer, _tool_names(request.tools_json),
                                           request.assistant_prefix)
            self.progress = (len(prompt), 0)  # from here on, an answer cut short is metered
            first = await anext(stream)
            state.cold_start.first_token()
            if timing is not None:
                timing.first, timing.scheduled = time.monotonic(), first.scheduled_at
            self._ran(first)
            return stream, first
        except ToolCallSyntaxError as exc:
            raise _invalid_call(exc) from exc
        except (InvalidRequestError, ValueError) as exc:
            raise AnswerError(400, str(exc), code="invalid_value") from exc
        except EngineError as exc:
            raise AnswerError(503, "engine unavailable", type_="server_error", code="model_unavailable") from exc

    def _checks_whole_answer(self) -> bool:
        """Output controls: nothing may leave the worker before the whole answer is checked."""
        guard = self.state.guard
        return guard is not None and guard.buffers_output

    def _checks_tool_calls(self) -> bool:
        """Tool-use controls: each call leaves only once judged (enclave_worker/tool_stream.py)."""
        guard = self.state.guard
        return guard is not None and guard.policy_set is not None and bool(self.request.tools_json)

    async def _released(self, tokenizer: Tokenizer, first: RequestOutput, stream: Outputs,
                        started: float) -> AsyncIterator[worker_pb2.GenerateChunk]:
        """The answer as the tool-use controls release it: text outside calls as it is generated, a
        call once judged. Token ids and logprobs wait while any text is held (they would show it)."""
        guard, request = self.state.guard, self.request
        assert guard is not None
        release = ToolCallRelease(guard, request.key_id, request.assistant_prefix, request.agent_killed, self.notes)
        text, out = request.assistant_prefix, first
        ids: list[int] = []
        logprobs: list[worker_pb2.TokenLogprob] = []
        while True:
            text += out.delta_text
            ids.extend(out.delta_token_ids)
            logprobs.extend(wire_logprobs(tokenizer, out.logprobs))
            piece = release.release(text, out.finished)
            if out.finished or piece or (not release.holding and ids):
                finish = "requires_approval" if out.finished and release.held_for_approval else out.finish_reason
                chunk = worker_pb2.GenerateChunk(
                    text=piece, finish_reason=finish or "", prompt_tokens=out.prompt_tokens,
                    completion_tokens=out.completion_tokens)
                if not release.holding and not release.held_for_approval:  # a dropped call's ids never leave
                    chunk.token_ids.extend(ids)
                    chunk.logprobs.extend(logprobs)
                    ids, logprobs = [], []
                yield self._sign_usage(chunk, started) if out.finished else chunk
            if out.finished:
                return
            out = await _next(stream)
            self._ran(out)

    async def _streamed(self, tokenizer: Tokenizer, first: RequestOutput, stream: Outputs,
                        started: float) -> AsyncIterator[worker_pb2.GenerateChunk]:
        out = first
        while True:
            chunk = worker_pb2.GenerateChunk(
                text=out.delta_text, token_ids=list(out.delta_token_ids), finish_reason=out.finish_reason or "",
                prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
                logprobs=wire_logprobs(tokenizer, out.logprobs))
            yield self._sign_usage(chunk, started) if out.finished else chunk
            if out.finished:
                return
            out = await _next(stream)
            self._ran(out)

    def _ran(self, out: RequestOutput) -> None:
        self.progress = (out.prompt_tokens, out.completion_tokens)

    def _checked(self, tokenizer: Tokenizer, outs: Sequence[RequestOutput]) -> worker_pb2.GenerateChunk:
        """The whole answer as one chunk, after the tenant's tool-call and output controls."""
        request, guard, last = self.request, self.state.guard, outs[-1]
        assert guard is not None  # _checks_whole_answer
        text = "".join(o.delta_text for o in outs)
        # A forced tool choice puts the opening of the call in the prompt: check what the client sees.
        finish = (guard.check_tools(request.key_id, request.assistant_prefix + text, request.agent_killed,
                                    self.notes) if request.tools_json else "")
        text = guard.check_output(request.key_id, self.state.settings.model, text, self.notes)
        if finish == "requires_approval":
            # Held back: a human approves before any such call is made.
            text = "" if request.assistant_prefix else strip_tool_calls(text)
        return worker_pb2.GenerateChunk(
            text=text, token_ids=[t for o in outs for t in o.delta_token_ids],
            finish_reason=finish or last.finish_reason or "", prompt_tokens=last.prompt_tokens,
            completion_tokens=last.completion_tokens,
            logprobs=[lp for o in outs for lp in wire_logprobs(tokenizer, o.logprobs)])

    def _sign_usage(self, last: worker_pb2.GenerateChunk, started: float) -> worker_pb2.GenerateChunk:
        clock = self.state.clock
        last.usage.CopyFrom(self.state.signer.usage(self.request, last.prompt_tokens, last.completion_tokens,
                                               clock.monotonic() - started, clock.now()))
        return last


async def _next(stream: Outputs) -> RequestOutput:
    try:
        return await anext(stream)
    except EngineError as exc:
        raise AnswerError(503, "engine failed", type_="server_error", code="worker_lost") from exc
    except ToolCallSyntaxError as exc:
        raise _invalid_call(exc) from exc


def _invalid_call(exc: ToolCallSyntaxError) -> AnswerError:
    """The model's own output holds a malformed call: a clear error, never the call passed on as text."""
    return AnswerError(500, str(exc), type_="server_error", code="invalid_tool_call")


def _tool_names(tools_json: str) -> frozenset[str]:
    tools = json.loads(tools_json)
    return frozenset(t.get("function", t).get("name") for t in tools if isinstance(t, dict)) - {None}


async def _rest(first: RequestOutput, stream: Outputs, ran: Callable[[RequestOutput], None]) -> list[RequestOutput]:
    outs = [first]
    while not outs[-1].finished:
        outs.append(await _next(stream))
        ran(outs[-1])
    return outs


def wire_logprobs(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob] | None) -> list[worker_pb2.TokenLogprob]:
    """The engine's logprobs as the gRPC message carries them (each token also as its text)."""
    if not logprobs:
        return []

    def piece(tid: int) -> str:
        return tokenizer.decode([tid], skip_special_tokens=False)

    return [worker_pb2.TokenLogprob(
        token=piece(lp.token_id), logprob=lp.logprob, token_bytes=piece(lp.token_id).encode(),
        top=[worker_pb2.TopLogprob(token=piece(t), logprob=v, token_bytes=piece(t).encode()) for t, v in lp.top],
    ) for lp in logprobs]
