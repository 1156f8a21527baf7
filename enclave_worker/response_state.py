"""Stored Responses state (`store`, `previous_response_id`), sealed and opened only in the worker.

A stored response is tenant data. Its state (the response object, its input items and the turn as
chat messages) is AES-256-GCM under a key derived with HKDF-SHA256 from the model version's data
key, the key the broker releases only to an attested worker under the tenant's release policy. The
gateway stores the ciphertext and passes it back; it never holds the key. So:
- a revoked data key (the broker stops releasing it, running workers wipe it) makes every stored
  state of that model version unreadable;
- the associated data binds tenant, model, version and response id: a blob moved to another id,
  tenant or model, or changed in one bit, does not open;
- a state is opened by a worker of the version that sealed it (another version's key differs);
- the worker stamps the expiry its tenant's signed policy sets (`response_retention_days`) inside
  the sealed state, and refuses to open it after, whatever the gateway's rows say.

Continuing (`previous_response_id`): the gateway sends the chain of blobs with the request; the
worker opens them and puts their turns after the request's own leading system message (the new
`instructions`: OpenAI does not carry instructions over) and before its new input, so the history
passes the tenant's data controls with the rest of the prompt and never leaves the worker in clear.

Sealed mode (sealed_state.py) seals its answers' state here too, marked `sealed_mode`: such a state
is never opened for a plaintext answer, and a document the gateway asks to seal may not carry the mark.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from enclave_worker.engine import InvalidRequestError
from policy.policyset import DEFAULT_RESPONSE_RETENTION_DAYS
from protocol.openai.stored_state import SEALED_ONLY
from protocol.rpc import worker_pb2

if TYPE_CHECKING:
    from enclave_worker.state import WorkerState

FORMAT = b"\x01"  # blob = FORMAT || nonce (12) || AES-GCM ciphertext and tag
MAX_HISTORY = 256  # blobs one request may continue from (a chain of responses, a conversation's items)
MAX_DOCUMENT = 4 * 1024 * 1024  # bytes of one state document


class StateUnreadable(InvalidRequestError):
    """A state blob this worker cannot open: tampered, another tenant's, id or model, another
    version's key, or a key since revoked. One message for all: the reason is not the caller's."""

    def __init__(self, state_id: str) -> None:
        super().__init__(f"stored state {state_id[:64]!r} cannot be opened by this model version")


@dataclass(frozen=True)
class StateCipher:
    """The state key of one (tenant, model, version), derived from its data key."""

    key: bytes
    tenant: str
    model: str
    version: str

    @classmethod
    def derive(cls, data_key: bytes, tenant: str, model: str, version: str) -> StateCipher:
        if not data_key:
            raise StateUnreadable("-")  # the key was wiped (revoked): nothing can be opened or sealed
        info = b"sealed/response-state/v1\0" + b"\0".join(s.encode() for s in (tenant, model, version))
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(data_key)
        return cls(key, tenant, model, version)

    def _aad(self, state_id: str) -> bytes:
        return b"\0".join(s.encode() for s in ("response-state", self.tenant, self.model, self.version, state_id))

    def seal(self, state_id: str, document: dict[str, Any], expires_at: float) -> bytes:
        document = {**document, "expires_at": expires_at}
        nonce = secrets.token_bytes(12)
        plain = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
        return FORMAT + nonce + AESGCM(self.key).encrypt(nonce, plain, self._aad(state_id))

    def open(self, state_id: str, blob: bytes, now: float) -> dict[str, Any]:
        if len(blob) < 1 + 12 + 16 or blob[:1] != FORMAT:
            raise StateUnreadable(state_id)
        try:
            plain = AESGCM(self.key).decrypt(blob[1:13], blob[13:], self._aad(state_id))
        except InvalidTag:
            raise StateUnreadable(state_id) from None
        document = json.loads(plain)
        if not isinstance(document, dict) or not isinstance(document.get("expires_at"), (int, float)) \
                or now >= document["expires_at"]:
            raise StateUnreadable(state_id)
        return document


def retention_s(state: WorkerState) -> float:
    """How long a state sealed now may be opened, by the tenant's signed policy (0: never stored)."""
    policy_set = state.guard.policy_set if state.guard is not None else None
    days = policy_set.response_retention_days if policy_set is not None else DEFAULT_RESPONSE_RETENTION_DAYS
    return days * 86400.0


