"""The worker's gRPC service (`protocol/rpc/worker.proto`): each RPC mapped onto the request pipeline.

Generation, plaintext or sealed, is `enclave_worker/answer.py`; this module only turns its results
and errors into gRPC (statuses, trailing metadata). Cancelling a call (client gone, gateway gave
up) cancels the handler, and the pipeline's cleanup aborts the request in the engine, so its KV
blocks are freed at once; what the call still owed the gateway (its usage record, the tenant's
sealed decision record) goes out with the next heartbeats (`delivery.py`).

Every call that carries content honours the tenant's signed `require_sealed`: Generate, Tokenize
and Detokenize are refused (PERMISSION_DENIED) when the tenant accepts only sealed requests.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc

from enclave_worker.answer import Answer
from enclave_worker.delivery import Delivery
from enclave_worker.embedding import EmbedCall, embedding_engine
from enclave_worker.engine import InvalidRequestError
from enclave_worker.engine_protocol import ServingEngine
from enclave_worker.errors import AnswerError, RequestRefused, SealedRefusal
from enclave_worker.guard import GuardRefusal
from enclave_worker.lifecycle import serving
from enclave_worker.render import prompt_ids
from enclave_worker.response_state import open_state, seal_state, with_history
from enclave_worker.retrieval.service import StoreEncoder
from enclave_worker.retrieval_rpcs import RetrievalRpcs, retrieval_for
from enclave_worker.sealed import SealedAnswer, open_sealed_request
from enclave_worker.signing import decision_metadata
from enclave_worker.stage_times import StageTimes, record_stages
from enclave_worker.state import WorkerState
from protocol.rpc import worker_pb2, worker_pb2_grpc
from protocol.sealed.http import RETRIEVAL_ENDPOINTS
from protocol.tracing import NULL_SPAN, Span, Tracing

_GRPC_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 403: grpc.StatusCode.PERMISSION_DENIED,
               500: grpc.StatusCode.DATA_LOSS,  # the model's output is unusable (a malformed tool call)
               503: grpc.StatusCode.UNAVAILABLE}


def sealed_only(state: WorkerState) -> bool:
    """The tenant's signed policy says prompts reach this worker only sealed (docs/sealed-mode.md)."""
    guard = state.guard
    return guard is not None and guard.policy_set is not None and guard.policy_set.require_sealed


def server_span(tracing: Tracing, context: grpc.aio.ServicerContext, method: str, request_id: str
                ) -> tuple[Span, StageTimes | None]:
    """The RPC's server span, a child of the gateway's call (W3C trace context in the call's
    metadata), and the stamps for its stages; (NULL_SPAN, None) with tracing off."""
    if not tracing.enabled:
        return NULL_SPAN, None
    parent = tracing.extract(tuple(context.invocation_metadata() or ()))
    return tracing.start(f"worker.{method}", parent, kind="server", attributes={
        "rpc.system": "grpc", "rpc.service": "sealed.Worker", "rpc.method": method,
        "sealed.request_id": request_id}), StageTimes()


