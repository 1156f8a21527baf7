"""Sealed mode in the worker: open the sealed request, answer it as the gateway would, seal the answer.

The OpenAI layer runs here instead of in the gateway (`local_openai.py`), over the same request
pipeline as plaintext requests (`answer.py`), so the gateway relays only ciphertext. Every answer
ends with a receipt signed by the worker's attested usage key. Errors before the request opens
are gRPC errors the gateway can map (the gateway learns nothing it did not already have); errors
after it are sealed inner responses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import grpc

from enclave_worker.errors import SealedRefusal
from enclave_worker.lifecycle import serving
from enclave_worker.local_openai import LocalRun, inner_answer, single
from enclave_worker.retrieval.service import RetrievalService
from enclave_worker.stage_times import StageTimes
from enclave_worker.state import WorkerState
from policy.callers import CallerRefused
from protocol.openai.errors import OpenAIError, error_body
from protocol.rpc import worker_pb2
from protocol.sealed import (
    OpenedRequest,
    Receipt,
    RequestContext,
    RequestReplayed,
    SealedError,
    WrongWorkerKey,
    open_request,
    sign_receipt,
)
from protocol.sealed.caller import read_caller
from protocol.sealed.http import ENDPOINTS, RETRIEVAL_ENDPOINTS, ResponseHead

__all__ = ["SealedAnswer", "SealedRefusal", "open_sealed_request"]
log = logging.getLogger(__name__)


def open_sealed_request(state: WorkerState, request: worker_pb2.SealedRequest) -> OpenedRequest:
    s = state.settings
    if not serving(state):
        raise SealedRefusal(grpc.StatusCode.UNAVAILABLE, "model unavailable")
    if request.endpoint not in ENDPOINTS and request.endpoint not in RETRIEVAL_ENDPOINTS:
        raise SealedRefusal(grpc.StatusCode.INVALID_ARGUMENT, "sealed request for an unknown endpoint")
    if (request.tenant, request.model) != (s.tenant, s.model):
        raise SealedRefusal(grpc.StatusCode.INVALID_ARGUMENT, "sealed request for another tenant or model")
    # The API key id the gateway names picks the policy's per-key rules: it is bound as associated
    # data with the version and policy version this worker serves, so a relabelled request does not open.
    ctx = RequestContext(tenant=request.tenant, model=request.model, endpoint=request.endpoint,
                         key_id=request.worker_key_id, version=s.version, api_key_id=request.key_id,
                         policy_version=policy_version(state))
    try:
        opened = open_request(state.serving_key, ctx, request.body, state.clock.now(), state.replay,
                              response_padding=s.response_padding)
        check_caller(state, request, opened)
        return opened
    except WrongWorkerKey as exc:
        # The client pinned a key this worker does not hold: it must verify the deployment again.
        raise SealedRefusal(grpc.StatusCode.FAILED_PRECONDITION, "sealed to another worker key; re-attest") from exc
    except RequestReplayed as exc:
        raise SealedRefusal(grpc.StatusCode.ALREADY_EXISTS, str(exc)) from exc
    except SealedError as exc:
        # Nothing of the request is known (it did not open): the reason's type only, never content.
        log.warning("sealed request %s refused: %s (does not open under its context: tampered, or its "
                    "tenant, model, version, endpoint, API key id or policy version relabelled)",
                    request.request_id[:64], type(exc).__name__)
        raise SealedRefusal(grpc.StatusCode.INVALID_ARGUMENT,
                            f"sealed request rejected ({type(exc).__name__})") from exc


def check_caller(state: WorkerState, request: worker_pb2.SealedRequest, opened: OpenedRequest) -> None:
    """The tenant's signed caller policy (policy/callers.py), against the credential the client sealed
    inside the envelope: the gateway cannot name a caller the tenant did not list (a key the operator
    made, another tenant's key). No `callers` section: no caller list, every key the gateway accepted."""
    guard = state.guard
    callers = guard.policy_set.callers if guard and guard.policy_set else None
    if callers is None:
        return
    caller = read_caller(opened.caller)  # SealedFormatError: refused like any malformed request
    try:
        callers.check_sealed(caller.api_key, caller.oidc_token, request.key_id)
    except CallerRefused as exc:
        log.warning("sealed request %s refused by the tenant's caller policy", request.request_id[:64])
        raise SealedRefusal(grpc.StatusCode.PERMISSION_DENIED,
                            f"caller refused by the tenant's signed caller policy (callers, policy version "
                            f"{policy_version(state)}): {exc}") from exc


def policy_version(state: WorkerState) -> int:
    """The version of the tenant's signed policy set this worker enforces (0: none), as its evidence binds."""
    guard = state.guard
    return guard.policy_set.version if guard and guard.policy_set else 0


class SealedAnswer:
    """One opened sealed request's answer. Iterate `chunks()` (ciphertext, the last one with the
    sealed receipt and the signed usage record); `decisions_so_far()` is what the pipeline signed
    for its choices (for the tenant's sealed record, never the gateway). `retrieval`: an encoder's
    worker's files and vector stores, for a sealed upload or search (sealed_retrieval.py)."""

    def __init__(self, state: WorkerState, request: worker_pb2.SealedRequest, opened: OpenedRequest,
                 retrieval: RetrievalService | None = None) -> None:
        self.state, self.request, self.opened = state, request, opened
        self._run = LocalRun(state, timed=state.tracing.enabled, retrieval=retrieval)
        self._started = state.clock.monotonic()
        self.final_usage: worker_pb2.UsageRecord | None = None  # set with the final chunk

    def decisions_so_far(self) -> tuple[worker_pb2.UsageRecord, ...]:
        return self._run.decisions_so_far()

    def timings(self) -> list[StageTimes]:
        """Each choice's stage stamps (tracing on only; sealed: recorded without attributes)."""
        return self._run.timings()

    def usage_so_far(self) -> worker_pb2.UsageRecord:
        """The final chunk's usage record, or, for an answer cut short, one for the tokens run so far."""
        if self.final_usage is not None:
            return self.final_usage
        clock = self.state.clock
        return self.state.signer.usage(self.request, *self._run.progress(), clock.monotonic() - self._started,
                                       clock.now())

    async def chunks(self) -> AsyncIterator[worker_pb2.SealedChunk]:
        sealer, started = self.opened.sealer, self._started
        try:
            try:
                head, parts = await inner_answer(self.state, self.request, self.opened.body, self._run)
            except OpenAIError as exc:  # a refusal included: its decisions are in `decisions`
                head, parts = ResponseHead(exc.status, "application/json"), single(
                    json.dumps(error_body(exc.message, exc.type, exc.code, exc.param)).encode())
            # The head travels with the first body part (the first token's event, or the whole answer): one
            # gRPC message and one HTTP write fewer before the client sees its first token.
            rest = aiter(parts)
            first = await anext(rest, None)
            opening = sealer.header() + sealer.seal(head.encode())
            yield worker_pb2.SealedChunk(data=opening if first is None else opening + sealer.seal(first))
            async for part in rest:
                yield worker_pb2.SealedChunk(data=sealer.seal(part))
        finally:
            await self._run.close()
        yield self._final(started)

    def _final(self, started: float) -> worker_pb2.SealedChunk:
        """The sealed receipt (for the client) and the signed usage record (for the gateway)."""
        state, s, clock = self.state, self.state.settings, self.state.clock
        prompt = sum(p for p, _ in self._run.tokens.values())
        completion = sum(c for _, c in self._run.tokens.values())
        booted = state.booted
        retrieved = self._run.retrieved
        receipt = Receipt(
            request_sha256=self.opened.request_sha256, response_sha256=self.opened.sealer.hash.hexdigest(),
            worker_key_id=state.serving_key.key_id, tenant=s.tenant, model=s.model, model_version=s.version,
            model_digest=booted.model_digest if booted else "", policy_version=policy_version(state),
            prompt_tokens=prompt, completion_tokens=completion, tee=s.tee, insecure=s.insecure,
            issued_at=clock.now(), api_key_id=self.request.key_id, signing_key=state.usage_public_hex,
            channel_spki=state.tls_spki.hex(),
            evidence_sha256=state.evidence_sha256(), file_ids=retrieved.file_ids if retrieved else ())
        final = worker_pb2.SealedChunk(data=self.opened.sealer.seal(sign_receipt(receipt, state.usage_key),
                                                                    final=True))
        self.final_usage = state.signer.usage(self.request, prompt, completion, clock.monotonic() - started,
                                              clock.now())
        final.usage.CopyFrom(self.final_usage)
        if retrieved is not None and retrieved.sealed_file is not None:  # ciphertext and metadata: the gateway keeps it
            final.sealed_file.CopyFrom(retrieved.sealed_file)
        turn = self._run.turn
        if turn is not None and turn.stored is not None:  # ciphertext only: the gateway keeps it by id
            final.stored_state.CopyFrom(turn.stored)
            final.state_version = s.version
        conversation = self._run.conversation_call or (turn.conversation_stored if turn is not None else None)
        if conversation is not None:  # the whole conversation, sealed: kept in place of the one it opened
            final.conversation_state.CopyFrom(conversation)
            final.state_version = s.version
        return final
