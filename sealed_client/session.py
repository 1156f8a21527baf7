"""Sans-IO core of the client: pins and sealing; reading a sealed answer is sealed_client/answer.py.
Transports do the I/O."""

from __future__ import annotations

import collections
import datetime as dt
import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from attestation.errors import AttestationError
from attestation.token import TokenVerifier
from protocol.sealed import (
    ReattestRequired,
    Receipt,
    RequestContext,
    RequestRejected,
    RequestReplayed,
    SealedFormatError,
    api_key_id,
    seal_request,
)
from protocol.sealed.caller import CallerCredential
from protocol.sealed.http import (
    ENDPOINTS,
    HEADER_CONVERSATION,
    HEADER_KEY_ID,
    HEADER_MODEL,
    HEADER_PREVIOUS_RESPONSE,
    REATTEST_CODE,
    REQUEST_CONTENT_TYPE,
    RESPONSE_CONTENT_TYPE,
    sealed_path,
)
from protocol.sealed.padding import DEFAULT_PADDING, PaddingPolicy
from sealed_client.answer import AnswerReader, Exchange
from sealed_client.broker_pin import attested_broker_jwks
from sealed_client.conversation_state import ConversationMemory, named_conversation
from sealed_client.deployment import (
    PinnedKey,
    open_client_state,
    verify_published,
    verify_sealed_document,
)
from sealed_client.errors import PinConflict
from sealed_client.stored_state import previous_response_id
from sealed_client.tenant_pin import newest_revocations
from sealed_client.trust import ClientTrust

RECEIPT_HEADER = "Sealed-Receipt"
# How long the token keys of an attested broker are used before it is asked to attest again (a broker
# that rotates its token key is then followed within this long).
BROKER_TTL_S = 3600.0