def seal_state(state: WorkerState, tenant: str, state_id: str, document_json: str, sealed_mode: bool = False) -> bytes:
    retention = retention_s(state)
    if retention <= 0:
        raise InvalidRequestError("the tenant's policy keeps no responses (response_retention_days is 0): "
                                  "store must be false")
    document = check_document(document_json)
    if SEALED_MARK in document and not sealed_mode:
        # Only a sealed-mode answer marks its own state: a document the gateway sent (SealState) that
        # claims the mark could otherwise be slipped into a sealed continuation as history.
        raise InvalidRequestError(f"a state document to seal may not carry {SEALED_MARK!r}")
    return state_cipher(state, tenant).seal(state_id, document, state.clock.now() + retention)


def open_state(state: WorkerState, tenant: str, state_id: str, blob: bytes) -> dict[str, Any]:
    """A state in clear, for a plaintext answer: one stored in sealed mode is refused (SealedOnlyState)."""
    return _plaintext_only(state_id, state_cipher(state, tenant).open(state_id, blob, state.clock.now()))


class SealedOnlyState(InvalidRequestError):
    """A state stored in sealed mode, asked for in a plaintext answer (GET, or a plaintext continuation):
    its content was never the gateway's, and is given only sealed to the client."""

    def __init__(self, state_id: str) -> None:
        super().__init__(f"stored response {state_id[:64]!r} {SEALED_ONLY}: it is served only sealed "
                         "(continue it through /v1/sealed/responses)")


SEALED_MARK = "sealed_mode"  # in a state document sealed by a sealed-mode answer (authenticated with it)


def _plaintext_only(state_id: str, document: dict[str, Any]) -> dict[str, Any]:
    if SEALED_MARK in document:
        raise SealedOnlyState(state_id)
    return document


def state_cipher(state: WorkerState, tenant: str) -> StateCipher:
    """This worker's state key, for its own tenant only; StateUnreadable once the key is wiped."""
    settings = state.settings
    if tenant != settings.tenant:
        raise InvalidRequestError("this worker serves another tenant")
    booted = state.booted
    return StateCipher.derive(booted.released.data_key if booted is not None else b"", settings.tenant,
                              settings.model, settings.version)


def check_document(document_json: str) -> dict[str, Any]:
    """A state document to seal: bounded, an object with the parts a continuation reads."""
    if len(document_json.encode()) > MAX_DOCUMENT:
        raise InvalidRequestError("the state document is too large")
    try:
        document = json.loads(document_json)
    except ValueError:
        raise InvalidRequestError("the state document is not JSON") from None
    if not isinstance(document, dict) or not isinstance(document.get("messages"), list) \
            or not all(isinstance(m, dict) for m in document["messages"]):
        raise InvalidRequestError("the state document needs a list of messages")
    return document


def with_history(state: WorkerState, request: worker_pb2.GenerateRequest) -> worker_pb2.GenerateRequest:
    """The request with the turns of its stored history put before its new input."""
    if not request.history:
        return request
    if request.kind != "chat" or len(request.history) > MAX_HISTORY:
        raise InvalidRequestError(f"history is for chat requests, at most {MAX_HISTORY} stored responses")
    past = [m for stored, document in zip(request.history, open_history(state, request.tenant, request.history),
                                          strict=True)
            for m in _plaintext_only(stored.id, document)["messages"]]
    return prepend_history(request, past)


def open_history(state: WorkerState, tenant: str, history: Sequence[worker_pb2.StateBlob]) -> list[dict[str, Any]]:
    """Each stored state of a history, opened and checked (StateUnreadable for one that does not open)."""
    if len(history) > MAX_HISTORY:
        raise InvalidRequestError(f"history is at most {MAX_HISTORY} stored responses")
    cipher, now = state_cipher(state, tenant), state.clock.now()
    return [check_document(json.dumps(cipher.open(stored.id, stored.blob, now))) for stored in history]


def prepend_history(request: worker_pb2.GenerateRequest, past: list[dict[str, Any]]) -> worker_pb2.GenerateRequest:
    """The request with `past` messages after its leading system message and before its new input."""
    try:
        messages = json.loads(request.messages_json)
    except ValueError:
        raise InvalidRequestError("messages must be JSON") from None
    if not isinstance(messages, list):
        raise InvalidRequestError("messages must be a list of objects")
    head = 1 if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system" else 0
    continued = worker_pb2.GenerateRequest()
    continued.CopyFrom(request)
    del continued.history[:]
    continued.messages_json = json.dumps(messages[:head] + past + messages[head:], ensure_ascii=False)
    return continued