class WorkerServicer(RetrievalRpcs, worker_pb2_grpc.WorkerServicer):
    def __init__(self, state: WorkerState, encoder: StoreEncoder | None = None) -> None:
        self.state = state
        # Files and vector stores over `encoder`, the worker's embedding model (none: refused).
        self.retrieval = retrieval_for(state, encoder)

    async def _engine(self, context: grpc.aio.ServicerContext) -> ServingEngine:
        if not serving(self.state) or self.state.booted is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model unavailable")
            raise AssertionError("context.abort raises")  # (grpc's stubs do not say so)
        return self.state.booted.engine

    async def Status(self, request: worker_pb2.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> worker_pb2.StatusReply:
        report = self.state.report()
        return worker_pb2.StatusReply(status=report.status, worker_status=report.model_dump_json())

    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        if sealed_only(self.state):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this tenant requires sealed mode")
        if self.state.live.embedder is not None:  # an encoder generates nothing: say so, not "no template"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"model {self.state.settings.model} is an "
                                "embedding model: it serves /v1/embeddings, not chat or completions")
        if request.history:  # a stored response it continues from, opened here only
            try:
                request = with_history(self.state, request)
            except InvalidRequestError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        tracing = self.state.tracing
        span, timing = server_span(tracing, context, "Generate", request.request_id)
        answer = Answer(self.state, request, timing)
        delivery = Delivery(self.state, answer.usage_so_far)
        context.add_done_callback(delivery.settle)
        error = "failed"
        try:
            async for chunk in answer.chunks():
                yield chunk
            if answer.decisions:  # redactions, calls held for approval: signed, at the end of the answer
                context.set_trailing_metadata(decision_metadata(answer.decisions))
            delivery.completed()
        except RequestRefused as exc:
            error = "refused"
            delivery.completed()  # refused before the engine ran: nothing to meter
            # A policy refusal carries the worker's signed decisions for the gateway's audit trail.
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, exc.message,
                                trailing_metadata=decision_metadata(exc.decisions))
        except AnswerError as exc:
            error = exc.code or "answer_error"
            await context.abort(_GRPC_CODES.get(exc.status, grpc.StatusCode.UNAVAILABLE), exc.message)
        else:
            error = ""
        finally:
            delivery.settle()
            if timing is not None:
                record_stages(tracing, span.context, timing, answer.progress, sealed=False)
            span.end(error=error)

    async def SealedGenerate(self, request: worker_pb2.SealedRequest, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[worker_pb2.SealedChunk]:
        release = await self.sealed_store_held(request, context)  # a sealed search's store: before it opens
        try:
            async for chunk in self._sealed(request, context):
                yield chunk
        finally:
            release()

    async def _sealed(self, request: worker_pb2.SealedRequest, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[worker_pb2.SealedChunk]:
        try:
            opened = open_sealed_request(self.state, request)
        except SealedRefusal as exc:
            await context.abort(exc.grpc_code, exc.message)
        tracing = self.state.tracing
        span, _ = server_span(tracing, context, "SealedGenerate", request.request_id)
        answer = SealedAnswer(self.state, request, opened,
                              self.current_retrieval() if request.endpoint in RETRIEVAL_ENDPOINTS else None)
        # The decisions on a sealed request go only into the tenant's sealed record: one for every
        # opened request, decisions or none, so its presence says nothing (docs/sealed-mode.md).
        delivery = Delivery(self.state, answer.usage_so_far, (request, answer.decisions_so_far))
        context.add_done_callback(delivery.settle)
        error = "failed"
        try:
            async for chunk in answer.chunks():
                yield chunk
            context.set_trailing_metadata(delivery.trailers())
            delivery.completed()
            error = ""
        finally:
            delivery.settle()
            for timing in answer.timings():  # stage timing only: no counts, no sizes (sealed)
                record_stages(tracing, span.context, timing, None, sealed=True)
            span.end(error=error)

    async def Tokenize(self, request: worker_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
                       ) -> worker_pb2.TokenizeReply:
        """The token ids the engine would see for this prompt (the same rendering and data controls)."""
        if sealed_only(self.state):  # a prompt in clear, like Generate's
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this tenant requires sealed mode")
        engine = await self._engine(context)
        as_generate = worker_pb2.GenerateRequest(tenant=request.tenant, key_id=request.key_id, kind=request.kind,
                                                 messages_json=request.messages_json, prompt=request.prompt,
                                                 tools_json=request.tools_json)
        try:
            ids = prompt_ids(engine, self.state.guard, self.state.settings.model, as_generate,
                             add_generation_prompt=request.add_generation_prompt)
        except GuardRefusal as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        tok = engine.tokenizer
        strs = [tok.decode([i], skip_special_tokens=False) for i in ids] if request.return_token_strs else []
        return worker_pb2.TokenizeReply(tokens=ids, token_strs=strs, max_model_len=self.state.settings.max_model_len)

    async def Detokenize(self, request: worker_pb2.DetokenizeRequest, context: grpc.aio.ServicerContext
                         ) -> worker_pb2.DetokenizeReply:
        if sealed_only(self.state):  # its answer is text in clear
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this tenant requires sealed mode")
        tok = (await self._engine(context)).tokenizer
        try:
            text = tok.decode(tok.check_ids(request.tokens), skip_special_tokens=False)
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return worker_pb2.DetokenizeReply(prompt=text)

    async def SealState(self, request: worker_pb2.SealStateRequest, context: grpc.aio.ServicerContext
                        ) -> worker_pb2.SealStateReply:
        """A stored response's state, sealed under this model version's state key
        (enclave_worker/response_state.py); its content is in clear here, so as Generate's."""
        if sealed_only(self.state):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this tenant requires sealed mode")
        await self._engine(context)  # serving: the data key is live
        try:
            blob = seal_state(self.state, request.tenant, request.id, request.document_json)
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return worker_pb2.SealStateReply(blob=blob, version=self.state.settings.version)

    async def OpenState(self, request: worker_pb2.OpenStateRequest, context: grpc.aio.ServicerContext
                        ) -> worker_pb2.OpenStateReply:
        """A stored response's state in clear, for GET /v1/responses/{id} (plaintext mode only)."""
        if sealed_only(self.state):  # its answer is content in clear
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this tenant requires sealed mode")
        await self._engine(context)
        try:
            document = open_state(self.state, request.tenant, request.state.id, request.state.blob)
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return worker_pb2.OpenStateReply(document_json=json.dumps(document, ensure_ascii=False))

    async def Embed(self, request: worker_pb2.EmbedRequest, context: grpc.aio.ServicerContext
                    ) -> worker_pb2.EmbedReply:
        """/v1/embeddings on an encoder's worker (enclave_worker/embedding.py): unary, the signed usage
        in the reply; a chat model's worker refuses it (INVALID_ARGUMENT)."""
        if sealed_only(self.state):  # the inputs arrive in clear
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this tenant requires sealed mode")
        await self._engine(context)  # serving: the data key is live
        call = EmbedCall(self.state, request, [])
        signer, clock = self.state.signer, self.state.clock
        try:
            reply = await call.reply(embedding_engine(self.state))
        except InvalidRequestError as exc:  # NotAnEmbeddingModel too: the caller named a chat model
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except GuardRefusal as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc), trailing_metadata=decision_metadata(
                signer.decisions(request, call.notes, exc, clock.now())))
        if call.notes:  # redactions: signed, for the gateway's audit trail
            context.set_trailing_metadata(decision_metadata(signer.decisions(request, call.notes, None, clock.now())))
        return reply
