"""One `Worker.Embed` call (protocol/rpc/worker.proto): the inputs through the tenant's data controls
(the same input checks and admission limits a prompt gets), the encoder, and a signed usage record
of the tokens it read. The gRPC mapping of its errors is in servicer.py.

The vectors leave the worker only in the reply (float32 little-endian rows); nothing here logs an
input or a vector."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from enclave_worker.engine.embedding_engine import EmbeddingEngine
from enclave_worker.engine.errors import InvalidRequestError
from enclave_worker.guard import GuardNote, GuardRefusal
from enclave_worker.state import WorkerState
from protocol.openai.embeddings import EmbeddingsRequest, embeddings_body, rows
from protocol.openai.errors import OpenAIError
from protocol.rpc import worker_pb2


class NotAnEmbeddingModel(InvalidRequestError):
    """The worker serves a chat model: it has no encoder to embed with."""


@dataclass
class EmbedCall:
    """One request: its inputs checked, then embedded; `notes` and `decisions` for the audit trail."""

    state: WorkerState
    request: worker_pb2.EmbedRequest
    notes: list[GuardNote]

    def inputs(self) -> list[str | list[int]]:
        """Texts (through the data controls: a blocked input refuses the call, a redacted one is
        embedded as redacted) or token-id lists, in the order given."""
        state, request = self.state, self.request
        items: list[str | list[int]] = []
        for i, item in enumerate(request.inputs):
            if item.text and item.token_ids:
                raise InvalidRequestError(f"input[{i}] has both text and token ids")
            items.append(list(item.token_ids) if item.token_ids else item.text)
        texts = [(i, t) for i, t in enumerate(items) if isinstance(t, str)]
        if state.guard is not None and texts:
            checked = state.guard.check_input(request.key_id, state.settings.model, [t for _, t in texts], self.notes)
            for (i, _), text in zip(texts, checked, strict=True):
                items[i] = text
        return items

    async def reply(self, engine: EmbeddingEngine) -> worker_pb2.EmbedReply:
        state, request = self.state, self.request
        if request.tenant != state.settings.tenant:
            raise InvalidRequestError("this worker serves another tenant")
        items = self.inputs()
        ids = engine.check(items)
        if state.guard is not None:
            state.guard.check_admission(request.key_id, state.settings.model, sum(map(len, ids)), 0)
        started = time.monotonic()
        out = await engine.embed(ids)
        vectors = np.ascontiguousarray(out.vectors.numpy(), dtype="<f4")
        usage = state.signer.usage(request, out.prompt_tokens, 0, time.monotonic() - started, state.clock.now())
        return worker_pb2.EmbedReply(vectors=vectors.tobytes(), dimensions=int(vectors.shape[1]),
                                     prompt_tokens=out.prompt_tokens, usage=usage)


def embedding_engine(state: WorkerState) -> EmbeddingEngine:
    """The served encoder, or NotAnEmbeddingModel (a chat model's worker)."""
    engine = state.booted.engine if state.booted is not None else None
    if not isinstance(engine, EmbeddingEngine):
        raise NotAnEmbeddingModel(f"model {state.settings.model} is not an embedding model: "
                                  f"it serves chat and completions, not /v1/embeddings")
    return engine


async def embeddings_document(state: WorkerState, request: worker_pb2.SealedRequest, req: EmbeddingsRequest,
                              decisions: list[worker_pb2.UsageRecord]) -> tuple[dict[str, Any], int]:
    """A sealed /v1/embeddings request's answer, as the gateway gives it in plaintext mode, and the
    prompt tokens it read (for the receipt and the usage record). Refusals are OpenAIError. The data
    controls' signed decisions (a refusal, redactions) are added to `decisions`: the tenant's sealed
    decision record, as a sealed chat's are (the plaintext RPC sends them to the gateway instead)."""
    signer, clock = state.signer, state.clock
    call: EmbedCall | None = None
    try:
        engine = embedding_engine(state)
        if req.dimensions is not None and req.dimensions != engine.embedder.dim:
            raise OpenAIError(400, f"dimensions {req.dimensions} is not this model's ({engine.embedder.dim})",
                              code="invalid_value", param="dimensions")
        call = EmbedCall(state, worker_pb2.EmbedRequest(
            request_id=request.request_id, tenant=request.tenant, key_id=request.key_id, model=request.model,
            inputs=[worker_pb2.EmbedInput(text=i) if isinstance(i, str) else worker_pb2.EmbedInput(token_ids=i)
                    for i in req.inputs()]), [])
        reply = await call.reply(engine)
    except NotAnEmbeddingModel as exc:
        raise OpenAIError(400, str(exc), code="invalid_value", param="model") from exc
    except InvalidRequestError as exc:
        raise OpenAIError(400, str(exc), code="invalid_value", param="input") from exc
    except GuardRefusal as exc:
        if call is not None:
            decisions += signer.decisions(request, call.notes, exc, clock.now())
        raise OpenAIError(403, str(exc), type_="permission_error", code="content_policy_violation") from exc
    if call is not None and call.notes:  # redactions
        decisions += signer.decisions(request, call.notes, None, clock.now())
    document = embeddings_body(req.model, rows(reply.vectors, reply.dimensions), req.encoding_format,
                               reply.prompt_tokens)
    return document, reply.prompt_tokens
