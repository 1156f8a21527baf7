"""`POST /v1/embeddings` (OpenAI's Embeddings API; docs/gateway.md, docs/retrieval.md), served by a
worker whose package is a sentence encoder (kind "embedding").

The request's lifecycle is the one every surface has (lifecycle.py): the ticket charged with a
worst-case token estimate, a dispatch slot, the route to a ready worker of the model (another one
if it cannot take the call), the signed usage metered and settled against the reserve, the span.
What is checked here, before anything is charged: the caller may send plaintext, the model is an
embedding model (a chat model named here, or an embedding model named for chat, is a 400 that says
so), and `dimensions`, which this service does not reduce, equals the model's."""

from __future__ import annotations

import json

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from api.gateway.dependencies import current_key, get_service
from api.gateway.errors import GatewayError
from api.gateway.generation import request_id, unless_disconnected
from api.gateway.grpc_client import WorkerRefusal
from api.gateway.lifecycle import RequestLifecycle
from api.gateway.registry import WorkerInfo
from api.gateway.service import GatewayService
from api.gateway.spans import worker_call_span
from api.store.repo import KeyRecord
from protocol.openai.embeddings import EmbeddingsRequest, embeddings_body, rows
from protocol.rpc import worker_pb2

router = APIRouter()


def model_kind(service: GatewayService, tenant: str, model: str) -> tuple[str, int | None]:
    """The kind ("chat" | "embedding") the model's ready workers report, and an encoder's dimensions;
    ("", None) while none is ready (routing then answers 503)."""
    workers = service.registry.ready(tenant, model)
    if not workers:
        return "", None
    dim = workers[0].stats.get("embedding_dim")  # an encoder's worker reports it (EmbeddingEngine.stats)
    return ("embedding", int(dim)) if isinstance(dim, int | float) and dim > 0 else ("chat", None)


def signed_prompt_tokens(usage: worker_pb2.UsageRecord) -> int:
    try:
        return int(json.loads(usage.payload)["prompt_tokens"])
    except (ValueError, KeyError, TypeError):
        return 0


def _check_dimensions(asked: int | None, served: int | None) -> None:
    if asked is not None and served is not None and asked != served:
        raise GatewayError(400, f"dimensions {asked} is not this model's ({served}); this service does not "
                           f"shorten embeddings: leave dimensions out or give {served}",
                           param="dimensions", code="invalid_value")


@router.post("/v1/embeddings")
async def embeddings(req: EmbeddingsRequest, request: Request, key: KeyRecord = Depends(current_key),
                     service: GatewayService = Depends(get_service)) -> JSONResponse:
    split = service.catalog.resolve(key, req.model)
    service.check_plaintext_allowed(key)
    kind, dim = model_kind(service, key.tenant, req.model)
    if kind == "chat":
        raise GatewayError(400, f"model {req.model} is a chat model; /v1/embeddings needs an embedding model",
                           param="model", code="invalid_value")
    _check_dimensions(req.dimensions, dim)
    rid = request_id()
    call = worker_pb2.EmbedRequest(request_id=rid, tenant=key.tenant, key_id=key.key_id, model=req.model, inputs=[
        worker_pb2.EmbedInput(text=i) if isinstance(i, str) else worker_pb2.EmbedInput(token_ids=i)
        for i in req.inputs()])
    life = RequestLifecycle.begin(service, request.headers, key, req.model, request_id=rid, stream=False,
                                  reserved_tokens=req.reserve_tokens())
    error = "failed"
    try:
        await unless_disconnected(request.receive, life.admit())
        reply = await unless_disconnected(request.receive, embed(service, life, split, call))
        try:
            row_bytes = rows(reply.vectors, reply.dimensions)
        except ValueError as exc:
            raise GatewayError(502, "the worker's answer is malformed", type_="server_error") from exc
        if len(row_bytes) != len(call.inputs):
            raise GatewayError(502, "the worker's answer is malformed", type_="server_error")
        _check_dimensions(req.dimensions, reply.dimensions)
        error = ""
    except GatewayError as exc:
        error = exc.code or "refused"
        raise
    finally:
        await life.settle(error=error)
    return JSONResponse(embeddings_body(req.model, row_bytes, req.encoding_format, reply.prompt_tokens))


async def embed(service: GatewayService, life: RequestLifecycle, split: dict[str, float],
                call: worker_pb2.EmbedRequest) -> worker_pb2.EmbedReply:
    """Route and call: a worker that cannot take the call is skipped (and probed); the signed usage is
    metered, and counted against the request's reserve, before the answer is returned."""

    async def attempt(worker: WorkerInfo) -> worker_pb2.EmbedReply:
        worker.inflight += 1
        span, metadata = worker_call_span(service.tracing, life.span, "Embed", worker.worker_id)
        try:
            reply, decisions = await service.clients.embed(worker.grpc_address, worker.tls_cert, call,
                                                           service.settings.request_timeout_s, metadata)
        except BaseException as exc:
            span.end(error=exc.code or "worker_error" if isinstance(exc, GatewayError) else "cancelled")
            if isinstance(exc, WorkerRefusal):  # its signed decision: verified, then audited
                service.audit_decisions(worker, exc.worker_decisions, call)
            raise
        finally:
            worker.inflight -= 1
        span.end()
        service.audit_decisions(worker, decisions, call)  # redactions the worker's data controls made
        await service.metering.record(reply.usage, worker, call)
        life.count(signed_prompt_tokens(reply.usage), 0)  # what the worker signed, not the reply's own count
        return reply

    _, reply = await service.reachable(lambda tried: service._route(life.span, lambda: service.registry.pick(
        life.key.tenant, life.model, split, "", tried), attempts=len(tried) + 1), attempt)
    return reply