class NoAttestedWorker(ReattestRequired):
    """No worker of the deployment serves this model (the SDK sees OpenAI's 404, as in plaintext)."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist or no attested worker serves it.")
        self.model = model

    def as_response_body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": "invalid_request_error", "param": "model",
                          "code": "model_not_found"}}


def endpoint_of(path: str) -> tuple[str, str] | None:
    """("/prefix", "/v1/chat/completions") for a path that ends in a sealable endpoint."""
    for endpoint in ENDPOINTS:
        if path.endswith(endpoint):
            return path[: -len(endpoint)], endpoint
    return None


class SealedSession:
    """Pins per model (verified on first use, again on every key change and when what it was verified
    with expires); seals; checks answers.

    A pin is for one (tenant, model, version, model digest), as the evidence binds them. The session
    remembers each (model, version) it verified with its digest: a later document that shows the same
    version with another digest is refused (`PinConflict`), and it remembers the newest reference-value
    statement it verified: an older one is refused (`StaleReferenceValues`), and the newest release and
    data policy versions it verified: an older one is refused (`PolicyDowngrade`); these persist in the
    client's state file when its policy names one (memory.py).

    ``clock`` returns now (tests inject one). ``receipts`` keeps the last verified receipts.
    ``padding``: the size buckets request bodies are padded to, so the gateway sees a size class.
    """

    def __init__(self, trust: ClientTrust, *, clock: Callable[[], dt.datetime] | None = None,
                 keep_receipts: int = 1000, padding: PaddingPolicy = DEFAULT_PADDING, oidc_token: str = "",
                 retrieval_model: str | None = None) -> None:
        self.trust = trust
        # The embedding model whose worker seals files and searches vector stores (sealed_client/retrieval.py).
        self.retrieval_model = retrieval_model
        self.padding = padding
        # The caller's ID token from the tenant's identity provider, for a caller policy that lists
        # principals (policy/callers.py): sent only inside the sealed envelope, never to the gateway.
        self.oidc_token = oidc_token
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._pins: dict[str, PinnedKey] = {}
        self._digests: dict[tuple[str, str], str] = {}  # (model, version) -> the model digest verified
        # What this client has seen (its state file, when the policy names one): nothing older is accepted.
        self.memory, self.revocations = open_client_state(trust)
        self._newest_refvals = self.memory.reference_values_serial  # the newest reference-value serial verified
        self._jwks: Mapping[str, Any] | None = trust.broker_jwks
        self._jwks_until = float("inf")  # an attested broker's keys are asked for again after BROKER_TTL_S
        self._lock = threading.Lock()
        self.receipts: collections.deque[Receipt] = collections.deque(maxlen=keep_receipts)
        self.conversations = ConversationMemory()  # the newest state seen of each sealed-mode conversation

    # -- verification
    def needs_jwks(self) -> bool:
        """The gateway's JWKS is wanted (unsafe_trust_gateway_jwks only: nothing else is pinned)."""
        return self._jwks is None and not self.trust.attests_broker

    def set_gateway_jwks(self, jwks: Mapping[str, Any]) -> None:
        if self.trust.broker_jwks is None and not self.trust.attests_broker and self._jwks is None:
            self._jwks = jwks  # trust on first use (unsafe_trust_gateway_jwks); kept from then on

    def broker_challenge(self) -> tuple[str, bytes] | None:
        """(URL, fresh nonce) to ask the pinned broker for its attestation, when its keys are wanted."""
        if not self.trust.attests_broker or self.trust.broker is None:
            return None
        with self._lock:
            if self._jwks is not None and self.clock().timestamp() < self._jwks_until:
                return None
        return self.trust.broker.attestation_url, secrets.token_bytes(32)

    def set_broker_attestation(self, answer: Mapping[str, Any], nonce: bytes) -> None:
        """Take the token keys from the broker's answer if its evidence verifies under the pin (raises
        an AttestationError otherwise: nothing is pinned and nothing is sent)."""
        assert self.trust.broker is not None
        now = self.clock()
        jwks = attested_broker_jwks(self.trust.broker, answer, nonce=nonce, issuer=self.trust.broker_issuer,
                                    trust=self.trust.evidence_trust, now=now)
        with self._lock:
            self._jwks, self._jwks_until = jwks, now.timestamp() + BROKER_TTL_S

    def wants_reference_values(self) -> bool:
        return self.trust.pins_publisher

    def pin_from(self, model: str, attestation_doc: Mapping[str, Any],
                 reference_values: Mapping[str, Any] | None = None) -> PinnedKey:
        """Verify every worker of the document serving `model`; pin the first that verifies.
        Raises the first worker's error when none does (nothing is sent then)."""
        if self._jwks is None:
            raise AttestationError("no key broker JWKS to verify tokens with")
        verifier = TokenVerifier(self._jwks, self.trust.broker_issuer)
        now = self.clock()
        with self._lock:
            newest = self._newest_refvals
        published = verify_published(self.trust, reference_values, now, newest)  # raises: nothing is sent
        if published is not None:
            with self._lock:
                self._newest_refvals = max(self._newest_refvals, published.serial)
            self.memory.record_reference_values(published.serial)
        first_error: Exception | None = None
        for doc in attestation_doc.get("workers", []):
            if doc.get("model") != model:
                continue
            try:
                pin = verify_sealed_document(doc, verifier, self.trust, now, published, model=model,
                                             memory=self.memory, revocations=self.revocations)
                self._check_same_digest(pin)
            except (AttestationError, KeyError, ValueError, TypeError) as exc:
                first_error = first_error or exc
                continue
            self.memory.record(pin.tenant, pin.model, pin.release.version if pin.release else None, pin.policy_version)
            with self._lock:
                self._digests.setdefault((pin.model, pin.version), pin.model_digest)
                self._pins[model] = pin
            return pin
        if first_error is not None:
            raise first_error
        raise NoAttestedWorker(model)

    def add_revocations(self, envelope: Mapping[str, Any]) -> None:
        """A tenant-signed revocation list fetched by the caller: kept if it verifies and is newer; every
        pin is dropped, so the next request verifies its worker again under the list (a revoked one is refused)."""
        revocations, _ = newest_revocations([envelope], self.trust.tenant_keys, self.trust.tenant)
        if revocations is not None and (self.revocations is None or revocations.serial > self.revocations.serial):
            self.memory.record_revocations(envelope)
            with self._lock:
                self.revocations = revocations
                self._pins.clear()

    def _check_same_digest(self, pin: PinnedKey) -> None:
        with self._lock:
            known = self._digests.get((pin.model, pin.version))
        if known is not None and known != pin.model_digest:
            raise PinConflict([f"{pin.model} version {pin.version} was verified with model digest {known}; the "
                               f"deployment now shows {pin.model_digest} under the same version (a pin is per "
                               "version and digest: a package swapped under a version name is refused)"])

    def pinned(self, model: str) -> PinnedKey | None:
        """The pin for `model`, while what it was verified with lasts (the token that corroborated its
        evidence, the reference values); after that a request verifies the deployment again (fresh
        evidence, the same checks)."""
        now = self.clock()
        with self._lock:
            pin = self._pins.get(model)
            if pin is not None and pin.expired(now):
                del self._pins[model]
                return None
            return pin

    def forget(self, model: str) -> None:
        with self._lock:
            self._pins.pop(model, None)

    # -- requests
    def seal(self, pin: PinnedKey, endpoint: str, body: bytes, api_key: str) -> Exchange:
        """Seal `body` to the pinned worker, binding (as associated data) the tenant, model, version and
        policy version its evidence binds, the endpoint, the worker key, and the id of `api_key` (the
        API key this request is sent with), so the gateway can relabel none of them."""
        ctx = RequestContext(tenant=pin.tenant, model=pin.model, endpoint=endpoint, key_id=pin.worker_key_id,
                             version=pin.version, api_key_id=api_key_id(api_key), policy_version=pin.policy_version)
        # The caller's credential goes inside the envelope (the worker checks it against the tenant's
        # signed caller policy): the API key this request is sent with, and the ID token if any.
        caller = CallerCredential(api_key=api_key, oidc_token=self.oidc_token).encode()
        return Exchange(pin, seal_request(pin.hpke_public_key, ctx, body, time.time(), padding=self.padding,
                                          caller=caller), ctx.api_key_id, previous_response_id(endpoint, body),
                        named_conversation(endpoint, body), endpoint)

    @staticmethod
    def sealed_headers(exchange: Exchange, original: Mapping[str, str]) -> dict[str, str]:
        headers = {k: v for k, v in original.items() if k.lower() in ("authorization", "user-agent", "accept")
                   or k.lower().startswith("x-stainless") or k.lower().startswith("openai-")}
        headers.update({"Content-Type": REQUEST_CONTENT_TYPE, HEADER_MODEL: exchange.pin.model,
                        HEADER_KEY_ID: exchange.pin.worker_key_id})
        if exchange.previous_response_id is not None:  # routing data: the gateway fetches the chain by it
            headers[HEADER_PREVIOUS_RESPONSE] = exchange.previous_response_id
        if exchange.conversation_id is not None:  # routing data: the gateway fetches the conversation by it
            headers[HEADER_CONVERSATION] = exchange.conversation_id
        return headers

    @staticmethod
    def sealed_url_path(prefix: str, endpoint: str) -> str:
        return prefix + sealed_path(endpoint)

    @staticmethod
    def plain_error(status: int, content_type: str, body: bytes) -> Exception | None:
        """A gateway answer that is not sealed: a typed error for sealed-mode refusals, None for ordinary
        OpenAI errors (passed through to the SDK), and a refusal of any plaintext success."""
        if 200 <= status < 300:
            return SealedFormatError("the gateway answered a sealed request in plaintext")
        code = ""
        if content_type.startswith("application/json"):
            try:
                code = str((json.loads(body).get("error") or {}).get("code") or "")
            except (ValueError, AttributeError):
                code = ""
        if code == REATTEST_CODE:
            return ReattestRequired("the pinned worker is gone")
        if code == "sealed_request_replayed":
            return RequestReplayed("the worker saw this request before")
        if code == "sealed_request_rejected":
            return RequestRejected("the worker could not open the request")
        return None

    @staticmethod
    def is_sealed(content_type: str) -> bool:
        return content_type.split(";")[0].strip() == RESPONSE_CONTENT_TYPE

    def reader(self, exchange: Exchange) -> AnswerReader:
        return AnswerReader(exchange, self.receipts, self.conversations)
