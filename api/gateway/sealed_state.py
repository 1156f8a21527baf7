"""Stored responses in sealed mode: what the gateway does is fetch and keep ciphertext by id.

A sealed /v1/responses request that continues a stored response names the id in clear
(`Sealed-Previous-Response-Id`, routing data): the gateway sends the chain of blobs it keeps under it
with the sealed request, and the worker checks the chain against the id sealed inside
(enclave_worker/sealed_state.py). A stored answer's state comes back sealed by the worker on the
final chunk; the gateway keeps it with routing fields only (tenant, model, version, previous id).

Reading one back (`GET /v1/responses/{id}` through SealedOpenAI, sealed to STORED_READ): the gateway
sends the one blob it keeps under the id named in clear, and the worker answers with it sealed. The
model to pin is routing data (`stored_route`): the gateway names the model it keeps the blob under.
"""

from __future__ import annotations

from starlette.datastructures import Headers

from api.gateway.errors import GatewayError
from api.gateway.responses_routes import retention_for
from api.gateway.responses_store import MAX_CHAIN, response_not_found
from api.gateway.service import GatewayService
from api.store.repo import KeyRecord
from protocol.rpc import worker_pb2
from protocol.sealed.http import HEADER_PREVIOUS_RESPONSE, MAX_STATE_ID, STORED_READ

RESPONSES = "/v1/responses"


def previous_response(endpoint: str, headers: Headers) -> str | None:
    """The stored response a sealed request continues, as its client named it in clear."""
    previous = headers.get(HEADER_PREVIOUS_RESPONSE)
    if previous is None:
        if endpoint == STORED_READ:
            raise GatewayError(400, f"a sealed read names the stored response ({HEADER_PREVIOUS_RESPONSE})",
                               param="response_id", code="invalid_value")
        return None
    if endpoint not in (RESPONSES, STORED_READ):
        raise GatewayError(400, f"{HEADER_PREVIOUS_RESPONSE} is for /v1/sealed/responses only",
                           param="previous_response_id", code="invalid_value")
    if not 0 < len(previous) <= MAX_STATE_ID or not previous.isascii() or not previous.isprintable():
        raise GatewayError(400, f"{HEADER_PREVIOUS_RESPONSE} is not a response id", param="previous_response_id",
                           code="invalid_value")
    return previous


def sealed_history(service: GatewayService, key: KeyRecord, model: str, previous: str | None,
                   endpoint: str = RESPONSES) -> list[worker_pb2.StateBlob]:
    """The chain of ciphertext under `previous`, oldest first (404 as for plaintext continuations); for
    a sealed read, the one blob under it."""
    if previous is None:
        return []
    service.responses.purge_expired()
    if endpoint == STORED_READ:
        one = service.responses.states.get(key.tenant, previous)
        if one is None or (key.models and one.model not in key.models):
            raise response_not_found(previous)
        if one.model != model:
            raise GatewayError(400, f"response {previous[:64]!r} was made with another model", param="model",
                               code="invalid_value")
        return [worker_pb2.StateBlob(id=one.id, blob=one.blob)]
    found = service.responses.states.chain(key.tenant, previous, MAX_CHAIN - 1)
    if found is None or (key.models and found[-1].model not in key.models):
        raise response_not_found(previous, param="previous_response_id")
    if found[-1].model != model or len({s.version for s in found}) != 1:
        raise GatewayError(400, "the previous response was made with another model or model version",
                           param="previous_response_id", code="invalid_value")
    return [worker_pb2.StateBlob(id=s.id, blob=s.blob) for s in found]


def keep_sealed_state(service: GatewayService, key: KeyRecord, model: str, previous: str | None,
                      chunk: worker_pb2.SealedChunk) -> None:
    """Keep the state the worker sealed on its final chunk (nothing when the answer is not stored)."""
    if not chunk.HasField("stored_state"):
        return
    stored = chunk.stored_state
    if not 0 < len(stored.id) <= MAX_STATE_ID or not stored.blob or not chunk.state_version:
        raise GatewayError(502, "the worker returned a malformed stored state", type_="server_error")
    service.responses.states.put(state_id=stored.id, tenant=key.tenant, model=model, version=chunk.state_version,
                                 previous_id=previous, blob=stored.blob, retention=retention_for(service, key))


def stored_route(service: GatewayService, key: KeyRecord, response_id: str) -> dict[str, str]:
    """The model a stored response is kept under (routing data, as the client sees in its own answers),
    for a client to pin a worker of before it seals a read of it; 404 as for any unknown id."""
    service.responses.purge_expired()
    found = service.responses.states.get(key.tenant, response_id)
    if found is None or (key.models and found.model not in key.models):
        raise response_not_found(response_id)
    return {"id": found.id, "object": "sealed.route", "model": found.model}
